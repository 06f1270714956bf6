"""This toolkit against Eole 0.6.4 through the real commands, on one machine, in one run; prints ratios.

    python bench/peers.py [--minutes 44] [--systems eole,ours,ours-defaults] [--work runs/peers]

Protocol (the same for both systems): bench train/valid (../shared/data/bench/fr-en), a joint 8k subword
vocabulary per system (ours: `tokenizers` BPE; Eole: SentencePiece BPE trained on the same text), d 256,
4 heads, 3+3 layers, FFN 1024, dropout 0.1, label smoothing 0.1, Adam(0.9, 0.98), inverse-sqrt schedule
with 1,000 warmup steps and peak LR 7e-4, shared embeddings, RoPE, the same wall-clock budget counted
from the first batch, no validation inside the budget, then beam 5 on the three bench test sets.

- ``ours``: ``train.py --config configs/bench_small_rope.yaml`` with the protocol's settings (batches of
  4,096 tokens as Eole's; bf16 autocast where the CPU has bf16 instructions, else fp32), then
  ``test.py``. ``ours-fp32``: the same in fp32.
- ``ours-defaults``: the config as users run it (its own batch size, schedule and evaluation), then
  ``test.py``. ``--variant "NAME: KEY=VALUE ..."`` (repeatable) adds a system ``ours-defaults+NAME``: the
  defaults with those ``--set`` overrides, to sweep the defaults at a wall-clock budget.
- ``eole``: ``eole build_vocab`` / ``eole train`` (stopped at the budget by bench/eole_runner.py) /
  ``InferenceEnginePY.infer_file``, in a virtual environment of its own (made on first use with
  ``eole==0.6.4`` and ``torch==2.13.0`` as a constraint).

Each system reports optimizer steps, target tokens/s, validation perplexity, peak resident memory of
its training process, and per test set sacreBLEU, chrF and beam-5 sentences/s (reading, tokenizing,
decoding and writing; model loading excluded). Our runs that kept periodic checkpoints
(``train.keep_checkpoints``) are also scored with their last 5 averaged (``test.py --average 5``).
``--ctranslate2`` adds a system ``NAME.ct2`` for each of our runs: the run exported to CTranslate2 (float32)
and decoded by ``inference.py --model_path EXPORT --beam 5`` (its training rows are "-": it is NAME's model).
Results go to WORK/<system>/result.json
(``--reuse`` keeps finished systems; ``--reuse --retime`` decodes again with each kept system without
training, so that every decoding speed comes from one run) and WORK/report.md. Run it alone on the
machine: timings are only comparable within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as bench/peers.py: the repository root first

from bench.common import ROOT, project_command, ratio  # noqa: E402
from bench.measure import CommandFailed, run_measured  # noqa: E402
from utils.host import cpu_has_native_bf16  # noqa: E402
from utils.run.checkpoint import periodic_checkpoints  # noqa: E402
from utils.run.layout import LAST, RunDir  # noqa: E402

TEST_SETS = ["test.tatoeba", "test.multi30k-2016", "test.iwslt-tst2010"]
CONFIG = "configs/bench_small_rope.yaml"
# The protocol, in our config keys (the bench config already has d 256 / 4 heads / 3+3 / FFN 1024 / RoPE).
PROTOCOL = [
    "data.max_tokens=4096",
    "model.dropout=0.1",
    "model.tie_embeddings=true",
    "train.lr=7.0e-4",
    "train.warmup_steps=1000",
    "train.warmup_tokens=null",  # the protocol counts warmup in steps, at a fixed peak lr
    "train.lr_batch_tokens=null",
    "train.scheduler=inverse_sqrt",
    "train.betas=[0.9,0.98]",
    "train.label_smoothing=0.1",
    "train.eval_every=100000000",  # validate once, at the end (Eole validates once too)
    "train.log_attention_every=0",
    "train.epochs=1000",
    "decode.beam=5",
]
SYSTEMS = {"eole", "ours", "ours-fp32", "ours-defaults"}
AVERAGE = 5  # our runs are also scored with their last 5 periodic checkpoints averaged, when they kept them


def shared_data() -> Path:
    return Path(os.environ.get("FR2EN_SHARED_DATA", ROOT.parent / "shared" / "data")).resolve()


# ---------------------------------------------------------------------------------------------- ours


def run_ours(work: Path, minutes: float, overrides: list[str], python: str) -> dict:
    runs = work / "runs"
    cmd = project_command("train.py", "--config", CONFIG, "--runs", runs,
                          overrides=[f"train.max_minutes={minutes}", *overrides], python=python)
    rss = run_measured(cmd, work / "train.log").peak_rss_mib
    log_text = (work / "train.log").read_text()
    run_dir = Path(next(ln.split("run directory: ", 1)[1] for ln in log_text.splitlines() if "run directory: " in ln))
    stats = RunDir(run_dir).summary()
    result = {**stats, "peak_rss_mb": rss, "run_dir": str(run_dir), "tests": {}}
    result.update(decode_ours(work, run_dir, python))
    return result


def decode_ours(work: Path, run_dir: Path, python: str, average: bool = True) -> dict:
    """``test.py --beam 5`` on the run (and, with ``average``, on its last checkpoints averaged where it kept them)."""
    cmd = project_command("test.py", "--model_path", run_dir, "--beam", "5", python=python)
    run_measured(cmd, work / "test.log")
    result: dict = {"tests": read_scores(run_dir, scored_checkpoint(run_dir))}
    kept = periodic_checkpoints(RunDir(run_dir).checkpoints)
    if average and len(kept) >= AVERAGE:  # the same run scored with its last checkpoints averaged
        run_measured(cmd + ["--average", str(AVERAGE)], work / "test_average.log")
        result["tests_average"] = read_scores(run_dir, RunDir(run_dir).average(kept[-AVERAGE:]).stem)
        result["averaged"] = [p.stem for p in kept[-AVERAGE:]]
    return result


def scored_checkpoint(run_dir: Path) -> str:
    """The checkpoint test.py scores for a run directory: its best (else its last), as a file stem."""
    best = RunDir(run_dir).best
    return best.stem if best.is_file() else LAST


def decode_ctranslate2(work: Path, run_dir: Path, python: str, data: Path) -> dict:
    """The run exported to CTranslate2 (float32), then ``inference.py --model_path EXPORT --beam 5 --input``
    on each test set: sentences/s as inference.py reports it (reading, tokenizing, decoding, writing; model
    loading excluded), sacreBLEU and chrF of its output."""
    export = work / "export"
    run_measured(project_command("inference.py", "--model_path", run_dir, "--export-ctranslate2", export,
                                 python=python), work / "export.log")
    bench = data / "bench" / "fr-en"
    result: dict = {"run_dir": str(run_dir), "hyp_dir": str(work), "tests": {}}
    for name in TEST_SETS:
        hyp, log = work / f"{name}.hyp", work / f"{name}.log"
        with open(hyp, "w", encoding="utf-8") as out, open(log, "w") as err:
            cmd = project_command("inference.py", "--model_path", export, "--beam", "5", "--input",
                                  bench / f"{name}.fr", python=python)
            code = subprocess.call(cmd, stdout=out, stderr=err, cwd=ROOT)
        lines = log.read_text(errors="replace").strip().splitlines()
        if code != 0 or not lines or not lines[-1].startswith("translated "):
            raise CommandFailed(f"inference.py on the CTranslate2 export failed (exit {code}), see {log}: "
                                + " | ".join(lines[-3:]))
        # "translated N sentences in Xs (Y sentences/s[, T threads])"
        speed = float(lines[-1].rsplit("(", 1)[1].split()[0])
        result["tests"][name] = score_hyps(bench, name, hyp, speed)
    return result


def score_hyps(bench: Path, name: str, hyp: Path, speed: float) -> dict[str, float]:
    """sacreBLEU and chrF of a hypotheses file against the test set's references, with its sentences/s."""
    from utils.translation.scoring import corpus_scores

    refs = (bench / f"{name}.en").read_text(encoding="utf-8").splitlines()
    scores = corpus_scores(hyp.read_text(encoding="utf-8").splitlines(), refs)
    return {"bleu": scores.bleu, "chrf": scores.chrf, "sentences_per_s": speed}


