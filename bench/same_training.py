"""Do two checkouts of the code train the same models? Each system of a study preset is trained, with the same
``train.py`` command, by both checkouts (each its own ``.venv``), one CPU thread per run and the two checkouts'
runs side by side; then every tensor of their last checkpoints (weights, EMA, optimizer and scheduler state) is
compared bit for bit, and so are the resolved configs (``config.yaml``): a key only the second (newer) checkout has
is listed apart (its default keeps the older behaviour), any other difference counts.

    python bench/same_training.py ../pilot-wt . --preset train-short-test-long --steps 12 --eval-every 6 \\
        --set train.cooldown=0.2 --set train.ema_decay=0.99 --out runs/same_training.json

A checkout is a folder holding ``train.py`` and ``.venv`` (``bench/worktree.sh``'s ``worktree`` makes one pinned
at a commit); the second is the newer one. Prints one row per system (identical, or the first values that differ, a
tensor with its largest difference) and exits 3 if any system differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from utils.cli import add_set_arg, run_main, set_flags  # noqa: E402
from utils.config import ConfigError  # noqa: E402

#: Exit status when the two checkouts do not train the same (1 is a crash, 2 a bad command line).
DIFFERS = 3
FIRST_ONLY, SECOND_ONLY = ": in the first only", ": in the second only"


def _bits(t: Any) -> Any:
    """A tensor's bits as integers of its element size (-0.0 and 0.0 differ, a NaN equals its own bits)."""
    import torch

    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return t.contiguous().view(ints[t.element_size()]) if t.is_floating_point() or t.is_complex() else t


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two checkpoint values differ: a tensor not the same bits (with its largest absolute difference), a
    number or string not the same, a key in the first or the second only. ``[]``: identical."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return [f"{path}: a tensor in one, {type(b if isinstance(a, torch.Tensor) else a).__name__} in the other"]
        if a.shape != b.shape or a.dtype != b.dtype:
            return [f"{path}: {tuple(a.shape)} {a.dtype} against {tuple(b.shape)} {b.dtype}"]
        if torch.equal(_bits(a), _bits(b)):
            return []
        gap = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else float("nan")
        return [f"{path}: differs (largest difference {gap:.3g})"]
    if isinstance(a, dict) and isinstance(b, dict):
        out = sorted([f"{path}/{k}{FIRST_ONLY}" for k in set(a) - set(b)] +
                     [f"{path}/{k}{SECOND_ONLY}" for k in set(b) - set(a)])
        for k in sorted(set(a) & set(b), key=str):
            out += differences(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} against {b!r}"]


def train_both(checkouts: list[Path], args: list[str], runs: Path) -> list[Path]:
    """``train.py ARGS`` by each checkout at once (one thread each), into ``runs/<i>``; the run folders."""
    from utils.study.runs import run_dirs

    procs = []
    for i, code in enumerate(checkouts):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        log = open(runs / f"{i}.log", "w", encoding="utf-8")  # noqa: SIM115 (closed once the process ends)
        procs.append((subprocess.Popen([str(code / ".venv" / "bin" / "python"), "train.py", "--runs",
                                        str(runs / str(i)), *args], cwd=code, env=env, stdout=log, stderr=log,
                                       stdin=subprocess.DEVNULL), log))
    codes = []
    for proc, log in procs:  # both waited for: none left writing into a folder about to be deleted
        codes.append(proc.wait())
        log.close()
    for i, code in enumerate(codes):
        if code != 0:
            tail = (runs / f"{i}.log").read_text(encoding="utf-8").strip().splitlines()[-1:]
            raise ConfigError(f"{checkouts[i]}: train.py failed (exit {code}): {' '.join(tail)}")
    return [run_dirs(runs / str(i))[-1] for i in range(len(checkouts))]


