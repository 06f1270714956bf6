"""What a study reads from and writes to its runs: test.py's score files, cached attention statistics and the
validation curve, each through the run's :class:`utils.run.layout.RunDir`. Shared by bench/study.py (which scores)
and bench/study_report.py / bench/pilot_rule.py (which read), so neither imports the other."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from utils.run.layout import RunDir


def run_cfg(run: Path) -> Any:
    """The config a run trained with."""
    from utils.config import load_config

    return load_config(RunDir(run).config)


def eval_file(run: Path, split: str, beam: int, checkpoint: str, tag: str | None) -> Path:
    return RunDir(run).eval_file(split, checkpoint, beam, tag)


def file_tag(tag: str | None, max_sentences: int | None) -> str | None:
    """test.py's ``--tag`` for a (test variant, sample): a study scoring the first N sentences keeps its files
    apart from one scoring them all, also in a run two studies share."""
    return ".".join(x for x in (f"n{max_sentences}" if max_sentences else None, tag) if x) or None


def eval_current(path: Path, sentences: int, overrides: list[str], step: int) -> bool:
    """Whether test.py's scores at ``path`` exist and are what this study asks for: ``sentences`` scored
    under the inference ``overrides`` (a test variant whose settings changed is scored again) from the checkpoint
    of training step ``step`` (a run trained on after it was scored, or scores that do not say, are scored again)."""
    if not path.is_file():
        return False
    try:
        scores = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return (scores.get("n_sentences") == sentences and scores.get("overrides", []) == overrides
            and scores.get("step") == step)




def attention_file(run: Path, checkpoint: str, sentences: int) -> Path:
    return RunDir(run).attention_stats(checkpoint, sentences)


def read_attention(run: Path, checkpoint: str, sentences: int) -> dict[str, Any] | None:
    """The cached attention statistics of a run on its first ``sentences`` validation pairs, if computed."""
    out = attention_file(run, checkpoint, sentences)
    return json.loads(out.read_text()) if out.is_file() else None


def compute_attention(run: Path, checkpoint: str, sentences: int, step: int | None = None) -> dict[str, Any]:
    """Attention statistics of a run on its first ``sentences`` validation pairs (cached in the run, with the
    checkpoint's training step: computed again for another ``step``)."""
    cached = read_attention(run, checkpoint, sentences)
    if cached is not None and (step is None or cached.get("step") == step):
        return cached
    from data.sources import load_corpus
    from utils.figures.attention_stats import attention_statistics
    from utils.io import atomic_write_text
    from utils.run.load import load_run
    from utils.translation.translate import encode_sources

    loaded = load_run(RunDir(run).checkpoint(checkpoint), device="cpu")
    valid = load_corpus(loaded.cfg.data)["validation"]
    n = min(sentences, len(valid))
    limit = loaded.model.max_length
    src = encode_sources(loaded.tokenizer, list(valid["src"][:n]), limit, strict=False)
    tgt = loaded.tokenizer.encode_tgt(list(valid["tgt"][:n]))
    if limit is not None:
        tgt = [t[: limit - 1] for t in tgt]
    stats = attention_statistics(loaded.model, loaded.tokenizer.bos_id, list(zip(src, tgt, strict=True))).to_dict()
    stats["step"] = loaded.step
    atomic_write_text(attention_file(run, checkpoint, sentences), json.dumps(stats) + "\n")
    return stats


def valid_curve(run: Path) -> list[tuple[int, float]]:
    """Validation BLEU of a run against optimizer steps."""
    curve = RunDir(run).scalars("valid/bleu")
    if not curve:
        return []
    accumulate = run_cfg(run).train.accumulate  # TensorBoard steps are iterations; the budget counts updates
    return [(step // accumulate, value) for step, value in curve]