def read_scores(run_dir: Path, checkpoint: str) -> dict[str, dict[str, float]]:
    """BLEU, chrF and sentences/s per test set from test.py's JSON for ``checkpoint`` (a file stem), beam 5."""
    out = {}
    for name in TEST_SETS:
        entry = json.loads(RunDir(run_dir).eval_file(name, checkpoint, 5).read_text())
        out[name] = {k: entry[k] for k in ("bleu", "chrf", "sentences_per_s")}
    return out


# ---------------------------------------------------------------------------------------------- eole


def eole_python(venv: Path) -> str:
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"making Eole's virtual environment in {venv} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        constraint = venv / "constraints.txt"
        constraint.write_text("torch==2.13.0\n")
        subprocess.run([str(python), "-m", "pip", "install", "-q", "eole==0.6.4", "sentencepiece", "aiohttp",
                        "-c", str(constraint)], check=True)
    return str(python)


def eole_configs(work: Path, data: Path, budget_steps: int = 10_000_000) -> tuple[Path, Path]:
    """Our own Eole configs for the protocol: build_vocab and train."""
    import yaml

    bench = data / "bench" / "fr-en"
    common = {
        "save_data": str(work / "data"),
        "overwrite": True,
        "seed": 1234,
        "src_vocab": str(work / "vocab.shared"),
        "tgt_vocab": str(work / "vocab.shared"),
        "share_vocab": True,
        "src_vocab_size": 8000,
        "tgt_vocab_size": 8000,
        "data": {
            "corpus_1": {"path_src": str(bench / "train.fr"), "path_tgt": str(bench / "train.en")},
            "valid": {"path_src": str(bench / "valid.fr"), "path_tgt": str(bench / "valid.en")},
        },
        "transforms": ["sentencepiece", "filtertoolong"],
        "transforms_configs": {
            "sentencepiece": {"src_subword_model": str(work / "spm8k.model"),
                              "tgt_subword_model": str(work / "spm8k.model")},
            "filtertoolong": {"src_seq_length": 256, "tgt_seq_length": 256},
        },
    }
    vocab_cfg = work / "build_vocab.yaml"
    vocab_cfg.write_text(yaml.safe_dump({**common, "n_sample": -1}))
    peak_lr, warmup, d = 7e-4, 1000, 256
    train_cfg = work / "train.yaml"
    train_cfg.write_text(yaml.safe_dump({
        **common,
        "report_every": 50,
        "model": {
            "architecture": "transformer",
            "hidden_size": d,
            "heads": 4,
            "transformer_ff": 1024,
            "layers": 3,
            "share_decoder_embeddings": True,
            "share_embeddings": True,
            # rope_config must be explicit: eole 0.6.4's validator crashes filling in its default for Rotary
            "rope_config": {"rotary_interleave": True, "rotary_theta": 10000},
            # embeddings scaled by sqrt(d), as ours are (eole leaves them unscaled with Rotary by default)
            "embeddings": {"word_vec_size": d, "position_encoding_type": "Rotary", "normalize": True},
        },
        "training": {
            "model_path": str(work / "model"),
            "train_steps": budget_steps,
            "valid_steps": budget_steps,  # validated once, after the budget
            "save_checkpoint_steps": budget_steps,
            "batch_type": "tokens",
            "batch_size": 4096,
            "valid_batch_size": 4096,
            "compute_dtype": "fp32",
            "world_size": 1,
            "gpu_ranks": [],
            "normalization": "tokens",
            "optim": "adam",
            "adam_beta1": 0.9,
            "adam_beta2": 0.98,
            # noam: lr * d^-0.5 * min(step^-0.5, step * warmup^-1.5), whose peak (step = warmup) is 7e-4
            "learning_rate": peak_lr * d**0.5 * warmup**0.5,
            "decay_method": "noam",
            "warmup_steps": warmup,
            "max_grad_norm": 0,  # as in the recipe behind the reference numbers
            "label_smoothing": 0.1,
            "dropout": [0.1],
            "attention_dropout": [0.1],
            "param_init_method": "xavier_uniform",
            "num_workers": 0,
        },
    }))
    return vocab_cfg, train_cfg


