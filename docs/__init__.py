"""The documentation site: hand-written pages in ``pages/``, reference and study pages generated from the code."""
