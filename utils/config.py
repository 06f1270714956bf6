"""Typed configuration: YAML file -> nested pydantic sections, with ``--set key=value`` overrides.

Every key is declared with its type and default: the ``model``, ``data`` and ``tokenizer`` sections next to
their layer (``models/config.py``, ``data/config.py``, ``tokenizer/config.py``), the rest here.
An unknown key, a value of the wrong type or a value outside a closed set stops with one line naming
the key and what is allowed, e.g.::

    ConfigError: model.attention_pe: 'rpoe' is not one of: none, rope

String values may reference environment variables as ``${VAR}`` or ``${VAR:-default}`` (used for
``FR2EN_SHARED_DATA``); they are expanded once, when the config is loaded, and a run saves the result
literally (``$${`` stands for a literal ``${``), so reloading a run never expands a value again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError

from data.config import DataConfig
from models.config import ModelConfig, RopeConfig, ShawConfig, T5BiasConfig
from models.positional import REGISTRY, check_settings
from models.positional import effect_rules as encoding_effect_rules
from models.positional.augment import AugmentConfig, check_augmentation
from models.positional.base import name_at
from tokenizer.config import TokenizerConfig
from utils.schema import ConfigError, Section, config_error, escape_env, expand_env

__all__ = [
    "Config", "ConfigError", "DataConfig", "DecodeConfig", "EvalConfig", "ModelConfig", "RopeConfig", "ShawConfig",
    "T5BiasConfig", "TokenizerConfig", "TrainConfig", "expand_env", "from_dict", "load_config", "save_config",
]

# Closed sets whose members live in a registry are checked against that registry at validation time
# (see ``registry_choices``) so that adding an encoding needs no edit here.
INPUT_PE_KEY = "model.input_pe"
ATTENTION_PE_KEY = "model.attention_pe"
CROSS_ATTENTION_PE_KEY = "model.cross_attention_pe"


class TrainConfig(Section):
    """Optimisation, schedule, evaluation and stopping."""

    epochs: int = Field(50, ge=1, le=10**7, description="Passes over the training data; training stops after the "
                        "last one at the latest.")
    max_steps: int | None = Field(None, ge=1, le=10**10, description="Stop after this many optimizer steps "
                                  "(validating and saving `last.pt` first); null: no step limit.")
    max_target_tokens: int | None = Field(None, ge=1, le=10**15, description="Stop once this many target tokens were "
                                          "trained on, counted over every process; null: no limit.")
    max_minutes: float | None = Field(None, gt=0, le=10**8, description="Stop after this much wall time, in minutes; "
                                      "null: no limit.")
    lr: float = Field(5e-4, ge=0, description="Peak learning rate of AdamW (the rate after warmup); with "
                      "`train.lr_batch_tokens` the peak for batches of that size. 0 freezes the weights (a control "
                      "run).")
    scheduler: Literal["inverse_sqrt", "constant"] = Field(
        "inverse_sqrt", description="Learning-rate schedule: `inverse_sqrt` rises linearly to `train.lr` over the "
        "warmup, then decays as 1/sqrt(step) (Vaswani et al. 2017); `constant` keeps `train.lr` from the first step "
        "(no warmup).")
    cooldown: float = Field(0.0, ge=0, le=1, description="Share of the run's step budget over which the learning "
                            "rate falls linearly to zero at the end (a cool-down, the warmup-stable-decay schedule "
                            "of Hägele et al. 2024), so that the last weights are taken at a learning rate near zero "
                            "(less noise from run to run); the budget is `train.max_steps`, or the steps "
                            "`train.max_target_tokens` allows at the run's batch size, one of which must be set. "
                            "0: no cool-down.")
    ema_decay: float | None = Field(None, gt=0, lt=1, description="Keep an exponential moving average of the "
                                    "weights (Polyak averaging) with this decay per optimizer step, e.g. 0.999: "
                                    "validation scores the averaged weights, and every checkpoint holds them as "
                                    "its `model` (what decoding loads; `last.pt` keeps the training weights too, "
                                    "to resume). null: off.")
    warmup_steps: int = Field(4000, ge=0, le=10**10, description="Warmup length in optimizer steps; ignored when "
                              "`train.warmup_tokens` is set (a `--set` of it is then refused).")
    warmup_tokens: int | None = Field(None, ge=1, le=10**15, description="Warmup length in target tokens instead of "
                                      "steps, so "
                                      "that it holds at any batch size (replaces `train.warmup_steps`); null: count "
                                      "the warmup in steps.")
    lr_batch_tokens: int | None = Field(None, ge=1, le=10**12, description="Makes `train.lr` the peak for batches of "
                                        "this many "
                                        "target tokens, scaled by sqrt(batch / lr_batch_tokens) for other batch "
                                        "sizes (Adam's square-root rule, Malladi et al. 2022); batch = mean target "
                                        "tokens per optimizer step. null: `train.lr` as given.")
    betas: list[float] = Field(default_factory=lambda: [0.9, 0.98], description="AdamW's two decay rates "
                               "(beta1, beta2), each in [0, 1).")
    eps: float = Field(1e-9, gt=0, le=1, description="AdamW's epsilon, added to the denominator for stability.")
    weight_decay: float = Field(0.0, ge=0, le=100, description="AdamW's decoupled weight decay; 0: none.")
    label_smoothing: float = Field(0.1, ge=0, lt=1, description="Share of probability mass the training target "
                                   "spreads over the whole vocabulary (label smoothing, Szegedy et al. 2016); 0: "
                                   "plain cross-entropy.")
    fused_loss: bool = Field(True, description="Compute the output layer and its loss chunk by chunk of rows, "
                             "gradients in the same pass, never holding the full [tokens x vocabulary] logits "
                             "(much less memory); false: the plain linear layer then cross-entropy.")
    clip_norm: float = Field(1.0, ge=0, le=1e9, description="Clip the gradient's global norm to this value; 0: no "
                             "clipping.")
    nonfinite: Literal["stop", "skip"] = Field(
        "stop", description="A step whose loss or gradient norm is NaN or infinite is never applied; at the next "
        "read of the device (every `train.log_every` iterations, each validation and checkpoint): `stop` training "
        "with one line naming the first such step, or `skip` it (logged; training stops after 20 skipped in a "
        "row). fp16 overflow steps are the gradient scaler's to skip.")
    accumulate: int = Field(1, ge=1, le=65536, description="Batches whose gradients are summed per optimizer step "
                            "(gradient accumulation): the effective batch is this many times `data.max_tokens`.")
    eval_every: int = Field(0, ge=0, le=10**10, description="Validate (loss and BLEU) every N iterations (batches); "
                            "0: at the end of each epoch.")
    patience: int = Field(10, ge=1, le=10**10, description="Early stopping: stop after this many validations in a "
                          "row without a better validation BLEU.")
    valid_bleu_sentences: int | None = Field(None, ge=1, le=10**9, description="Score validation BLEU on the first N "
                                             "validation pairs only (faster); null: all of them.")
    valid_beam: int = Field(1, ge=1, le=1024, description="Beam size for validation BLEU; 1: greedy decoding.")
    log_every: int = Field(50, ge=1, le=10**10, description="Log loss, learning rate and target tokens/s every N "
                           "iterations (batches); without a terminal these lines are the progress report. Losses and "
                           "gradient norms are read back from the device only then (and at least every 1000 "
                           "iterations, at validations and checkpoints): training never waits for a GPU in between.")
    keep_checkpoints: int = Field(0, ge=0, le=10**5, description="Keep the last K periodic checkpoints "
                                  "(`checkpoints/step_<iteration>.pt`), e.g. to average them with `--average`; 0: "
                                  "none.")
    checkpoint_every: int = Field(0, ge=0, le=10**10, description="Write a periodic checkpoint (and refresh "
                                  "`last.pt`) every N "
                                  "iterations; 0: at each validation. Only with `train.keep_checkpoints` > 0.")
    log_attention_every: int = Field(0, ge=0, le=10**7, description="Log the attention maps of one validation "
                                     "sentence to TensorBoard every N epochs; 0: off.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Where to train: `auto` takes CUDA when "
                                                   "present, else the CPU.")
    amp: Literal["none", "bf16", "fp16"] = Field(
        "none", description="Mixed precision (autocast) on CUDA: `bf16`, `fp16` (with a gradient scaler) or `none` "
        "(fp32). `bf16` may also apply on CPU: see `train.amp_cpu`.")
    amp_cpu: bool | Literal["auto"] = Field(
        "auto", description="With `train.amp=bf16` on a CPU: `auto` uses bf16 autocast only where the CPU computes "
        "bf16 natively (AVX512-BF16, AMX or Arm BF16 instructions; faster than fp32 there, with less memory) and "
        "fp32 elsewhere, where bf16 is emulated and several times slower; `true` forces bf16, `false` forces fp32. "
        "The training log names the precision chosen.")
    num_threads: int | None = Field(None, ge=1, le=4096, description="CPU threads for training "
                                    "(`torch.set_num_threads`), "
                                    "shared by the processes of one machine under torchrun; null: every core.")
    compile: bool | Literal["reduce-overhead"] = Field(
        False, description="`torch.compile` the training forward (inductor, the same random numbers as eager): "
        "`true` compiles it for dynamic shapes, or, with `train.static_shapes`, once per static shape; "
        "`reduce-overhead` also replays it as CUDA graphs (one kernel launch per step; needs "
        "`train.static_shapes`; on a CPU it compiles as `true`). Off by default: slower than eager on the CPUs "
        "measured, not yet measured on GPUs.")
    static_shapes: bool = Field(False, description="Pad every training batch to one of a few (rows, length) "
                                "shapes, so that a run sees a handful of shapes (what `train.compile` and CUDA "
                                "graphs need): lengths 8, 10, 13, 16, 20, 25, 32, ... (three steps per doubling) up "
                                "to the longest pair, for source and target alike; rows `data.max_tokens` // "
                                "length; batches grouped at their padded size. The padding it adds is reported in "
                                "the log and `summary.json`; the loss is that of the unpadded batch. false: each "
                                "batch padded to its longest pair.")
    profile_steps: int = Field(0, ge=0, le=10**6, description="Run the PyTorch profiler over this many optimizer "
                               "steps and "
                               "write `<run>/profile/phases.json` (milliseconds per step by phase) and the trace; 0: "
                               "off.")
    profile_after: int = Field(10, ge=1, le=10**10, description="Optimizer steps to skip (warm-up) before "
                               "`train.profile_steps` starts profiling.")


class DecodeConfig(Section):
    """Decoding defaults shared by validation, inference.py and test.py."""

    beam: int = Field(5, ge=1, le=1024, description="Beam size; 1: greedy decoding. `--beam` of inference.py and "
                      "test.py overrides it.")
    nbest: int = Field(1, ge=1, le=1024, description="Hypotheses returned per sentence, best first; at most "
                       "`decode.beam`.")
    lenpen: float = Field(0.6, ge=0, le=100, description="GNMT length penalty alpha (Wu et al. 2016, eq. 14): finished "
                          "hypotheses are ranked by log-probability / ((5 + length) / 6)^alpha, so larger values "
                          "favour longer outputs; 0: raw log-probability.")
    max_len_a: float = Field(1.5, ge=0, le=1000, description="Output length cap: a hypothesis ends at a * source "
                             "length + b tokens (`b` = `decode.max_len_b`).")
    max_len_b: int = Field(10, ge=0, le=10**6, description="The `b` of the output length cap a * source length + b.")
    min_len_a: float = Field(0.0, ge=0, le=1000, description="Output length floor (fairseq's minimum length, per "
                             "sentence): end-of-sentence is blocked until a hypothesis has a * source length + b "
                             "tokens (`b` = `decode.min_len_b`), at most the length cap; 0 with `decode.min_len_b` 0 "
                             "(the default): no floor. A length control, e.g. for a model trained on short pairs "
                             "that stops early on long inputs; `--min_len_a` of inference.py and test.py overrides "
                             "it.")
    min_len_b: int = Field(0, ge=0, le=10**6, description="The `b` of the output length floor a * source length + b "
                           "(`--min_len_b`).")
    no_repeat_ngram_size: int = Field(0, ge=0, le=1024, description="Block repeated n-grams: a token that would "
                                      "complete an n-gram of this size already in the hypothesis is never chosen, in "
                                      "greedy, beam and sampled decoding and in a CTranslate2 export (fairseq's "
                                      "`--no-repeat-ngram-size`, Eole's `block_ngram_repeat`); a target prefix's "
                                      "tokens are kept; 0: off. `--no_repeat_ngram_size` of inference.py and "
                                      "test.py.")
    batch_size: int = Field(64, ge=1, le=10**6, description="Sentences decoded together in one batch.")
    beam_stop: Literal["bound", "k_finished"] = Field(
        "bound", description="When a sentence's beam search ends: `bound` once no live hypothesis can beat its "
        "finished n-best (finds the output the model prefers); `k_finished` once `decode.beam` hypotheses have "
        "finished (fairseq's and CTranslate2's rule).")
    sample: bool = Field(False, description="Draw outputs at random from the model's next-token distribution "
                         "instead of searching (`--sample`); shaped by `decode.temperature`, `decode.top_k`, "
                         "`decode.top_p` and `decode.epsilon`; `decode.num_samples` per sentence. `decode.beam` is "
                         "then unused. Validation during training never samples.")
    temperature: float = Field(1.0, gt=0, lt=100, description="Sampling: the log-probabilities are divided by it "
                               "before renormalising; below 1 sharper (towards greedy), above 1 flatter.")
    top_k: int = Field(0, ge=0, le=10**6, description="Sampling: draw only among the K most probable tokens; 0: off.")
    top_p: float = Field(1.0, gt=0, le=1, description="Sampling (nucleus, Holtzman et al. 2020): draw only among the "
                         "fewest most probable tokens whose probabilities sum to at least P; 1: off.")
    epsilon: float = Field(0.0, ge=0, lt=1, description="Sampling (epsilon sampling, Hewitt et al. 2022): draw only "
                           "among tokens of probability at least E (the most probable token always stays); 0: off.")
    num_samples: int = Field(1, ge=1, le=1024, description="Sampling: outputs drawn per sentence, each written as "
                             "`decode.nbest` hypotheses are, best first by score.")
    seed: int | None = Field(None, ge=0, lt=2**63, description="Sampling: a sentence's draws come from this seed and "
                             "its source tokens alone, so the same seed repeats the samples exactly (on CPU); null: "
                             "a fresh seed each time.")
    mbr: int = Field(0, ge=0, le=1024, description="Minimum Bayes risk decoding (Eikema & Aziz 2020) over this many "
                     "candidates: `decode.mbr` samples with `decode.sample`, else the beam's `decode.mbr`-best (at "
                     "most `decode.beam`); the output is the candidate of highest mean `decode.mbr_utility` against "
                     "every candidate (itself included) as a pseudo-reference. 0: off; else at least 2.")
    mbr_utility: Literal["chrf", "bleu"] = Field("chrf", description="The utility of MBR decoding: sentence-level "
                                                 "chrF or BLEU (sacreBLEU's, BLEU with effective order).")


class EvalConfig(Section):
    """test.py reporting."""

    length_buckets: list[int] = Field(default_factory=lambda: [10, 20, 30, 40, 60], description="Edges of the "
                                      "source-length buckets (subword tokens) that test.py reports BLEU for: the "
                                      "default gives [1, 10), [10, 20), ..., [60, inf). Increasing, positive.")


class Config(Section):
    """A whole experiment. ``name`` defaults to the config file's stem."""

    name: str = Field("experiment", description="The run's name: training writes `runs/<name>_<date>_<time>/` and "
                      "links `runs/<name>_latest` to it. Defaults to the config file's name without `.yaml`.")
    seed: int = Field(1234, ge=0, lt=2**31, description="Random seed of tokenizer training, weight initialisation, "
                      "dropout, batch order and position-augmentation draws (process r of a multi-process run uses "
                      "seed + r).")
    data: DataConfig = Field(default_factory=DataConfig, description="The corpus, its filtering and batching.")
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig, description="The vocabulary.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The Transformer and its positional "
                               "encodings.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="Optimisation, schedule, validation and "
                               "stopping.")
    decode: DecodeConfig = Field(default_factory=DecodeConfig, description="Decoding defaults.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="test.py reporting.")


# ----------------------------------------------------------------------------------------------
# Building from dicts, with type checks


def _build(values: dict[str, Any]) -> Config:
    """A ``Config`` from a raw mapping; pydantic's errors become one ConfigError line naming the key."""
    if not isinstance(values, dict):
        raise ConfigError(f"the top level must be a mapping of sections, got {values!r}")
    try:
        return Config.model_validate(values)
    except ValidationError as e:
        raise config_error(e, Config, values) from None


def _check_vocabulary(t: TokenizerConfig) -> None:
    """A trained vocabulary must hold more than its reserved tokens (specials, and the 256 bytes of byte fallback)."""
    if t.type == "marian":
        return
    from tokenizer.joint import BYTE_TOKENS, SPECIAL_TOKENS

    reserved = len(SPECIAL_TOKENS) + (len(BYTE_TOKENS) if t.byte_fallback and t.type != "word" else 0)
    if t.vocab_size <= reserved:
        why = " (256 byte tokens with tokenizer.byte_fallback)" if t.byte_fallback and t.type != "word" else ""
        raise ConfigError(f"tokenizer.vocab_size: must be > {reserved}{why}, got {t.vocab_size}")


def _check_encodings(cfg: Config) -> None:
    """Each chosen positional encoding checks the settings it needs (its ``check`` hook, declared with it), once
    per key that chose it; one defined for causal self-attention only is refused in the encoder and cross-attention."""
    from models.positional import REGISTRY

    m = cfg.model
    for key in dict.fromkeys(m.pe_key(stack, "input") for stack in ("encoder", "decoder")):
        REGISTRY["input"][name_at(cfg, key)].check(cfg, key)
    places = [(m.pe_key("encoder", "attention"), "encoder"), (m.pe_key("decoder", "attention"), "decoder"),
              (CROSS_ATTENTION_PE_KEY, "cross")]
    for key, kind in places:
        name = name_at(cfg, key)
        cls = REGISTRY["attention"][name]
        if cls is not None and cls.causal_only and kind != "decoder":
            where = "the encoder" if kind == "encoder" else "cross-attention"
            raise ConfigError(f"{key}={name} puts it in {where}, but it is defined for causal (decoder) "
                              f"self-attention only: set model.decoder_pe.attention={name}")
    for key in dict.fromkeys(key for key, _ in places):
        cls = REGISTRY["attention"][name_at(cfg, key)]
        if cls is not None:
            cls.check(cfg, key)


def registry_choices() -> dict[str, list[str]]:
    """Allowed positional-encoding names per key, read from the registry in ``models.positional`` (a stack's own
    key may also be null: the shorthand then applies)."""
    from models.positional import names

    return {
        INPUT_PE_KEY: names("input"),
        ATTENTION_PE_KEY: names("attention"),
        CROSS_ATTENTION_PE_KEY: names("attention"),
        **{f"model.{stack}_pe.{level}": names(level) for stack in ("encoder", "decoder")
           for level in ("input", "attention")},
    }


def check_decode(d: DecodeConfig) -> None:
    """ConfigError, one line, for decoding settings that do not go together (nbest, sampling, MBR)."""
    if d.mbr == 1:
        raise ConfigError("decode.mbr: MBR needs at least 2 candidates (0: off)")
    if d.mbr:
        if not d.sample and d.mbr > d.beam:
            raise ConfigError(f"decode.mbr: {d.mbr} candidates from beam search need decode.beam >= {d.mbr} "
                              f"(it is {d.beam}): raise the beam, or sample them (--sample)")
        if d.sample and d.num_samples not in (1, d.mbr):
            raise ConfigError(f"decode.num_samples: with decode.mbr the candidates are decode.mbr={d.mbr} samples; "
                              f"leave num_samples at 1 (it is {d.num_samples})")
        if d.nbest > d.mbr:
            raise ConfigError(f"decode.nbest: {d.nbest} exceeds the decode.mbr={d.mbr} candidates")
    elif d.sample:
        if d.nbest > 1:
            raise ConfigError(f"decode.nbest: with decode.sample the outputs per sentence are decode.num_samples; "
                              f"leave nbest at 1 (it is {d.nbest})")
    elif d.nbest > d.beam:
        raise ConfigError(f"decode.nbest: {d.nbest} exceeds decode.beam={d.beam}")


def validate(cfg: Config) -> Config:
    """Cross-field checks that types alone cannot express."""
    for key, allowed in registry_choices().items():
        value = name_at(cfg, key)
        if value not in allowed and not (value is None and key.count(".") == 2):
            raise ConfigError(f"{key}: {value!r} is not one of: {', '.join(allowed)}")
    m, d = cfg.model, cfg.data
    if m.d_model % m.n_heads:
        raise ConfigError(f"model.d_model: {m.d_model} is not divisible by model.n_heads={m.n_heads}")
    check_settings(m)  # each encoding's settings section, by its own rules (e.g. model.rope.dim within the head)
    if cfg.train.cooldown and cfg.train.max_steps is None and cfg.train.max_target_tokens is None:
        raise ConfigError("train.cooldown: needs a step budget to end at: set train.max_steps or "
                          "train.max_target_tokens")
    if cfg.train.compile == "reduce-overhead" and not cfg.train.static_shapes:
        raise ConfigError("train.compile: reduce-overhead (CUDA graphs) needs train.static_shapes=true: a graph is "
                          "recorded per batch shape")
    if not all(0.0 <= b < 1.0 for b in cfg.train.betas):
        raise ConfigError(f"train.betas: each must be in [0, 1), got {cfg.train.betas}")
    check_decode(cfg.decode)
    for key, tokens in (("max_tokens", d.max_tokens), ("valid_max_tokens", d.valid_max_tokens)):
        if tokens is not None and tokens < d.max_len + 2:
            raise ConfigError(f"data.{key}: {tokens} cannot hold one sentence of data.max_len={d.max_len}")
    if d.source in ("wit3", "text") and not d.path:
        raise ConfigError(f"data.path: required when data.source is {d.source!r}")
    if cfg.tokenizer.type == "marian" and not cfg.tokenizer.path:
        raise ConfigError("tokenizer.path: required for a marian tokenizer (Hub id or local folder)")
    _check_vocabulary(cfg.tokenizer)
    if d.min_len > min(d.max_len, d.max_train_len or d.max_len):
        raise ConfigError(f"data.min_len: {d.min_len} exceeds the longest training pair allowed (data.max_len="
                          f"{d.max_len}, data.max_train_len={d.max_train_len}): no pair could be trained on")
    edges = cfg.eval.length_buckets
    if any(e < 1 for e in edges) or edges != sorted(set(edges)):
        raise ConfigError(f"eval.length_buckets: expected increasing positive token counts, got {edges}")
    if len(cfg.train.betas) != 2:
        raise ConfigError(f"train.betas: expected two numbers, got {cfg.train.betas}")
    _check_encodings(cfg)
    check_augmentation(cfg, REGISTRY)
    return cfg


#: libyaml's parser where PyYAML was built with it (the wheels are): the same documents and values as PyYAML's pure
#: Python SafeLoader, a run's config loaded 4.5x faster (its config.yaml, every key filled in, is read by every
#: command and by a study for each of its runs).
YAML_LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def yaml_load(text: str) -> Any:
    """``yaml.safe_load(text)``, with libyaml where available (``YAML_LOADER``)."""
    return yaml.load(text, Loader=YAML_LOADER)  # a safe loader: plain data only


def parse_override(item: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], value parsed as YAML, so 3 is int, true is bool, [1,2] a list)."""
    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. model.attention_pe=rope")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set {item!r}: empty key")
    try:
        value = yaml_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``--set`` overrides to a raw config dict (unknown keys are caught by ``_build``)."""
    for item in overrides:
        path, value = parse_override(item)
        node = raw
        for part in path[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item}: {part} is not a section")
            node = child
        node[path[-1]] = value
    return raw