def run_eole(work: Path, minutes: float, data: Path, venv: Path) -> dict:
    import sentencepiece as spm

    work.mkdir(parents=True, exist_ok=True)
    python = eole_python(venv)
    bench = data / "bench" / "fr-en"
    if not (work / "spm8k.model").exists():
        spm.SentencePieceTrainer.train(
            sentence_iterator=(line.rstrip("\n") for name in ("train.fr", "train.en")
                               for line in open(bench / name, encoding="utf-8")),
            model_prefix=str(work / "spm8k"), vocab_size=8000, model_type="bpe", character_coverage=1.0,
            unk_id=0, bos_id=1, eos_id=2, pad_id=3, minloglevel=2,
        )
    vocab_cfg, train_cfg = eole_configs(work, data)
    eole_bin = str(Path(python).parent / "eole")
    run_measured([eole_bin, "build_vocab", "-config", str(vocab_cfg), "-n_sample", "-1"], work / "build_vocab.log")
    runner = str(ROOT / "bench" / "eole_runner.py")
    stats_file = work / "train_stats.json"
    rss = run_measured([python, runner, "train", str(stats_file), str(minutes * 60), "-config", str(train_cfg)],
                          work / "train.log").peak_rss_mib
    stats = json.loads(stats_file.read_text())
    result = {"steps": stats["steps"], "target_tokens_per_s": stats["target_tokens_per_s"],
              "valid_ppl": stats["valid_ppl"], "valid_ppl_label_smoothed": stats["valid_ppl_label_smoothed"],
              "valid_label_smoothing": stats["valid_label_smoothing"], "peak_rss_mb": rss}
    result.update(decode_eole(work, python, data))
    return result


