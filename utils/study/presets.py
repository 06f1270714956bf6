"""The ready-made studies (``--preset``): each names its config, its encodings one by one, its baseline and, where
one was pre-registered, its primary family (utils.study.analysis.Family)."""

from __future__ import annotations

from utils.study.arms import NATURAL_FAMILY, NATURAL_LENGTH, NATURAL_SYSTEMS
from utils.study.spec import Preset, Variant

# Length-shifted test sets (data.sources: NAME.xK joins K consecutive pairs): the training data's vocabulary and
# style at about 1, 2, 4 and 8 times its sentence length; TED mixes a length and a domain shift.
LENGTH_SHIFTED = [f"test.{name}{f'.x{k}' if k > 1 else ''}" for name in ("tatoeba", "multi30k-2016")
                  for k in (1, 2, 4, 8)] + ["test.iwslt-tst2010"]


# The encodings of the pre-registered families, named one by one (as utils/study/arms.py names its systems), not
# read from the registry: a preset never grows by itself when an encoding is registered later (a new one is studied
# with --grid, or joins a preset by an edit here that says so). Input-level; attention-level in both stacks; and for
# causal (decoder) self-attention only, which validation refuses in the encoder (studied with RoPE in the encoder).
INPUT_ENCODINGS = ("sinusoidal", "learnable", "learnable_ln", "onehot", "gaussian", "binary")
ATTENTION_ENCODINGS = ("rope", "alibi", "t5", "shaw", "kerple_log", "kerple_power", "sandwich", "fire", "dpb")
DECODER_ONLY_ENCODINGS = ("cope", "xpos")


def _pe(label: str, input_pe: str, attention_pe: str) -> Variant:
    return Variant(label, [f"model.input_pe={input_pe}", f"model.attention_pe={attention_pe}"])


# The pre-registered primary analysis of train-short-test-long (docs/pages/studies/preregistration-extrapolation.md;
# in README when it was declared): chrF, beam 5, on the x4 sets and each run's drop from x1 to x4; RoPE+linear is
# exploratory.
EXTRAPOLATION_FAMILY = {
    "metric": "chrF", "decoder": "beam5", "splits": ["test.tatoeba.x4", "test.multi30k-2016.x4"],
    "drops": {"test.tatoeba.x4": "test.tatoeba", "test.multi30k-2016.x4": "test.multi30k-2016"},
    "systems": ["learnable", "rope", "rope+ntk", "rope+yarn", "alibi", "t5"], "smallest_effect": 1.0, "alpha": 0.05,
    "declared": "pre-registered in README on 2026-11-25, before the runs"}


def presets() -> dict[str, Preset]:
    inputs, attentions, decoder_only = INPUT_ENCODINGS, ATTENTION_ENCODINGS, DECODER_ONLY_ENCODINGS
    short_scalings = {s: [f"model.rope.scaling={s}", "model.rope.factor=8", "model.rope.original_max_len=16"]
                      for s in ("linear", "ntk", "yarn")}
    short = [_pe(e, e, "none") for e in ("sinusoidal", "learnable")] + [_pe(e, "none", e) for e in ("alibi", "t5")]
    rope = _pe("rope", "none", "rope")
    rope.tests = short_scalings
    # RoPE in the encoder, no position at all in the decoder: its causal mask carries order (NoPE, Kazemnejad et
    # al. 2023). Joined the presets after the extrapolation study was pre-registered: exploratory there.
    decoder_nope = Variant("decoder-nope", ["model.input_pe=none", "model.attention_pe=rope",
                                            "model.decoder_pe.attention=none"])
    # An encoding for decoder self-attention only (CoPE) is studied as decoder-nope is, with RoPE in the encoder:
    # the two differ in the decoder's encoding alone.
    # Attention-level encodings registered after the extrapolation study was pre-registered (KERPLE, Sandwich,
    # FIRE, ...): in its preset, exploratory there, like decoder-nope, decoder-<causal-only> and sinusoidal+shape.
    newer = [_pe(e, "none", e) for e in attentions if e not in ("rope", "alibi", "t5", "shaw")]
    decoder_own = [Variant(f"decoder-{e}", ["model.input_pe=none", "model.attention_pe=rope",
                                            f"model.decoder_pe.attention={e}"]) for e in decoder_only]
    # SHAPE (Kiyono et al. 2021) on the sinusoids: in training every position of a stack is shifted by one k ~
    # U{0..100} (model.augment; inference unchanged). Joined the presets after the extrapolation study was
    # pre-registered: exploratory there.
    shape = Variant("sinusoidal+shape", ["model.input_pe=sinusoidal", "model.attention_pe=none",
                                         "model.augment.method=shape", "model.augment.shape.max_shift=100"])
    long_tests = [f"data.test=[{','.join(LENGTH_SHIFTED)}]", "train.amp=none", "train.amp_cpu=false",
                  "train.keep_checkpoints=0", "train.num_threads=1"]
    return {
        "seed-table": Preset("configs/bench_small.yaml", [_pe("sinusoidal", "sinusoidal", "none"),
                                                          _pe("learnable", "learnable", "none"),
                                                          _pe("rope", "none", "rope")], "sinusoidal"),
        "all-encodings": Preset("configs/bench_small.yaml", [_pe("none", "none", "none")]
                                + [_pe(e, e, "none") for e in inputs] + [_pe(e, "none", e) for e in attentions]
                                + [decoder_nope, *decoder_own, shape], "sinusoidal"),
        # Precision and CPU threads are part of the design (fp32 and one thread per run on every machine: a
        # thread count can change floating-point results); periodic checkpoints are resume points only.
        "train-short-test-long": Preset("configs/bench_short.yaml", [*short, rope, *newer, decoder_nope, *decoder_own,
                                                                     shape], "sinusoidal", long_tests,
                                        family=EXTRAPOLATION_FAMILY),
        # Its natural-length arm (utils/study/arms.py): the same systems trained on pairs of every length.
        "train-natural-test-long": Preset("configs/bench_short.yaml", [Variant(*v) for v in NATURAL_SYSTEMS],
                                          "sinusoidal", [*long_tests, NATURAL_LENGTH], family=NATURAL_FAMILY),
        "tokenization": Preset("configs/bench_small_rope.yaml", [
            Variant("bpe", ["tokenizer.type=bpe"]),
            Variant("unigram", ["tokenizer.type=unigram", *_same_sentences(1.125)]),
            Variant("char", ["tokenizer.type=char", "tokenizer.vocab_size=1000", "data.max_len=512",
                             "model.max_positions=1024", *_same_sentences(4.0)]),
            Variant("word", ["tokenizer.type=word", "tokenizer.vocab_size=32000", "tokenizer.min_frequency=2",
                             *_same_sentences(1.04)]),
        ], "bpe"),
    }


def _same_sentences(scale: float) -> list[str]:
    """Batch, lr reference and warmup of bench_small in a tokenizer's own tokens, for one that makes ``scale``
    times as many tokens per sentence as its BPE 8000 (bench training data, max of source and target, eos
    included: bpe 10.9, unigram 12.3, word 11.4, char 44.3): every tokenization then sees about the same
    sentences per optimizer step with about the same peak lr and warmup steps (train.py derives both from the
    target tokens it measures per batch), so ``--steps`` is an equal budget."""
    return [f"data.max_tokens={round(4096 * scale)}", f"train.lr_batch_tokens={round(3500 * scale)}",
            f"train.warmup_tokens={round(750_000 * scale)}"]
