"""visualize.py and utils/figures/maps.py: attention maps and positional-encoding figures for every encoding."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_tiny_config, once, run_script
from matplotlib.image import imread

from models.config import StackPE
from models.positional import REGISTRY, names
from models.transformer import Seq2SeqTransformer
from utils.config import from_dict
from utils.figures import plots
from utils.figures.maps import attention_maps, position_figures, tag_filename, write_figures
from utils.run.load import load_run
from utils.run.store import create_run_dir
from utils.training.loop import train

SRC = "Le chat dort sur le canapé."
ATTENTION_TAGS = {"attention/encoder/layer_0", "attention/decoder/layer_0", "attention/cross/layer_0"}
#: One tiny model per family of encodings (``--set`` overrides) and the position figures it must produce.
FAMILIES: dict[str, tuple[list[str], set[str]]] = {
    "sinusoidal": (["model.input_pe=sinusoidal", "model.attention_pe=none"],
                   {"position/input/heatmap", "position/input/cosine", "position/decay"}),
    "learnable": (["model.input_pe=learnable", "model.attention_pe=none", "model.max_positions=128"],
                  {f"position/input/{side}/{kind}" for side in ("encoder", "decoder")
                   for kind in ("heatmap", "cosine", "mds")}),
    "rope": (["model.input_pe=none", "model.attention_pe=rope"], {"position/decay", "position/rope_scaling"}),
    "alibi": (["model.input_pe=none", "model.attention_pe=alibi"], {"position/bias/encoder", "position/bias/decoder"}),
    "t5": (["model.input_pe=none", "model.attention_pe=t5"], {"position/bias/encoder", "position/bias/decoder"}),
    "shaw": (["model.input_pe=none", "model.attention_pe=shaw", "model.shaw.values=true"],
             {"position/shaw/encoder", "position/shaw/decoder"}),
    "fire": (["model.input_pe=none", "model.attention_pe=fire"], {"position/bias/encoder", "position/bias/decoder"}),
    "dpb": (["model.input_pe=none", "model.attention_pe=dpb"], {"position/bias/encoder", "position/bias/decoder"}),
    "cope": (["model.input_pe=none", "model.attention_pe=rope", "model.decoder_pe.attention=cope"],
             {"position/decay", "position/rope_scaling", "position/cope/table/decoder",
              "position/cope/positions/decoder", "position/cope/bias/decoder"}),
    # causal-only: in the decoder, RoPE in the encoder; position/decay draws both scores and xPos's zeta^(k/B)
    "xpos": (["model.input_pe=none", "model.encoder_pe.attention=rope", "model.decoder_pe.attention=xpos"],
             {"position/decay", "position/rope_scaling"}),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Train each family for 4 steps (1+1 layers, d 32): enough for real checkpoints and run directories."""
    def build() -> dict[str, Path]:
        tmp = tmp_path_factory.mktemp("visualize")
        out = {}
        for family, (overrides, _) in FAMILIES.items():
            base = make_tiny_config(tmp, max_steps=4, eval_every=4, valid_bleu_sentences=2)
            short = ["decode.max_len_a=0", "decode.max_len_b=12"]  # untrained models decode to the length cap
            cfg = from_dict(base.to_dict(), [f"name={family}", *short, *overrides])
            out[family] = create_run_dir(cfg, tmp / "runs")
            train(cfg, out[family])
        return out

    return once("test_visualize.runs", build)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_script("visualize.py", *args)