def from_dict(raw: dict[str, Any], overrides: list[str] | None = None, warn: bool = True) -> Config:
    """The validated config of ``raw`` with ``overrides``; ``warn=False`` keeps ``check_effective``'s warnings
    (not its refusals) for a later load, e.g. a script checking its input before the work starts."""
    raw = apply_overrides(_deepcopy(raw), overrides or [])
    cfg = validate(_build(raw))
    check_effective(cfg, overrides or [], warn)
    return cfg


def _warmup_steps_unused(c: Config) -> str | None:
    if c.train.warmup_tokens is not None:
        return f"train.warmup_tokens={c.train.warmup_tokens} sets the warmup (add --set train.warmup_tokens=null to " \
               "count it in steps)"
    return "train.scheduler=constant has no warmup" if c.train.scheduler == "constant" else None


#: Keys that a ``--set`` may name but that only act under other settings, beside those the encodings and the
#: augmentation declare (``effect_rules``): (key, conflict, why it would be ignored, or None).
TRAIN_RULES: list[tuple[str, bool, Callable[[Config], str | None]]] = [
    ("train.warmup_steps", True, _warmup_steps_unused),
    ("train.warmup_tokens", False,
     lambda c: "train.scheduler=constant has no warmup" if c.train.scheduler == "constant" else None),
    ("train.checkpoint_every", False, lambda c: None if c.train.keep_checkpoints else
     "train.keep_checkpoints=0 keeps no periodic checkpoints"),
    ("train.amp_cpu", False, lambda c: "train.amp=none" if c.train.amp == "none" and c.train.amp_cpu else None),
]


