"""A study's declared design applied to its family at the look its seeds make: fixed (one look) or group-sequential.

A family may declare, before its first run, a group-sequential design (``family["sequential"]``)::

    {"looks": [6, 12, 18, 24], "spending": "obf", "futility": true, "beta": 0.2, "residual_sd": 1.3}

``looks``: the seeds per system at each look, the last the most the study trains; ``spending``: Lan-DeMets
O'Brien-Fleming type (``obf``) or Pocock type (``pocock``), utils/study/sequential.py; ``futility``: also declare
futility (non-binding, beta spent as ``spending`` says), which needs ``residual_sd``, the planning value of the
seed test's pooled residual SD (in the metric's units), with the family's smallest effect; the family's ``alpha``
is the design's. A report at ``n`` seeds per system is the look ``n`` makes: the planned looks below ``n`` are
counted as taken (conservative where one was skipped), and ``n`` itself is a look, planned or not (Lan-DeMets
spending allows an unplanned one). A look does not know of an unplanned look taken before it (nothing records
which looks were taken), so its boundaries spend as if there had been none: a study that keeps its error rate
reports only at its planned looks, and decodes between them.

The family's seed tests are tested with Holm's step-down, each step's boundary the design's at that step's level
(alpha / (M - j + 1) for the j-th smallest p of M; Maurer & Bretz 2013, group-sequential Holm): the j-th smallest
seed-test p crosses when it is at most the nominal p of its step's z boundary at this look and every smaller one
crossed. A boundary is on the z scale and the seed test is a t-test: its p-value is compared with the boundary's
nominal p (Jennison & Turnbull 2000, section 3.8). Futility is declared where the p-value's z is below the
futility boundary of its step's level.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from utils.schema import ConfigError
from utils.study.sequential import efficacy_bounds, futility_bounds, nominal_p, spent

SPENDING_NAMES = {"obf": "O'Brien-Fleming type", "pocock": "Pocock type"}


@dataclass(frozen=True)
class Design:
    """A group-sequential design: ``looks`` (seeds per system at each look), ``spending``, and futility."""

    looks: tuple[int, ...]
    spending: str = "obf"
    futility: bool = False
    beta: float = 0.2
    residual_sd: float | None = None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Design:
        """The design a family declares; ConfigError, one line, for an unknown key or a value out of range."""
        known = {"looks", "spending", "futility", "beta", "residual_sd"}
        if unknown := sorted(set(raw) - known):
            raise ConfigError(f"family.sequential: unknown key {unknown[0]!r} (keys: {', '.join(sorted(known))})")
        looks = raw.get("looks")
        if (not isinstance(looks, (list, tuple)) or not looks
                or any(not isinstance(n, int) or isinstance(n, bool) for n in looks)
                or looks[0] < 2 or list(looks) != sorted(set(looks))):
            raise ConfigError(f"family.sequential.looks: {looks!r}: increasing seed counts, each at least 2 "
                              "(a seed test needs two), e.g. [6, 12, 18, 24]")
        spending, futility = raw.get("spending", "obf"), raw.get("futility", False)
        if not isinstance(spending, str) or spending not in SPENDING_NAMES:
            raise ConfigError(f"family.sequential.spending: {spending!r} is not one of: obf, pocock")
        if not isinstance(futility, bool):
            raise ConfigError(f"family.sequential.futility: {futility!r} is not true or false")
        for key in ("beta", "residual_sd"):
            value = raw.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ConfigError(f"family.sequential.{key}: {value!r} is not a number")
        design = cls(tuple(looks), spending, futility, float(raw.get("beta", 0.2)),
                     None if raw.get("residual_sd") is None else float(raw["residual_sd"]))
        if design.spending not in SPENDING_NAMES:
            raise ConfigError(f"family.sequential.spending: {design.spending!r} is not one of: obf, pocock")
        if not 0 < design.beta < 1:
            raise ConfigError(f"family.sequential.beta: {design.beta} is not within (0, 1)")
        sd = design.residual_sd
        if design.futility and not (sd is not None and 0 < sd < math.inf):
            raise ConfigError("family.sequential.futility needs residual_sd > 0: the planning value of the seed "
                              "test's pooled residual SD, from which the futility boundaries follow")
        return design

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "looks": list(self.looks)}


def look_fractions(design: Design, seeds: int) -> list[float]:
    """The information fractions of the looks taken by ``seeds`` seeds per system: the planned looks below it, then
    ``seeds``; ConfigError, one line, past the design's last look."""
    last = design.looks[-1]
    if seeds > last:
        raise ConfigError(f"{seeds} seeds per system: past the design's last look at {last} (looks "
                          f"{', '.join(map(str, design.looks))}); the design does not cover them")
    return [n / last for n in [*(n for n in design.looks if n < seeds), seeds]]


