"""Load several runs (or checkpoints) as one ensemble (``models.ensemble.Ensemble``): every member with its own
config and weights, all with one tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from models.ensemble import Ensemble
from tokenizer import load_tokenizer
from utils.config import ConfigError, load_config
from utils.run.layout import RunDir, runs_in
from utils.run.load import LoadedRun, load_run, resolve_checkpoint


@dataclass
class LoadedEnsemble(LoadedRun):
    """An ensemble loaded for decoding: ``model`` is the ``Ensemble``; ``cfg``, ``tokenizer``, ``run_dir``,
    ``checkpoint`` and ``step`` are its first member's; ``members`` every member as loaded alone."""

    members: list[LoadedRun] = field(default_factory=list)

    def describe(self) -> list[dict[str, object]]:
        """Each member's run directory, checkpoint and step (what a score file records)."""
        return [{"run_dir": str(m.run_dir), "checkpoint": str(m.checkpoint), "step": m.step} for m in self.members]


def seed_runs(path: Path | str) -> list[Path] | None:
    """The runs of a study variant's folder (``runs/study_<name>/runs/<variant>``: one ``seed<k>/`` per seed, each
    holding one run and its ``*_latest`` link), in seed order: what decodes as the variant's ensemble. None when
    ``path`` is not such a folder; ConfigError (one line) for a study folder itself or a seed without one run."""
    folder = Path(path)
    if not folder.is_dir() or RunDir(folder).config.is_file():
        return None
    if (folder / "study.json").is_file() and (folder / "runs").is_dir():
        variants = sorted(p.name for p in (folder / "runs").iterdir() if p.is_dir())
        raise ConfigError(f"--model_path {folder}: a study folder; name one of its variants, whose seeds decode as "
                          f"an ensemble: {folder / 'runs'}/<variant> (one of {', '.join(variants) or 'none'})")
    seeds = sorted((p for p in folder.glob("seed*") if p.is_dir() and p.name[4:].isdigit()),
                   key=lambda p: int(p.name[4:]))
    if not seeds:
        return None
    runs = []
    for seed in seeds:
        found = runs_in(seed)
        if len(found) != 1:
            raise ConfigError(f"--model_path {folder}: {seed.name} holds {len(found)} runs, not one; give the runs "
                              "of the ensemble one by one")
        runs.append(found[0])
    return runs


def expand_model_paths(paths: Sequence[Path | str]) -> list[str]:
    """``--model_path`` values with each study variant's folder replaced by its seeds' runs (``seed_runs``)."""
    return [str(r) for p in paths for r in (seed_runs(p) or [p])]


def tokenizer_identity(model_path: Path | str) -> dict[str, object]:
    """What must be equal for two runs to tokenize alike: the saved tokenizer's meta.json (type, fingerprint of the
    vocabulary, size, special ids) and the run's ``tokenizer`` settings."""
    run_dir, _ = resolve_checkpoint(model_path)
    rd = RunDir(run_dir)
    return {"meta": load_tokenizer(rd.tokenizer).meta(), "settings": load_config(rd.config).tokenizer.to_dict()}


def load_ensemble(model_paths: Sequence[Path | str], config_path: Path | str | None = None,
                  overrides: list[str] | None = None, device: str = "auto",
                  average: int | None = None) -> LoadedRun | LoadedEnsemble:
    """One path: ``load_run`` of it. Several: each loaded by ``load_run`` (the same ``config_path``, ``overrides``,
    ``device`` and ``average``), decoded together as an ``Ensemble``. A member whose tokenizer differs from the first
    one's is refused before any weights are loaded (ConfigError, one line, naming it)."""
    paths = list(model_paths)
    if len(paths) == 1:
        return load_run(paths[0], config_path, overrides, device, average=average)
    first = tokenizer_identity(paths[0])
    for path in paths[1:]:
        other = tokenizer_identity(path)
        if other != first:
            what = "vocabulary" if other["meta"] != first["meta"] else "tokenizer settings"
            raise ConfigError(f"--model_path {path}: its tokenizer differs from that of {paths[0]} (its {what}); "
                              "the models of an ensemble must share one tokenizer")
    members = [load_run(path, config_path, overrides, device, average=average) for path in paths]
    head = members[0]
    model = Ensemble([m.model for m in members]).eval()
    return LoadedEnsemble(head.cfg, head.tokenizer, model, head.run_dir, head.checkpoint, head.step, members)