def effect_rules() -> list[tuple[str, bool, Callable[[Config], str | None]]]:
    """Keys (or sections) that a ``--set`` may name but that only act under other settings: (key, conflict, why it
    would be ignored, or None). A conflict (two keys stating one thing) is refused; an inert key is reported. The
    training keys' rules are here; the encodings' (their settings sections and the keys they own) come from the
    registry as it is now, and the augmentation methods' from ``AugmentConfig``."""
    declared = [*encoding_effect_rules(REGISTRY), *AugmentConfig.effect_rules()]
    return [*TRAIN_RULES, *((key, False, why) for key, why in declared)]


def check_effective(cfg: Config, overrides: list[str], warn: bool = True) -> None:
    """A ``--set`` that would be silently ignored: refused in one line when it conflicts with another key
    (``train.warmup_steps`` under ``train.warmup_tokens``), else reported as a warning."""
    import logging

    rules = effect_rules()
    for item in overrides:
        path, value = parse_override(item)
        key = ".".join(path)
        if value is None:  # switching a setting off is never ignored
            continue
        for prefix, conflict, why in rules:
            if key != prefix and not key.startswith(prefix + "."):
                continue
            reason = why(cfg)
            if reason is None:
                continue
            if conflict:
                raise ConfigError(f"--set {item} would be ignored: {reason}")
            if warn:
                logging.getLogger("config").warning("--set %s has no effect: %s", item, reason)


