"""The natural-length arm of the extrapolation question (bench/study.py's preset ``train-natural-test-long``).

``train-short-test-long`` trains on pairs of at most 16 tokens (``data.max_train_len: 16`` of
configs/bench_short.yaml) and tests on sets 1, 2, 4 and 8 times as long: at x4 its models write a quarter to a third
of the reference, so it measures when a model stops as much as how it uses positions. This arm trains the same
systems on pairs of every length (``data.max_train_len=null``: the ``data.max_len`` filter alone), with the same
budget, data and test sets (x1, x2, x4, x8), so that a study can set both arms side by side.

Its systems are named here, one by one, not read from the encoding registry: a family declared for these runs
must not grow when an encoding is registered later. No RoPE length extension (``rope+ntk``, ``rope+yarn``) is among
them: they stretch a model trained on 16 tokens, which this arm does not train.
"""

from __future__ import annotations

from typing import Any

NATURAL_LENGTH = "data.max_train_len=null"  # what makes the arm: no cap on training pairs beyond data.max_len

_INPUT = ("sinusoidal", "learnable")
_ATTENTION = ("alibi", "t5", "rope", "kerple_log", "kerple_power", "sandwich", "fire", "dpb")
_DECODER_ONLY = ("nope", "cope", "xpos")  # RoPE in the encoder, this in the decoder's self-attention

# (label, overrides) of each system, the baseline first: the trained systems of train-short-test-long on 2026-11-29.
NATURAL_SYSTEMS: list[tuple[str, list[str]]] = (
    [(e, [f"model.input_pe={e}", "model.attention_pe=none"]) for e in _INPUT]
    + [(e, ["model.input_pe=none", f"model.attention_pe={e}"]) for e in _ATTENTION]
    + [(f"decoder-{e}", ["model.input_pe=none", "model.attention_pe=rope",
                         f"model.decoder_pe.attention={'none' if e == 'nope' else e}"]) for e in _DECODER_ONLY]
    + [("sinusoidal+shape", ["model.input_pe=sinusoidal", "model.attention_pe=none", "model.augment.method=shape",
                             "model.augment.shape.max_shift=100"])])

# The primary analysis of this arm: the extrapolation study's endpoint (chrF, beam 5, the x4 sets and each run's
# drop from x1 to x4) for its trained systems.
NATURAL_FAMILY: dict[str, Any] = {
    "metric": "chrF", "decoder": "beam5", "splits": ["test.tatoeba.x4", "test.multi30k-2016.x4"],
    "drops": {"test.tatoeba.x4": "test.tatoeba", "test.multi30k-2016.x4": "test.multi30k-2016"},
    "systems": ["learnable", "rope", "alibi", "t5"], "smallest_effect": 1.0, "alpha": 0.05,
    "declared": "declared with the train-natural-test-long preset on 2026-11-29, before any of its runs: the "
                "extrapolation study's endpoint for its trained systems, trained on pairs of every length"}


def beside(short: dict[str, Any], natural: dict[str, Any], decoder: str = "beam5") -> list[str]:
    """The two arms side by side, as the second extrapolation study's pre-registration declares (a description, no
    test): for each trained system of the natural-length arm that the short-trained arm also trained, and each test
    set family (``test.tatoeba``, ``test.multi30k-2016``) at x1, x2, x4 and x8, the output/reference length ratio and
    the chrF (``decoder``; each the mean over the arm's seeds), one row per arm; a set tested at x1 alone is left
    out. Markdown lines."""
    trained = [v["label"] for v in natural["spec"]["variants"]]
    systems = [s for s in trained if s in {v["label"] for v in short["spec"]["variants"]}]
    families = [s for s in natural["splits"] if ".x" not in s and f"{s}.x4" in natural["splits"]]  # tested longer
    splits = [s for f in families for s in (f, *(f"{f}.x{k}" for k in (2, 4, 8))) if s in natural["splits"]
              and s in short["splits"]]

    def cell(results: dict[str, Any], system: str, split: str) -> str:
        row = results["systems"][system]["splits"][split][decoder]
        ratio = row.get("length_ratio")
        return (f"{sum(ratio) / len(ratio):.2f}" if ratio else "-") + f" · {sum(row['chrf']) / len(row['chrf']):.1f}"

    seeds = {name: ", ".join(map(str, res["seeds"])) for name, res in (("short", short), ("natural", natural))}
    out = [f"Length ratio (output/reference, sacreBLEU's 13a words) · chrF, {decoder}, the mean over each arm's seeds "
           f"(short-trained: pairs of at most 16 tokens, seeds {seeds['short']}; natural-length: pairs of every "
           f"length, seeds {seeds['natural']}). A description beside the families' tests, not a test.", "",
           "| system | arm | " + " | ".join(splits) + " |", "|---|---|" + "---|" * len(splits)]
    for system in systems:
        for arm, results in (("short", short), ("natural", natural)):
            out.append(f"| {system} | {arm} | " + " | ".join(cell(results, system, s) for s in splits) + " |")
    return out