def decode_eole(work: Path, python: str, data: Path) -> dict:
    """Eole's ``InferenceEnginePY.infer_file`` (bench/eole_runner.py predict), beam 5, on each test set."""
    bench = data / "bench" / "fr-en"
    runner = str(ROOT / "bench" / "eole_runner.py")
    model = max((work / "model").glob("step_*"), key=lambda p: int(p.name.split("_")[1]), default=work / "model")
    result: dict = {"hyp_dir": str(work), "tests": {}}
    for name in TEST_SETS:
        hyp, pred_stats = work / f"{name}.hyp", work / f"{name}.predict.json"
        run_measured([python, runner, "predict", str(pred_stats), "-model_path", str(model), "-src",
                      str(bench / f"{name}.fr"), "-output", str(hyp), "-beam_size", "5", "-batch_size", "32",
                      "-batch_type", "sents", "-seed", "1234"], work / f"{name}.predict.log")
        result["tests"][name] = score_hyps(bench, name, hyp, json.loads(pred_stats.read_text())["sentences_per_s"])
    return result


# ---------------------------------------------------------------------------------------------- report


def add_output_lengths(work: Path, system: str, result: dict) -> None:
    """Words and lines of each test set's beam-5 output (read from the hypotheses files), so that decoding
    speed can also be compared per output word: a system that stops early looks fast in sentences/s."""
    for name in TEST_SETS:
        if "hyp_dir" in result:  # Eole, a CTranslate2 export
            hyp = Path(result["hyp_dir"]) / f"{name}.hyp"
        elif system == "eole":  # a result.json written before hyp_dir was recorded
            hyp = work / system / f"{name}.hyp"
        else:
            run_dir = Path(result["run_dir"])
            hyp = RunDir(run_dir).eval_file(name, scored_checkpoint(run_dir), 5, ext="hyp")
        lines = hyp.read_text(encoding="utf-8").splitlines()
        result["tests"][name].update(words=sum(len(line.split()) for line in lines), lines=len(lines))


def comparable(results: dict[str, dict]) -> dict[str, dict]:
    """``valid_ppl`` is the plain perplexity (no label smoothing) for every system. An Eole result recorded
    before the runner validated twice holds Eole's label-smoothed perplexity there: it moves to
    ``valid_ppl_label_smoothed``, and its plain perplexity is unknown."""
    out = dict(results)
    eole = results.get("eole")
    if eole is not None and "valid_label_smoothing" not in eole:
        out["eole"] = {**eole, "valid_ppl": None, "valid_ppl_label_smoothed": eole.get("valid_ppl")}
    return out