def load_config(path: str | Path, overrides: list[str] | None = None, warn: bool = True) -> Config:
    """Load a YAML config; ``name`` defaults to the file's stem.

    A config may name a ``base`` (a path relative to its own folder): the base is loaded first (itself
    possibly with a base) and this file's keys override it, mappings merged key by key, lists and
    values replaced. So a family of configs is one base plus a few lines per variant.
    """
    path = Path(path)
    raw = _read_with_bases(path, [])
    raw.setdefault("name", path.stem)
    return from_dict(raw, overrides, warn)


def _read_yaml(path: Path) -> dict[str, Any]:
    if path.is_dir():
        raise ConfigError(f"{path} is a folder, not a config file")
    if path.exists() and not path.is_file():
        raise ConfigError(f"{path} is not a regular file (a device or a pipe), not a config file")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = yaml_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not a UTF-8 text file (byte {e.start})") from None
    except OSError as e:
        raise ConfigError(f"cannot read config {path}: {e.strerror or type(e).__name__}") from None
    except yaml.YAMLError as e:
        if "increasing flow level" in str(e) or "exceeded max depth" in str(e):  # libyaml's limit on nesting
            raise ConfigError(f"{path}: nested too deeply to be a config") from None
        raise ConfigError(f"{path}: invalid YAML ({str(e).splitlines()[0]})") from None
    except RecursionError:  # PyYAML's Python loader composes nodes recursively: thousands of nested [ or {
        raise ConfigError(f"{path}: nested too deeply to be a config") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    where = _self_reference(raw, "", {}, set())
    if where is not None:
        raise ConfigError(f"{path}: {where or 'the config'} refers to itself (a recursive YAML alias)")
    return raw