def image_tags(tb_dir: Path) -> dict[str, list[int]]:
    """TensorBoard image tags in ``tb_dir`` -> the steps they were written at."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"images": 0})
    acc.Reload()
    return {tag: [event.step for event in acc.Images(tag)] for tag in acc.Tags()["images"]}


def assert_not_blank(path: Path) -> None:
    pixels = imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100, path
    assert float(pixels[..., :3].var()) > 1e-3, f"{path} looks blank"


def in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
               *args: str) -> subprocess.CompletedProcess[str]:
    """visualize.py's ``main`` in this process (the command line itself is run for two families: no interpreter
    start-up and imports for each of the others)."""
    import visualize

    monkeypatch.setattr(sys, "argv", ["visualize.py", *args])
    code = visualize.main()
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, captured.out, captured.err)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_visualize_writes_pngs_and_tensorboard_images(runs: dict[str, Path], family: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    run = runs[family]
    expected = ATTENTION_TAGS | FAMILIES[family][1]
    if family == "rope":  # a checkpoint file, the kebab-case spellings, teacher forcing
        out = tmp_path / "figs"
        res = cli("--model-path", str(run / "checkpoints" / "last.pt"), "--src-text", SRC,
                  "--tgt-text", "The cat sleeps.", "--out", str(out), "--set", "model.rope.scaling=yarn")
        step = 4
    else:
        out = run / "visualize"
        args = ("--model_path", str(run), "--src_text", SRC)
        res = cli(*args) if family == "sinusoidal" else in_process(monkeypatch, capsys, *args)
        step = 4  # best.pt records the training step of the evaluation that made it best
    assert res.returncode == 0, res.stderr
    assert f"source: {SRC}" in res.stdout
    assert ("target (teacher-forced): The cat sleeps." if family == "rope" else "greedy: ") in res.stdout
    assert "source tokens: " in res.stdout and "target tokens: <s>" in res.stdout
    assert f"wrote {len(expected)} PNG files to {out}" in res.stdout
    if family in ("rope", "alibi", "t5", "shaw", "fire", "dpb", "cope", "xpos"):
        assert "note: input_pe=none: no input positional encoding to plot" in res.stdout
    pngs = {p.name for p in out.glob("*.png")}
    assert pngs == {tag_filename(tag) for tag in expected}
    for name in pngs:
        assert_not_blank(out / name)
    tags = image_tags(run / "tb" / "visualize")
    assert set(tags) == expected
    assert all(steps == [step] for steps in tags.values()), tags


def test_each_figure_is_drawn_once_and_its_png_is_its_tensorboard_image(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A figure's layout is most of its cost: written both as a PNG and to TensorBoard, it is drawn once, and the
    two are the same bitmap."""
    from matplotlib.figure import Figure
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    model_cfg = make_tiny_config(tmp_path).model.model_copy(update=dict(input_pe="none", attention_pe="alibi",
                                                                          cross_attention_pe="alibi"))
    figs, _ = position_figures(Seq2SeqTransformer(model_cfg, 100, 0), model_cfg, length=24, bias_length=12)
    drawn: list[int] = []
    draw = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda self, renderer: (drawn.append(id(self)), draw(self, renderer))[1])
    writer = SummaryWriter(log_dir=str(tmp_path / "tb"))
    try:
        paths = write_figures(dict(figs), tmp_path / "png", writer, step=3, dpi=50)
    finally:
        writer.close()
    assert len(figs) == 3 and sorted(drawn) == sorted(id(f) for f in figs.values())  # once each
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    acc.Reload()
    assert set(acc.Tags()["images"]) == set(figs)
    for tag, path in zip(figs, paths, strict=True):
        (event,) = acc.Images(tag)
        png = imread(path)  # float RGBA in [0, 1]
        from io import BytesIO

        logged = imread(BytesIO(event.encoded_image_string))
        assert event.step == 3 and png.shape[:2] == logged.shape[:2] == (event.height, event.width)
        assert png.shape[1] == round(figs[tag].get_figwidth() * 50)  # at the dpi asked
        np.testing.assert_array_equal(png[..., :3], logged[..., :3])
    assert not list((tmp_path / "png").glob(".*"))  # no temporary file left


@pytest.mark.parametrize("tgt_text", [None, "The cat sleeps on the sofa."])
def test_attention_rows_sum_to_one_and_decoder_is_causal(runs: dict[str, Path], tgt_text: str | None) -> None:
    loaded = load_run(runs["alibi"], device="cpu")
    maps = attention_maps(loaded.model, loaded.tokenizer, SRC, tgt_text, decode=loaded.cfg.decode)
    src_tokens, tgt_tokens, att = maps
    assert src_tokens[-1] == "</s>" and tgt_tokens[0] == "<s>"
    s, t = len(src_tokens), len(tgt_tokens)
    heads = loaded.cfg.model.n_heads
    for kind, shape in (("encoder", (1, heads, s, s)), ("decoder", (1, heads, t, t)), ("cross", (1, heads, t, s))):
        assert len(getattr(att, kind)) == 1, kind
        for w in getattr(att, kind):
            assert w.shape == shape, kind
            torch.testing.assert_close(w.sum(-1), torch.ones(shape[:-1]))
    for w in att.decoder:
        assert float(w[0].triu(diagonal=1).abs().max()) == 0.0
        assert float(w[0].diagonal(dim1=-2, dim2=-1).min()) > 0.0
    if tgt_text is not None:
        assert t > 5


