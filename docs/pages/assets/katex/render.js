// Render the pages' math ($...$ and $$...$$, wrapped by pymdownx.arithmatex) with the KaTeX copy shipped beside this
// file, so that formulas show offline; re-run on every page mkdocs-material loads without a full reload.
document$.subscribe(({ body }) => {
  renderMathInElement(body, {
    delimiters: [
      { left: "$$", right: "$$", display: true },
      { left: "$", right: "$", display: false },
      { left: "\\(", right: "\\)", display: false },
      { left: "\\[", right: "\\]", display: true },
    ],
  });
});