def table(results: dict[str, dict], minutes: float) -> str:
    results = comparable(results)
    order = ("ours", "ours-fp32", "ours-defaults")
    names = [n for n in order if n in results] + sorted(n for n in results if n not in (*order, "eole"))
    names += ["eole"] if "eole" in results else []
    rows = [("optimizer steps", "steps", "{:.0f}"), ("target tokens/s", "target_tokens_per_s", "{:.0f}"),
            ("valid perplexity (plain, no label smoothing)", "valid_ppl", "{:.2f}"),
            ("valid perplexity with label smoothing (Eole's validate)", "valid_ppl_label_smoothed", "{:.2f}"),
            ("peak RSS, MB", "peak_rss_mb", "{:.0f}")]
    head = "| " + f"{minutes:g} min, then beam 5 | " + " | ".join(names)
    ratio_names = [n for n in names if n != "eole"] if "eole" in results else []
    head += "".join(f" | {n}/eole" for n in ratio_names) + " |"
    lines = [head, "|" + "---|" * (1 + len(names) + len(ratio_names))]

    def row(label: str, get, fmt: str) -> None:  # "-" where a system has no such number (an export's training)
        vals = [get(results[n]) for n in names]
        cells = ["-" if v is None else fmt.format(v) for v in vals]
        if ratio_names:
            e = get(results["eole"])
            cells += [ratio(get(results[n]), e) for n in ratio_names]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    for label, key, fmt in rows:
        row(label, lambda r, k=key: r.get(k), fmt)
    for name in TEST_SETS:
        row(f"sacreBLEU {name}", lambda r, n=name: r["tests"][n]["bleu"], "{:.2f}")
    for name in TEST_SETS:
        row(f"chrF {name}", lambda r, n=name: r["tests"][n]["chrf"], "{:.2f}")
    for name in TEST_SETS:
        row(f"beam-5 sentences/s {name}", lambda r, n=name: r["tests"][n]["sentences_per_s"], "{:.1f}")
    for name in TEST_SETS:
        row(f"beam-5 output words per line {name}", lambda r, n=name: r["tests"][n]["words"] / r["tests"][n]["lines"],
            "{:.1f}")
    for name in TEST_SETS:
        row(f"beam-5 output words/s {name}",
            lambda r, n=name: r["tests"][n]["sentences_per_s"] * r["tests"][n]["words"] / r["tests"][n]["lines"],
            "{:.0f}")
    averaged = [n for n in names if "tests_average" in results[n]]
    for name in TEST_SETS if averaged else []:
        cells = [f"{results[n]['tests_average'][name]['bleu']:.2f}" if n in averaged else "-" for n in names]
        lines.append(f"| sacreBLEU {name}, last {AVERAGE} checkpoints averaged | " + " | ".join(cells)
                     + " | -" * len(ratio_names) + " |")
    if "eole" in results:
        lines.append("")
        for n in ratio_names:
            diffs = ", ".join(f"{results[n]['tests'][t]['bleu'] - results['eole']['tests'][t]['bleu']:+.2f}"
                              for t in TEST_SETS)
            lines.append(f"- {n}: BLEU minus Eole's on {', '.join(TEST_SETS)}: {diffs}")
    return "\n".join(lines)


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``"NAME: KEY=VALUE KEY=VALUE"`` -> (``ours-defaults+NAME``, overrides)."""
    name, sep, rest = text.partition(":")
    overrides = rest.split()
    if not sep or not name.strip() or not overrides or not all("=" in o for o in overrides):
        raise ValueError(f'--variant wants "NAME: KEY=VALUE ...", got {text!r}')
    return f"ours-defaults+{name.strip()}", overrides


def build_parser() -> argparse.ArgumentParser:
    """The command line of bench/peers.py."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=44.0, help="training budget per system (default 44)")
    parser.add_argument("--systems", default="ours,ours-defaults,eole",
                        help=f"comma-separated, from {', '.join(sorted(SYSTEMS))} (default ours,ours-defaults,eole)")
    parser.add_argument("--work", default="runs/peers", help="working folder (default runs/peers)")
    parser.add_argument("--variant", action="append", default=[], metavar='"NAME: KEY=VALUE ..."',
                        help="also run the defaults with these overrides, as system ours-defaults+NAME (repeatable)")
    parser.add_argument("--reuse", action="store_true", help="keep systems whose result.json exists")
    parser.add_argument("--retime", action="store_true",
                        help="with --reuse: decode the test sets again with every kept system (no training), so "
                             "that decoding speeds come from this one run")
    parser.add_argument("--ctranslate2", action="store_true",
                        help="also export each of our runs to CTranslate2 and decode with it: system NAME.ct2")
    parser.add_argument("--eole-venv", help="Eole's virtual environment (default WORK/eole-venv, made on first use)")
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if args.retime and not args.reuse:
        parser.error("--retime decodes again with the systems --reuse keeps: give both")
    if args.ctranslate2:
        try:
            import ctranslate2  # noqa: F401
        except ImportError:
            parser.error("--ctranslate2: pip install '.[export]' first")
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - SYSTEMS)
    if unknown:
        parser.error(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(sorted(SYSTEMS))}")
    try:
        variants = dict(parse_variant(v) for v in args.variant)
    except ValueError as e:
        parser.error(str(e))
    systems += list(variants)
    from utils.io import ensure_dir

    work = ensure_dir((ROOT / args.work).resolve(), "--work")
    data = shared_data()
    if not (data / "bench" / "fr-en" / "train.fr").is_file():
        parser.error(f"bench data not found under {data} (set FR2EN_SHARED_DATA)")
    results = {}
    for system in systems:
        out = work / system / "result.json"
        if args.reuse and out.is_file():
            results[system] = json.loads(out.read_text())
            if not args.retime:
                print(f"{system}: reusing {out}", flush=True)
                continue
            print(f"{system}: reusing the trained model, decoding the test sets again", flush=True)
            result = results[system]
            if system == "eole":
                venv = Path(args.eole_venv).resolve() if args.eole_venv else work / "eole-venv"
                result.update(decode_eole(work / system, eole_python(venv), data))
            else:
                result.update(decode_ours(work / system, Path(result["run_dir"]), sys.executable, average=False))
            out.write_text(json.dumps(result, indent=1) + "\n")
            continue
        print(f"{system}: training for {args.minutes:g} min, then beam 5 on {len(TEST_SETS)} test sets", flush=True)
        if system == "eole":
            venv = Path(args.eole_venv).resolve() if args.eole_venv else work / "eole-venv"
            result = run_eole(work / system, args.minutes, data, venv)
        else:
            # bf16 autocast where the CPU computes bf16 natively (it is several times slower elsewhere).
            bf16 = ["train.amp=bf16", "train.amp_cpu=true"] if cpu_has_native_bf16() else ["train.amp=none"]
            fp32 = ["train.amp=none"]
            overrides = {"ours": PROTOCOL + bf16, "ours-fp32": PROTOCOL + fp32, "ours-defaults": [],
                         **variants}[system]
            result = run_ours(work / system, args.minutes, overrides, sys.executable)
            result["precision"] = "bf16" if "train.amp=bf16" in overrides else "fp32"
        result["minutes"] = args.minutes
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        results[system] = result
    for system in [s for s in results if s != "eole"] if args.ctranslate2 else []:
        out = work / f"{system}.ct2" / "result.json"
        if args.reuse and not args.retime and out.is_file():
            print(f"{system}.ct2: reusing {out}", flush=True)
            results[f"{system}.ct2"] = json.loads(out.read_text())
            continue
        if "run_dir" not in results[system]:
            raise CommandFailed(f"{work / system / 'result.json'} names no run directory to export")
        print(f"{system}.ct2: exporting {system}'s run to CTranslate2, beam 5 on the test sets", flush=True)
        result = decode_ctranslate2(work / f"{system}.ct2", Path(results[system]["run_dir"]), sys.executable, data)
        out.write_text(json.dumps(result, indent=1) + "\n")
        results[f"{system}.ct2"] = result
    for system, result in results.items():
        add_output_lengths(work, system, result)
    report = table(results, args.minutes)
    (work / "report.md").write_text(report + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    from utils.cli import run_main

    run_main(main)
