"""A study's analysis with seeds as blocks: the declared family of primary tests, exploratory tests, power.

Input: every system's per-seed corpus scores (``scores[system][split][decoder][metric] = [seed 1, ...]``)
and, where the hypotheses are at hand, each seed's per-sentence sufficient statistics
(``stats[system][split][decoder][metric] = [array [sentences, statistics], ...]``). Without statistics (a
study published before its hypotheses were) only the seed-level test can be computed, and nothing is
called resolved. utils/study/stats.py holds the tests; this module decides what is tested.

A quantity is a corpus score of one split (``score``), or a run's drop from a split to its length-shifted
``xK`` version (``drop``: score(x1 over the sentences the xK pairs join) - score(xK)), or a score over one
source-length bucket of a split (``bucket``, exploratory only).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from utils.study.decoders import DECODERS
from utils.study.stats import (
    blocked_anova,
    bootstrap_quantity,
    brevity_penalty,
    chrf_precision_recall,
    corpus_score,
    holm,
    paired_t,
    power,
    resolved,
    seeds_for_power,
    smallest_detectable,
    unit_stats,
)

METRICS = ("chrF", "BLEU")


@dataclass
class Family:
    """The primary analysis, declared before the runs: contrasts of ``systems`` (default: every system but
    the baseline) with the baseline on the ``metric`` of ``decoder``, for the score of each of ``splits``
    (default: every test split) and the drop of each ``drops`` entry (xK split -> its x1 split); Holm over
    all of them at ``alpha``; power for ``smallest_effect`` (in metric points)."""

    metric: str = "chrF"
    decoder: str = "beam5"
    splits: list[str] | None = None
    drops: dict[str, str] = field(default_factory=dict)
    systems: list[str] | None = None
    smallest_effect: float = 1.0
    alpha: float = 0.05
    declared: str = ("the default family of bench/study.py (every system against the baseline on every test split, "
                     "chrF, beam 5), not pre-registered for these runs")
    # system -> the study whose family already tests its contrast with this baseline on these runs (linked): one
    # family per contrast, so it is neither in this family nor tested again as exploratory on this endpoint.
    elsewhere: dict[str, str] = field(default_factory=dict)
    # A group-sequential design declared with the family (utils.study.looks.Design: looks, spending, futility);
    # None: a fixed design, one look.
    sequential: dict[str, Any] | None = None
    # A test-time decoding -> the trained system whose models it decodes (e.g. "rope+ntk" -> "rope"). Its rows and
    # its parent's share every model's noise, so no ANOVA holds both: the trained contrasts' ANOVA leaves the
    # decodings out, and each decoding's seed test is the contrast in the ANOVA where it takes its parent's place.
    # Empty: every system in one ANOVA (the studies published before this key).
    decodings: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def quantities(self, splits: list[str]) -> list[Quantity]:
        """The endpoint: the score on each of ``self.splits`` (default ``splits``), then each declared drop."""
        out = [Quantity("score", s, self.metric, self.decoder) for s in (self.splits or splits)]
        return out + [Quantity("drop", xk, self.metric, self.decoder, base_split=x1) for xk, x1 in self.drops.items()]


@dataclass(frozen=True)
class Quantity:
    kind: str  # score | drop | bucket
    split: str
    metric: str
    decoder: str
    base_split: str | None = None  # drop: the x1 split
    bucket: str | None = None  # bucket: its label

    @property
    def label(self) -> str:
        what = {"score": self.split, "drop": f"drop {self.base_split} → {self.split}",
                "bucket": f"{self.split} [{self.bucket}]"}[self.kind]
        return f"{self.metric} {what} ({'beam 5' if self.decoder == 'beam5' else self.decoder})"


def metric_for(name: str, lowercase: bool) -> Any:
    from sacrebleu.metrics import BLEU, CHRF

    return CHRF(lowercase=lowercase) if name == "chrF" else BLEU(lowercase=lowercase)


def shift_factor(split: str) -> int:
    from data.sources import length_shifted

    shifted = length_shifted(split)
    return shifted[1] if shifted else 1


class Analysis:
    """Per-seed values and bootstrap parts of any quantity, for every system."""

    def __init__(self, scores: dict[str, Any], stats: dict[str, Any] | None, baseline: str, samples: int,
                 lowercase: bool = False, buckets: dict[str, dict[str, list[int]]] | None = None) -> None:
        self.scores, self.stats, self.baseline, self.samples = scores, stats, baseline, samples
        self.lowercase = lowercase
        self.buckets = buckets or {}  # split -> bucket label -> sentence indices
        self._resampled: dict = {}  # each (system, quantity)'s bootstrap values, shared by its contrasts

    def seeds(self, system: str, q: Quantity) -> list[float]:
        if q.kind == "score":
            return list(self.scores[system][q.split][q.decoder][q.metric])
        metric = metric_for(q.metric, self.lowercase)
        return [sum(c * corpus_score(metric, part.sum(0)) for c, part in zip(coefs, parts, strict=True))
                for parts, coefs in (self._parts(system, q, k) for k in range(self._n_seeds(system)))]

    def _n_seeds(self, system: str) -> int:
        first = next(iter(self.scores[system].values()))
        return len(first[next(iter(first))]["chrF"])

    def _parts(self, system: str, q: Quantity, k: int) -> tuple[list[np.ndarray], list[float]]:
        if self.stats is None:
            raise ValueError(f"{q.label}: needs the hypotheses")
        own = self.stats[system][q.split][q.decoder][q.metric][k]
        if q.kind == "score":
            return [own], [1.0]
        if q.kind == "bucket":
            return [own[self.buckets[q.split][q.bucket]]], [1.0]
        factor = shift_factor(q.split) // shift_factor(q.base_split or q.split)
        x1 = self.stats[system][q.base_split][q.decoder][q.metric][k]
        # The xK pairs whose x1 sentences were scored (all of them, unless --max-sentences cut both splits alike).
        units = min(own.shape[0], x1.shape[0] // factor)
        return [unit_stats(x1, factor, units), own[:units]], [1.0, -1.0]

    def length(self, system: str, q: Quantity) -> dict[str, list[float]] | None:
        """Each seed's chrF precision and recall and BLEU brevity penalty of ``q`` (a score's, or a drop's x1 value
        minus its xK value), from the sentence statistics of both metrics; None without them."""
        if self.stats is None:
            return None
        chrf, bleu = metric_for("chrF", self.lowercase), replace(q, metric="BLEU")
        out: dict[str, list[float]] = {"chrf_precision": [], "chrf_recall": [], "bleu_bp": []}
        for k in range(self._n_seeds(system)):
            parts, coefs = self._parts(system, replace(q, metric="chrF"), k)
            pr = [chrf_precision_recall(chrf, part.sum(0)) for part in parts]
            out["chrf_precision"].append(sum(c * p for c, (p, _) in zip(coefs, pr, strict=True)))
            out["chrf_recall"].append(sum(c * r for c, (_, r) in zip(coefs, pr, strict=True)))
            parts, coefs = self._parts(system, bleu, k)
            out["bleu_bp"].append(sum(c * brevity_penalty(part.sum(0)) for c, part in zip(coefs, parts, strict=True)))
        return out

    def bootstrap(self, system: str, q: Quantity, base: str | None = None) -> dict[str, Any] | None:
        if self.stats is None:
            return None
        base = base or self.baseline
        seeds = range(self._n_seeds(system))
        sys_parts = [self._parts(system, q, k) for k in seeds]
        base_parts = [self._parts(base, q, k) for k in seeds]
        return bootstrap_quantity(metric_for(q.metric, self.lowercase), [p for p, _ in sys_parts],
                                  [p for p, _ in base_parts], sys_parts[0][1], self.samples,
                                  memo=self._resampled, keys=((system, q), (base, q)))

    def test(self, q: Quantity, systems: list[str], contrasts: list[str],
             base: str | None = None) -> tuple[list[dict[str, Any]], dict]:
        """The blocked ANOVA of ``q`` over ``systems`` (``base``, by default the baseline, included) and each
        contrast's tests against ``base``."""
        base = base or self.baseline
        values = {s: self.seeds(s, q) for s in [base, *[s for s in systems if s != base]]}
        anova, table = blocked_anova(values, base)
        rows = []
        for name in contrasts:
            c = anova[name]
            rows.append({"system": name, "against": base, "quantity": asdict(q), "label": q.label,
                         "delta": c.delta, "per_seed_delta": c.per_seed, "system_seeds": values[name],
                         "baseline_seeds": values[base], "seed_test": c.to_dict(),
                         "paired_t": paired_t(values[base], values[name]).to_dict(),
                         "bootstrap": self.bootstrap(name, q, base)})
        return rows, {"quantity": asdict(q), "label": q.label, **table}


