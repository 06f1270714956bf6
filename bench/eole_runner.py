"""Runs inside Eole's own virtual environment (it imports eole, never this project): used by bench/peers.py.

    python eole_runner.py train STATS.json BUDGET_S -config train.yaml
    python eole_runner.py predict STATS.json -model_path DIR -src X.fr -output X.hyp -beam_size 5 ...

``train`` runs Eole's own ``eole train`` entry point, unchanged except that the trainer stops once
BUDGET_S seconds have passed since its first batch; then it saves the model, validates twice (as Eole does,
with the training loss's label smoothing, and with label smoothing 0: the plain perplexity every other
system reports) and writes steps, target tokens, target tokens/s, both validation perplexities and peak RSS
to STATS.json.
``predict`` times ``InferenceEnginePY.infer_file`` (read, SentencePiece, beam search, write) apart from
model loading and writes sentences/s to STATS.json.
"""

from __future__ import annotations

import json
import resource
import sys
import time


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class BudgetSpent(Exception):
    """Raised from inside the training loop once the wall-clock budget is used."""


def validate_twice(trainer, valid_iter) -> dict:
    """Eole's ``Trainer.validate`` keeps the training loss's label smoothing, so its perplexity is not the
    plain perplexity every other system reports: validate once as Eole does and once with label smoothing 0
    (restored after), and record both. ``valid_ppl`` is the plain one."""
    criterion = trainer.valid_loss.criterion
    smoothing = float(criterion.label_smoothing)
    smoothed = trainer.validate(valid_iter, moving_average=trainer.moving_average)
    criterion.label_smoothing = 0.0
    try:
        plain = trainer.validate(valid_iter, moving_average=trainer.moving_average)
    finally:
        criterion.label_smoothing = smoothing
    return {"valid_ppl": float(plain.ppl()), "valid_accuracy": float(plain.accuracy()),
            "valid_ppl_label_smoothed": float(smoothed.ppl()), "valid_label_smoothing": smoothing}


def train(stats_path: str, budget_s: float, argv: list[str]) -> None:
    import eole.trainer
    from eole.bin.main import main

    original_train = eole.trainer.Trainer.train
    record: dict = {"budget_s": budget_s}

    def timed_train(self, train_iter, train_steps, save_checkpoint_steps=5000, valid_iter=None, valid_steps=10000):
        step_fn = self._train_step
        clock = {"start": None}
        totals = {}

        def step(batches, normalization, total_stats, report_stats, step=0):
            if clock["start"] is None:
                clock["start"] = time.perf_counter()
            step_fn(batches, normalization, total_stats, report_stats, step=step)
            totals["stats"] = total_stats
            if time.perf_counter() - clock["start"] >= budget_s:
                raise BudgetSpent

        self._train_step = step
        try:
            return original_train(self, train_iter, train_steps, save_checkpoint_steps, valid_iter, valid_steps)
        except BudgetSpent:
            elapsed = time.perf_counter() - clock["start"]
            stats = totals["stats"]
            steps = self.optim.training_step - 1  # the optimizer counts the next step
            record.update(steps=steps, train_seconds=elapsed, target_tokens=int(stats.n_tokens),
                          target_tokens_per_s=stats.n_tokens / elapsed)
            self.model_saver.save(steps, moving_average=self.moving_average)
            record.update(validate_twice(self, valid_iter))
            return stats

    eole.trainer.Trainer.train = timed_train
    sys.argv = ["eole", "train", *argv]
    main()
    record["peak_rss_mb"] = peak_rss_mb()
    if "steps" not in record:
        raise SystemExit("eole stopped before the budget was spent (train_steps too small?)")
    print("EOLE TRAIN", json.dumps(record))
    with open(stats_path, "w") as f:
        json.dump(record, f, indent=1)


def predict(stats_path: str, argv: list[str]) -> None:
    import argparse

    from eole.bin.run.predict import Predict
    from eole.inference_engine import InferenceEnginePY
    from eole.utils.misc import set_random_seed

    parser = argparse.ArgumentParser()
    Predict.add_args(parser)
    config = Predict.build_config(parser.parse_args(argv))
    set_random_seed(config.seed, False)
    t0 = time.perf_counter()
    engine = InferenceEnginePY(config)
    t1 = time.perf_counter()
    engine.infer_file()
    t2 = time.perf_counter()
    engine.terminate()
    with open(config.src, encoding="utf-8") as f:
        n = sum(1 for _ in f)
    record = dict(src=config.src, sentences=n, load_seconds=t1 - t0, seconds=t2 - t1, sentences_per_s=n / (t2 - t1),
                  beam=config.beam_size, batch_size=config.batch_size, peak_rss_mb=peak_rss_mb())
    print("EOLE PREDICT", json.dumps(record))
    with open(stats_path, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
    import torch

    torch.set_num_threads(int(__import__("os").environ.get("EOLE_THREADS", torch.get_num_threads())))
    command, stats = sys.argv[1], sys.argv[2]
    if command == "train":
        train(stats, float(sys.argv[3]), sys.argv[4:])
    elif command == "predict":
        predict(stats, sys.argv[3:])
    else:
        raise SystemExit(f"unknown command {command!r}: train or predict")