def compare(checkouts: list[Path], preset: str, labels: list[str] | None, sets: list[str], steps: int,
            eval_every: int, config: str | None = None) -> list[dict[str, Any]]:
    """Train each of the preset's systems (``labels``: those only; ``config``: instead of the preset's) with both
    checkouts; a row per system."""
    import yaml

    from utils.run.checkpoint import load_checkpoint
    from utils.run.layout import RunDir
    from utils.study.plan import budget_overrides
    from utils.study.presets import presets

    known = presets()
    if preset not in known:
        raise ConfigError(f"--preset {preset}: not a preset; presets: {', '.join(sorted(known))}")
    chosen = known[preset]
    variants = [v for v in chosen.variants if labels is None or v.label in labels]
    if labels is not None and (unknown := sorted(set(labels) - {v.label for v in chosen.variants})):
        raise ConfigError(f"--variants {','.join(unknown)}: not a variant of {preset}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="same_training-") as tmp:
        for v in variants:
            overrides = [*chosen.overrides, *sets, *v.overrides, "seed=1",
                         *budget_overrides(steps, None, eval_every)]
            runs = Path(tmp) / v.label
            runs.mkdir(parents=True)
            print(f"{v.label}: training {steps} steps with each checkout", flush=True)
            folders = train_both(checkouts, ["--config", config or chosen.config, *set_flags(overrides)], runs)
            configs = [yaml.safe_load(RunDir(f).config.read_text(encoding="utf-8")) for f in folders]
            ckpts = [load_checkpoint(RunDir(f).last) for f in folders]
            # A key only the second (newer) checkout has is a newer key (its default keeps the older behaviour, as
            # every run an older version wrote keeps loading): said, not a difference. A key the second lacks, or a
            # value both have and differ in, is a difference.
            in_config = differences(configs[0], configs[1], "config")
            newer = [d.removesuffix(SECOND_ONLY) for d in in_config if d.endswith(SECOND_ONLY)]
            found = ([d for d in in_config if not d.endswith(SECOND_ONLY)]
                     + differences(ckpts[0], ckpts[1], RunDir(folders[0]).last.name))
            tensors = sum(1 for _ in _tensors(ckpts[0]))
            rows.append({"system": v.label, "identical": not found, "tensors": tensors, "differences": found[:5],
                         "keys_in_second_only": newer, "overrides": overrides})
            print(f"  {'identical' if not found else 'DIFFERENT: ' + '; '.join(found[:3])} ({tensors} tensors"
                  + (f"; keys in the second config only: {', '.join(newer)}" if newer else "") + ")", flush=True)
    return rows


def _tensors(value: Any):
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for x in value.values():
            yield from _tensors(x)
    elif isinstance(value, (list, tuple)):
        for x in value:
            yield from _tensors(x)


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/same_training.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkouts", nargs=2, type=Path, metavar="CHECKOUT", help="two folders of the code")
    parser.add_argument("--preset", default="train-short-test-long", help="the study preset whose systems are trained")
    parser.add_argument("--variants", metavar="LABEL,...", help="only these of its systems")
    parser.add_argument("--config", help="the base config instead of the preset's")
    add_set_arg(parser, help="a config value of every run, after the preset's (repeatable)")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per run (default 12)")
    parser.add_argument("--eval-every", type=int, default=6, help="validation (and checkpoint) every N steps")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    for code in args.checkouts:
        if not (code / "train.py").is_file() or not (code / ".venv" / "bin" / "python").is_file():
            parser.error(f"{code}: not a checkout with its .venv (train.py and .venv/bin/python)")
    labels = [x.strip() for x in args.variants.split(",")] if args.variants else None
    commits = [subprocess.run(["git", "-C", str(c), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip() or "?" for c in args.checkouts]
    rows = compare([c.resolve() for c in args.checkouts], args.preset, labels, args.overrides, args.steps,
                   args.eval_every, args.config)
    same = all(r["identical"] for r in rows)
    print(f"{'identical' if same else 'NOT identical'}: {sum(r['identical'] for r in rows)} of {len(rows)} systems "
          f"train the same weights with {commits[0]} and {commits[1]} ({args.steps} steps)")
    if args.out:
        from utils.io import atomic_write_text

        atomic_write_text(args.out, json.dumps({"checkouts": [str(c) for c in args.checkouts], "commits": commits,
                                                "steps": args.steps, "eval_every": args.eval_every,
                                                "sets": args.overrides, "rows": rows}, indent=1) + "\n")
    return 0 if same else DIFFERS


if __name__ == "__main__":
    run_main(main)