def primary(analysis: Analysis, family: Family, systems: list[str], splits: list[str]) -> dict[str, Any]:
    """The declared family: every test, Holm-adjusted p-values of both tests, resolved or not, and power."""
    contrasts = [s for s in family.systems or [s for s in systems if s != analysis.baseline]
                 if s not in family.elsewhere]
    anova_systems = [analysis.baseline, *contrasts]
    trained = [s for s in anova_systems if s not in family.decodings]  # one ANOVA of models trained apart
    quantities = family.quantities(splits) if contrasts else []  # every contrast tested elsewhere: an empty family
    tests, tables = [], []
    for q in quantities:
        rows, table = analysis.test(q, trained, [c for c in contrasts if c in trained])
        by_system = {r["system"]: r for r in rows}
        for c in (c for c in contrasts if c not in trained):  # a decoding, in its parent's place
            parent = family.decodings[c]
            swapped = [c if s == parent else s for s in trained] + ([] if parent in trained else [c])
            (row,), own = analysis.test(q, swapped, [c])
            row["seed_test"]["anova"] = {k: own[k] for k in ("systems", "mse", "df", "residual_sd")} | {
                "replaces": parent}
            by_system[c] = row
        tests += [by_system[c] for c in contrasts]
        tables.append(table)
    _holm(tests, family.alpha)
    m = len(tests)
    level = family.alpha / m if m else family.alpha
    b = len(next(iter(tests))["per_seed_delta"]) if tests else 0
    pooled_mse = sum(t["mse"] * t["df"] for t in tables) / sum(t["df"] for t in tables) if tables else 0.0
    sd = math.sqrt(pooled_mse)
    df = tables[0]["df"] if tables else 0
    a = len(trained)
    power_info = {
        "smallest_effect": family.smallest_effect, "pooled_residual_sd": sd, "df": df, "seeds": b, "systems": a,
        "level": level, "level_note": f"Holm's first step, alpha/{m}: the level the strongest test must pass",
        "power_at_smallest_effect": power(family.smallest_effect, sd, b, df, level) if b > 1 and df else None,
        "detectable_at_80": smallest_detectable(sd, b, df, level) if b > 1 and df else None,
        "seeds_for_80_at_smallest_effect": (seeds_for_power(family.smallest_effect, sd, a, level)
                                            if b > 1 and df else None),
        "per_quantity": [{"label": t["label"], "residual_sd": t["residual_sd"], "seed_share": t["seed_share"],
                          "power_at_smallest_effect": power(family.smallest_effect, t["residual_sd"], b, t["df"],
                                                            level)} for t in tables],
    }
    design = _design(tests, family, b)
    length = [{"label": q.label, "quantity": asdict(q),
               "systems": {s: analysis.length(s, q) for s in anova_systems}}
              for q in quantities] if analysis.stats is not None else []
    return {"family": family.to_dict(), "size": m, "tests": tests, "anova": tables, "power": power_info,
            "design": design, "length": length,
            "resolved": sum(t["resolved"] for t in tests), "bootstrap_available": analysis.stats is not None}