def _self_reference(value: Any, key: str, open_: dict[int, str], acyclic: set[int]) -> str | None:
    """The dotted key of the first mapping or list that contains itself (``&x [a, *x]``; "" for the whole
    document), else None. ``open_``: the enclosing nodes' ids and keys. YAML aliases may share one node many
    times; a node already found acyclic is not walked again, so this takes linear time."""
    if not isinstance(value, (dict, list)) or id(value) in acyclic:
        return None
    if id(value) in open_:
        return open_[id(value)]
    open_[id(value)] = key
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for k, v in items:
        sub = (f"{key}.{k}" if key else str(k)) if isinstance(value, dict) else key
        found = _self_reference(v, sub, open_, acyclic)
        if found is not None:
            return found
    del open_[id(value)]
    acyclic.add(id(value))
    return None


def _read_with_bases(path: Path, chain: list[Path]) -> dict[str, Any]:
    """``path``'s mapping over its ``base`` chain (the base's own ``name`` is not inherited)."""
    if path.resolve() in chain:
        names = " -> ".join(p.name for p in [*chain, path.resolve()])
        raise ConfigError(f"{chain[0]}: its base configs form a cycle ({names})")
    raw = _read_yaml(path)
    base = raw.pop("base", None)
    if base is None:
        return raw
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{path}: base must be the path of another config file, got {base!r}")
    base_path = path.parent / expand_env(base)
    if not base_path.is_file():
        raise ConfigError(f"{path}: base config not found: {base_path}")
    parent = _read_with_bases(base_path, [*chain, path.resolve()])
    parent.pop("name", None)
    return _merge(parent, raw)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on top of ``base``: mappings merged recursively; anything else replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def save_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML (atomically), its values literal: a ``${`` that expansion produced is
    saved as ``$${`` (``escape_env``), so loading the file gives back exactly ``cfg``."""
    from utils.io import atomic_write_text

    text = yaml.safe_dump(escape_env(cfg.to_dict()), sort_keys=False, allow_unicode=True)
    atomic_write_text(Path(path), text)


def _deepcopy(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _deepcopy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_deepcopy(v) for v in x]
    return x