def test_teacher_forced_target_gives_its_tokens(runs: dict[str, Path]) -> None:
    loaded = load_run(runs["sinusoidal"], device="cpu")
    tok = loaded.tokenizer
    loaded.model.train()  # the caller's mode is restored
    src_tokens, tgt_tokens, att = attention_maps(loaded.model, tok, SRC, "The cat is sleeping on the sofa.")
    assert loaded.model.training
    assert tgt_tokens == ["<s>", *tok.id_to_token(tok.encode_tgt(["The cat is sleeping on the sofa."])[0])]
    assert src_tokens == [*tok.id_to_token(tok.encode_src([SRC])[0]), "</s>"]
    assert att.decoder[0].shape[-1] == len(tgt_tokens) > 5
    assert att.decoder[0].shape[-2] == att.cross[0].shape[-2] == len(tgt_tokens)


@pytest.mark.parametrize("level,name", [(level, name) for level in ("input", "attention") for name in names(level)])
def test_position_figures_for_every_registered_encoding(level: str, name: str, tmp_path: Path) -> None:
    model_cfg = make_tiny_config(tmp_path).model
    if level == "input":
        model_cfg = model_cfg.model_copy(update=dict(input_pe=name, attention_pe="none"))
    elif REGISTRY["attention"][name] is not None and REGISTRY["attention"][name].causal_only:  # decoder self only
        model_cfg = model_cfg.model_copy(update=dict(input_pe="none", attention_pe="none", cross_attention_pe="none",
                                                     decoder_pe=StackPE(attention=name)))
    else:
        model_cfg = model_cfg.model_copy(update=dict(input_pe="none", attention_pe=name, cross_attention_pe=name))
    model = Seq2SeqTransformer(model_cfg, 100, 0)
    figs, notes = position_figures(model, model_cfg, length=24, bias_length=12)
    if name == "none":
        assert not figs
        line = {"input": "input_pe=none: no input positional encoding to plot",
                "attention": "attention_pe=none: no attention-level positional encoding in self-attention"}[level]
        assert line in notes, notes
        assert all("\n" not in note for note in notes)
        return
    assert figs, f"{level}_pe={name} produced no figure"
    if name == "xpos":
        assert set(figs) == {"position/decay"}
        assert "model.attention_pe=none: no attention-level positional encoding in encoder self-attention" in notes
        assert not any("nothing to plot" in note for note in notes), notes
    elif level == "attention" and name != "rope":
        kinds = {"decoder"} if model_cfg.attention_pe == "none" else {"encoder", "decoder", "cross"}
        assert {tag.rsplit("/", 1)[1] for tag in figs} == kinds
    paths = write_figures(figs, tmp_path / "png", dpi=40)
    assert [p.name for p in paths] == [tag_filename(tag) for tag in figs]
    assert all(p.stat().st_size > 0 for p in paths)