def _design(tests: list[dict[str, Any]], family: Family, seeds: int) -> dict[str, Any]:
    """The look these seeds make under the family's design (fixed: one look). Under a group-sequential design each
    test records its boundary at this look (``sequential``), and the seed test rejects where it crossed it: a
    test is resolved when it crossed, its bootstrap rejects after Holm, and both agree in sign."""
    from utils.study.looks import Design, apply, fixed

    if family.sequential is None:
        return fixed(seeds, family.alpha)
    look, rows = apply(Design.from_dict(family.sequential), [t["seed_test"]["p_value"] for t in tests], seeds,
                       family.alpha, family.smallest_effect)
    for t, row in zip(tests, rows, strict=True):
        t["sequential"] = row
        b = t["bootstrap"]
        t["resolved"] = bool(row["crossed"] and b is not None and b["p_holm"] < family.alpha
                             and t["delta"] * b["delta"] > 0)
    return look


def _holm(tests: list[dict[str, Any]], alpha: float) -> None:
    seed_adj = holm([t["seed_test"]["p_value"] if t["seed_test"]["p_value"] is not None else 1.0 for t in tests])
    boots = [t["bootstrap"] for t in tests]
    boot_adj = holm([b["p_value"] for b in boots]) if all(boots) else [None] * len(tests)
    # The check beside the rule: each contrast's own paired t-test over seeds, Holm over the same family.
    for t, pp in zip(tests, holm([t["paired_t"]["p_value"] if t["paired_t"]["p_value"] is not None else 1.0
                                  for t in tests]), strict=True):
        t["paired_t"]["p_holm"] = pp
    for t, sp, bp in zip(tests, seed_adj, boot_adj, strict=True):
        t["seed_test"]["p_holm"] = sp
        if t["bootstrap"] is not None:
            t["bootstrap"]["p_holm"] = bp
        t["resolved"] = resolved(sp, bp, t["delta"], t["bootstrap"]["delta"] if t["bootstrap"] else 0.0, alpha)