@functools.lru_cache(maxsize=256)
def _bounds(fractions: tuple[float, ...], look: int, level: float, spending: str, futility: bool, beta: float,
            drift: float) -> tuple[float, float | None]:
    """The efficacy and (or None) futility z boundary at look ``look`` (0-based) of ``fractions`` (ending at 1: the
    looks still planned after it; a boundary depends on the looks before it only), for a test at ``level``."""
    c = efficacy_bounds(fractions, level, spending)  # type: ignore[arg-type]
    a = futility_bounds(fractions, c, drift, beta, spending)[look] if futility else None  # type: ignore[arg-type]
    return c[look], a


def fixed(seeds: int, alpha: float) -> dict[str, Any]:
    """The design of a study that declares none: one look, the whole alpha spent at it."""
    return {"kind": "fixed", "look": 1, "of": 1, "seeds": seeds, "alpha": alpha, "alpha_spent": alpha}


def apply(design: Design, seed_p: Sequence[float | None], seeds: int, alpha: float,
          smallest_effect: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The look ``seeds`` seeds per system make, and for each test (its unadjusted seed-test p-value, in
    ``seed_p``'s order) its Holm step's level, z boundary and nominal p at this look, whether it crossed, and
    (with futility declared) its futility boundary and whether futility is declared."""
    from scipy import stats

    fractions = look_fractions(design, seeds)
    plan = tuple([*fractions, *(n / design.looks[-1] for n in design.looks if n > seeds)])
    m = len(seed_p)
    drift = 0.0
    if design.futility:  # the expected z at the last look under the smallest effect (the paired difference's SD)
        drift = smallest_effect / (float(design.residual_sd) * math.sqrt(2)) * math.sqrt(design.looks[-1])
    order = sorted(range(m), key=lambda i: 1.0 if seed_p[i] is None else seed_p[i])
    out: list[dict[str, Any]] = [{} for _ in range(m)]
    crossing = True
    for j, i in enumerate(order):
        level = alpha / (m - j)
        c, a = _bounds(plan, len(fractions) - 1, level, design.spending, design.futility, design.beta, drift)
        p = 1.0 if seed_p[i] is None else float(seed_p[i])  # type: ignore[arg-type]
        crossing = crossing and p <= nominal_p([c])[0]
        z = float(stats.norm.isf(p / 2)) if p > 0 else math.inf
        row = {"step": j + 1, "level": level, "boundary_z": c, "boundary_p": nominal_p([c])[0], "crossed": crossing}
        if a is not None:
            row |= {"futility_z": a, "futility_p": nominal_p([a])[0], "futility": not crossing and z < a}
        out[i] = row
    look = {"kind": "group-sequential", **design.to_dict(), "look": len(fractions), "of": len(design.looks),
            "seeds": seeds, "planned": seeds in design.looks, "information": fractions[-1], "alpha": alpha,
            "alpha_spent": spent(fractions[-1], alpha, design.spending),  # type: ignore[arg-type]
            "alpha_spent_first_step": spent(fractions[-1], alpha / m, design.spending) if m else None}  # type: ignore[arg-type]
    return look, out


def settled(primaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The declared stopping rule of a group-sequential study over the looks taken so far (``results.json``'s
    ``primary`` of each, in order): a test is settled once it was resolved at some look (it stays resolved) or has
    crossed its futility boundary at the latest look; the study stops when every test is settled, or at its last
    planned look. Returns ``{"stop": bool, "why": str, "resolved": [...], "futile": [...], "open": [...]}``, each
    test named ``system: quantity``."""
    if not primaries:
        raise ConfigError("no look taken yet: score the study at its first look")
    last = primaries[-1]
    design = last.get("design") or {}
    if design.get("kind") != "group-sequential":
        raise ConfigError("the study declares no group-sequential design (its family has no 'sequential')")
    def name(t: Mapping[str, Any]) -> str:
        return f"{t['system']}: {t['label']}"

    keys = [name(t) for t in last["tests"]]
    for earlier in primaries[:-1]:
        if [name(t) for t in earlier["tests"]] != keys:
            raise ConfigError("the looks test different families: each look must score the same family")
    resolved = {name(t) for p in primaries for t in p["tests"] if t["resolved"]}
    futile = {name(t) for t in last["tests"] if t.get("sequential", {}).get("futility") and name(t) not in resolved}
    still = [k for k in keys if k not in resolved and k not in futile]
    at_end = design["look"] >= design["of"]
    why = ("every test is resolved or futile" if not still else
           f"the last planned look ({design['seeds']} seeds per system)" if at_end else
           f"{len(still)} of {len(keys)} tests are open at look {design['look']} of {design['of']}")
    return {"stop": not still or at_end, "why": why, "resolved": [k for k in keys if k in resolved],
            "futile": [k for k in keys if k in futile], "open": still}