def test_cope_figures_are_its_table_and_its_positions_and_term_for_random_q_k() -> None:
    """CoPE's term depends on q and k: its grids use random q, k (seed 0, said in the title), the same every call."""
    from models.positional.cope import CopePE

    cfg = make_tiny_config(Path("unused")).model.model_copy(update=dict(
        input_pe="none", attention_pe="none", decoder_pe=StackPE(attention="cope")))
    torch.manual_seed(0)
    model = Seq2SeqTransformer(cfg, 100, 0)
    pe = model.decoder[0].self_attn.pe
    assert isinstance(pe, CopePE)
    torch.nn.init.normal_(pe.pos_embed)
    specs = {spec.tag: spec for spec in pe.plots("cope, decoder self-attention, layer 0", 10)}
    table, positions, bias = (specs[f"position/cope/{what}/decoder"] for what in ("table", "positions", "bias"))
    assert table.draw == "pe_heatmap" and table.args[0].shape == (cfg.cope.npos_max, cfg.d_model // cfg.n_heads)
    p = positions.args[0]
    assert positions.draw == bias.draw == "bias_grid" and p.shape == bias.args[0].shape == (cfg.n_heads, 10, 10)
    assert "random q, k" in positions.args[1] and "random q, k" in bias.args[1]
    lower = torch.ones(10, 10, dtype=torch.bool).tril()
    assert p[:, lower].min() > 0 and p[:, ~lower].abs().max() == 0
    assert (p[:, torch.arange(10), torch.arange(10)] < 1).all()  # a key counts itself with one gate below 1
    assert (p[:, :, :-1] >= p[:, :, 1:]).all()  # fewer keys counted the closer j is to i
    torch.testing.assert_close(pe.plots("x", 10)[2].args[0], bias.args[0])  # the same q, k every call
    figs, notes = position_figures(model, cfg, length=24, bias_length=10)
    assert {"position/cope/table/decoder", "position/cope/positions/decoder", "position/cope/bias/decoder"} <= set(figs)


@pytest.mark.parametrize("sets", [{"method": "shape", "shape": {"max_shift": 10}},
                                  {"method": "randomized", "randomized": {"max_length": 40}},
                                  {"method": "cape"}])
def test_augmentation_figure_shows_the_training_draws_against_the_inference_positions(sets: dict) -> None:
    from models.positional.augment import AugmentConfig
    from utils.figures.maps import augment_plot

    cfg = make_tiny_config(Path("unused")).model
    method = sets["method"]
    cfg = cfg.model_copy(update=dict(augment=AugmentConfig.model_validate(sets),
                                     attention_pe="rope" if method == "cape" else "none"))
    spec = augment_plot(cfg, 32)
    assert spec is not None and spec.tag == "position/augment" and spec.draw == "augment_positions"
    draws, title = spec.args
    length = 32
    assert draws.shape == (200, length) and f"model.augment: {cfg.augment.describe()}" in title
    torch.testing.assert_close(augment_plot(cfg, 32).args[0], draws)  # seeded: the same figure every call
    steps = draws[:, 1:] - draws[:, :-1]
    if method == "shape":  # i + k, k in 0..10, every k drawn
        k = draws[:, 0]
        assert torch.equal(draws, k[:, None] + torch.arange(32)) and set(k.tolist()) == set(range(11))
    elif method == "randomized":  # sorted subsets of 32 of 0..39, not all the same
        assert (steps > 0).all() and draws.min() >= 0 and draws.max() <= 39 and len(set(map(tuple, draws.tolist()))) > 1
        short = cfg.model_copy(update=dict(augment=AugmentConfig(method="randomized", randomized={"max_length": 20})))
        assert torch.equal(augment_plot(short, 32).args[0], torch.arange(20).expand(200, 20))  # at most L tokens
    else:  # real positions, in order, scaled by at most 1.03 around unit gaps
        assert draws.dtype == torch.float64 and (steps > 0).all() and not torch.equal(draws, draws.round())
        assert draws[:, 0].abs().max() <= 5.5 * 1.03
    model = Seq2SeqTransformer(cfg, 100, 0)
    figs, _ = position_figures(model, cfg, length=24, bias_length=32)
    fig = figs["position/augment"]
    inference = [line for line in fig.axes[0].lines if line.get_label() == "inference: 0..T−1"]
    assert len(inference) == 1 and list(inference[0].get_ydata()) == list(range(length))
    plain = cfg.model_copy(update=dict(augment=AugmentConfig()))
    assert augment_plot(plain, 32) is None
    assert "position/augment" not in position_figures(Seq2SeqTransformer(plain, 100, 0), plain)[0]


def test_classical_mds_recovers_planar_points() -> None:
    rng = np.random.default_rng(0)
    points = rng.normal(size=(20, 2))
    embedded = np.concatenate([points @ np.array([[0.6, 0.8], [-0.8, 0.6]]), np.zeros((20, 3))], axis=1) + 5.0
    xy = plots.classical_mds(embedded)
    dist = lambda p: np.linalg.norm(p[:, None] - p[None], axis=-1)
    np.testing.assert_allclose(dist(xy), dist(points), atol=1e-8)


def test_decay_curves_are_normalised() -> None:
    k = np.arange(5, dtype=np.float64)
    from models.positional.absolute import sinusoid_table

    table = sinusoid_table(5, 16).double()
    score = plots.cos_score(plots.rope_inv_freq(16, 10000.0), k)
    np.testing.assert_allclose(score, (table[0] @ table.T / (table[0] @ table[0])).numpy(), atol=1e-6)
    assert plots.rope_relative_bound(plots.rope_inv_freq(16, 10000.0), k)[0] == pytest.approx((8 + 1) / 2)


def test_user_errors_are_one_line(runs: dict[str, Path], tmp_path: Path) -> None:
    for args, message in (
        (["--model_path", str(tmp_path / "x.pt"), "--src_text", SRC], "checkpoint not found"),
        (["--model_path", str(runs["t5"]), "--src_text", " "], "--src_text is empty"),
    ):
        res = cli(*args)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        assert message in res.stderr.strip().splitlines()[-1]


def test_cross_attention_rows_are_the_predicted_tokens_and_alignment_follows_the_argmax(runs: dict[str, Path],
                                                                                         tmp_path: Path) -> None:
    from utils.figures.maps import alignment, attention_from_ids, encode_pair, figures_from_attention

    run = load_run(runs["rope"])
    src_ids, tgt_ids, _ = encode_pair(run.model, run.tokenizer, SRC, "The cat sleeps on the sofa.")
    src_tokens, tgt_tokens, attention = attention_from_ids(run.model, run.tokenizer, src_ids, tgt_ids)
    figs = figures_from_attention(src_tokens, tgt_tokens, attention)
    cross_ax = figs["attention/cross/layer_0"].axes[0]
    rows = [t.get_text() for t in cross_ax.get_yticklabels()]
    assert rows == [*tgt_tokens[1:], "</s>"]  # the row reading <s> predicts the first target token
    assert cross_ax.get_ylabel() == "predicted target token" and "being predicted" in figs[
        "attention/cross/layer_0"].get_suptitle()
    self_rows = [t.get_text() for t in figs["attention/decoder/layer_0"].axes[0].get_yticklabels()]
    assert self_rows == tgt_tokens  # self-attention keeps the token each position reads
    a = alignment(src_tokens, tgt_tokens, attention)
    w = attention.cross[-1][0].mean(0)
    assert a.links == w.argmax(-1).tolist() and len(a.links) == len(tgt_tokens)
    diagonal = [i * (len(src_tokens) - 1) / (len(a.links) - 1) for i in range(len(a.links))]
    expected = sum(abs(j - d) <= 2 for j, d in zip(a.links, diagonal, strict=True)) / len(a.links)
    assert a.diagonal_agreement() == pytest.approx(expected)


def test_alignment_cli_for_a_sentence_and_a_file(runs: dict[str, Path], tmp_path: Path) -> None:
    res = cli("--model_path", str(runs["rope"]), "--src_text", SRC, "--alignment", "--out", str(tmp_path / "one"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "one" / "alignment.png").is_file()
    assert "alignment (layer 0):" in res.stdout and "agreement with the diagonal" in res.stdout
    src = tmp_path / "in.fr"
    src.write_text("Le chat dort.\n\nBonjour le monde.\n", encoding="utf-8")
    res = cli("--model_path", str(runs["rope"]), "--alignment", "--input", str(src), "--out", str(tmp_path / "f"))
    assert res.returncode == 0, res.stderr
    lines = (tmp_path / "f" / "alignment.txt").read_text().split("\n")[:-1]
    assert len(lines) == 3 and lines[1] == ""  # one line per input line; the empty one stays empty
    for line in (lines[0], lines[2]):
        pairs = [tuple(map(int, p.split("-"))) for p in line.split()]
        assert pairs and [t for _, t in pairs] == list(range(len(pairs)))  # one link per target token
    assert "aligned 2 sentences (1 empty or too long skipped)" in res.stdout
    empty = tmp_path / "empty.fr"
    empty.write_text("", encoding="utf-8")  # no input line: no alignment line, and no agreement to average
    res = cli("--model_path", str(runs["rope"]), "--alignment", "--input", str(empty), "--out", str(tmp_path / "e"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "e" / "alignment.txt").read_text() == "" and "no sentence aligned" in res.stdout
    bad = cli("--model_path", str(runs["rope"]), "--alignment", "--src_text", SRC, "--layer", "5")
    assert bad.returncode == 2 and "--layer 5: the decoder has 1 layers" in bad.stderr
    # Refused before anything is written: no --out folder left behind.
    binary = tmp_path / "bin.dat"
    binary.write_bytes(b"\x00\x01\x02 binary")
    two = tmp_path / "two.txt"
    two.write_text("a\nb\n", encoding="utf-8")
    for n, (flags, why) in enumerate(((["--src_text", SRC, "--layer", "5"], "--layer 5: the decoder has 1 layers"),
                                      (["--input", str(src), "--layer", "5"], "--layer 5: the decoder has 1 layers"),
                                      (["--input", str(binary)], "is not a text file"),
                                      (["--input", str(src), "--tgt_input", str(two)], "--tgt_input has 2 lines"))):
        out = tmp_path / f"refused{n}"
        bad = cli("--model_path", str(runs["rope"]), "--alignment", *flags, "--out", str(out))
        assert bad.returncode == 2 and why in bad.stderr.strip().splitlines()[-1], bad.stderr
        assert not out.exists(), flags