def exploratory(analysis: Analysis, systems: list[str], splits: list[str], family: Family,
                bucket_from: int | None, own: dict[str, str] | None = None,
                declared: list[dict[str, Any]] | None = None,
                decoders: list[str] | None = None) -> list[dict[str, Any]]:
    """Everything else, unadjusted and labelled exploratory: each split's score in both metrics and decoders,
    every drop to a length-shifted split, the buckets of sentences longer than ``bucket_from`` tokens, and each
    test-time variant against its own trained models (``own``: system -> trained system; the same models, so
    the seed-level test is the paired t-test). A contrast already in the ``declared`` family is left out (one
    test per quantity: the family's). ``decoders``: those scored (default all of ``DECODERS``)."""
    decoders = list(decoders or DECODERS)
    contrasts = [s for s in systems if s != analysis.baseline]
    quantities = [Quantity("score", s, m, d) for d in decoders for m in METRICS for s in splits]
    if analysis.stats is not None:
        for split in splits:
            from data.sources import length_shifted

            shifted = length_shifted(split)
            if shifted and shifted[0] in splits:
                quantities += [Quantity("drop", split, m, d, base_split=shifted[0]) for d in decoders for m in METRICS]
        if bucket_from is not None:
            for split, buckets in analysis.buckets.items():
                for label, idx in buckets.items():
                    lo = int(label.split("-")[0].rstrip("+"))
                    if lo >= bucket_from and len(idx) >= 30:
                        quantities.append(Quantity("bucket", split, family.metric, family.decoder, bucket=label))
    primary_keys = {(t["system"], t["against"], t["label"]) for t in declared or []}
    primary_keys |= {(name, analysis.baseline, q.label) for name in family.elsewhere for q in family.quantities(splits)}
    rows = []
    for q in quantities:  # the ANOVA over every system; a declared contrast's tests are not computed again
        rest = [c for c in contrasts if (c, analysis.baseline, q.label) not in primary_keys]
        rows += analysis.test(q, systems, rest)[0] if rest else []
    for name, trained in (own or {}).items():
        for split in splits:
            q = Quantity("score", split, family.metric, family.decoder)
            if (name, trained, q.label) not in primary_keys:
                rows += analysis.test(q, [trained, name], [name], base=trained)[0]
    return rows


def attention_tests(attention: dict[str, list[float]], baseline: str, alpha: float) -> dict[str, Any]:
    """Paired t-tests over seeds of one attention statistic per system against the baseline, Holm-adjusted
    across the systems and statistics given (``attention["system|kind.stat"] = [seed values]``)."""
    keys = [k for k in attention if not k.startswith(baseline + "|")]
    out = {}
    for key in keys:
        stat = key.split("|", 1)[1]
        out[key] = paired_t(attention[f"{baseline}|{stat}"], attention[key]).to_dict()
    adj = holm([v["p_value"] if v["p_value"] is not None else 1.0 for v in out.values()])
    for v, p in zip(out.values(), adj, strict=True):
        v["p_holm"] = p
        v["significant"] = p < alpha
    return out
