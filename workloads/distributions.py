"""Length distributions: parsed from a spec dict, sampled as integer arrays from a numpy Generator.

Every distribution draws its `n` values sequentially from its own stream, so the first k of a
draw of n equal a draw of k (the request set is a stable prefix whatever `num_requests` is).
Values are rounded to integers, then clipped to [min, max].
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from cbbench.workloads.errors import WorkloadError

# Keys every distribution accepts besides its own.
VALUE_LIMIT = 2**40  # far tails (lognormal, zipf) stop here, well inside int64
COMMON_KEYS = ("dist", "min", "max")


@dataclass(frozen=True)
class Dist:
    """A sampled integer quantity: a base draw, rounded, clipped to [lo, hi]."""

    kind: str
    draw: Callable[[np.random.Generator, int], np.ndarray]
    lo: int | None = None
    hi: int | None = None

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        assert n >= 0
        values = np.rint(np.asarray(self.draw(rng, n), dtype=np.float64))
        if self.lo is not None or self.hi is not None:
            values = np.clip(values, self.lo, self.hi)
        return np.clip(values, -VALUE_LIMIT, VALUE_LIMIT).astype(np.int64)


def _num(d: dict, key: str, where: str, *, positive: bool = False, default=None) -> float:
    if key not in d:
        if default is not None:
            return default
        raise WorkloadError(f"{where}: '{d.get('dist')}' needs '{key}'")
    value = d[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise WorkloadError(f"{where}: '{key}' must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise WorkloadError(f"{where}: '{key}' must be > 0, got {value!r}")
    return float(value)


def _values(d: dict, where: str) -> np.ndarray:
    values = d.get("values")
    if not isinstance(values, (list, tuple)) or not values:
        raise WorkloadError(f"{where}: '{d.get('dist')}' needs a non-empty list 'values'")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise WorkloadError(f"{where}: 'values' must hold numbers, got {v!r}")
    return np.asarray(values, dtype=np.float64)


def _check_keys(d: dict, allowed: Sequence[str], where: str) -> None:
    for key in d:
        if key not in COMMON_KEYS and key not in allowed:
            kind = d.get("dist")
            raise WorkloadError(f"{where}: unknown key '{key}' for dist '{kind}'")


def _constant(d: dict, where: str):
    value = _num(d, "value", where)
    return lambda rng, n: np.full(n, value)


def _uniform(d: dict, where: str):
    lo, hi = _num(d, "min", where), _num(d, "max", where)  # parse_dist checks lo <= hi
    return lambda rng, n: rng.integers(int(lo), int(hi), size=n, endpoint=True)


def _normal(d: dict, where: str):
    mean, std = _num(d, "mean", where), _num(d, "std", where, positive=True)
    return lambda rng, n: rng.normal(mean, std, size=n)


def _lognormal(d: dict, where: str):
    sigma = _num(d, "sigma", where, positive=True)
    if ("median" in d) == ("mean" in d):
        raise WorkloadError(f"{where}: lognormal needs exactly one of 'median' or 'mean'")
    if "median" in d:
        mu = math.log(_num(d, "median", where, positive=True))
    else:  # mean = exp(mu + sigma^2 / 2)
        mu = math.log(_num(d, "mean", where, positive=True)) - sigma * sigma / 2
    return lambda rng, n: rng.lognormal(mu, sigma, size=n)


def _exponential(d: dict, where: str):
    mean = _num(d, "mean", where, positive=True)
    return lambda rng, n: rng.exponential(mean, size=n)


def _zipf(d: dict, where: str):
    a = _num(d, "a", where)
    if a <= 1:
        raise WorkloadError(f"{where}: zipf needs a > 1, got {a}")
    scale = _num(d, "scale", where, positive=True, default=1.0)
    return lambda rng, n: rng.zipf(a, size=n) * scale


def _empirical(d: dict, where: str):
    if "values" in d:
        if "trace" in d or "column" in d:
            raise WorkloadError(f"{where}: empirical takes 'values' or 'trace'+'column', not both")
        pool = _values(d, where)
    else:
        pool = _trace_column(d, where)
    return lambda rng, n: pool[rng.integers(0, len(pool), size=n)]


def _trace_column(d: dict, where: str) -> np.ndarray:
    """An empirical pool read from a trace: workloads.loader turns `trace` + `column` into
    `values` before parsing (this module reads no files, so it never imports the loader)."""
    trace, column = d.get("trace"), d.get("column")
    if not isinstance(trace, str) or column not in ("prompt", "output"):
        raise WorkloadError(
            f"{where}: empirical needs 'values', or 'trace' (preset or path) and "
            f'\'column\' = "prompt" or "output"'
        )
    raise WorkloadError(
        f"{where}: empirical trace '{trace}' is read when the spec is loaded "
        "(workloads.load_workload / build_from_spec), not by parse_dist"
    )


def _sequence(d: dict, where: str):
    values = _values(d, where)
    return lambda rng, n: np.resize(values, n)  # repeats the list in order; no randomness


def _mixture(d: dict, where: str):
    comps = d.get("components")
    if not isinstance(comps, list) or not comps:
        raise WorkloadError(f"{where}: mixture needs a non-empty list 'components'")
    weights, dists = [], []
    for i, comp in enumerate(comps):
        cwhere = f"{where}.components[{i}]"
        if not isinstance(comp, dict):
            raise WorkloadError(f"{cwhere}: must be a table, got {comp!r}")
        comp = dict(comp)
        weights.append(_num(comp, "weight", cwhere, positive=True))
        del comp["weight"]
        dists.append(parse_dist(comp, cwhere))
    p = np.asarray(weights) / sum(weights)

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        # One child stream per component, seeded first, so every stream draws n in order.
        children = [np.random.default_rng(s) for s in rng.integers(0, 2**63, size=len(dists))]
        pick = rng.choice(len(dists), size=n, p=p)
        drawn = np.stack(
            [dist.sample(child, n) for dist, child in zip(dists, children, strict=True)]
        )
        return drawn[pick, np.arange(n)]

    return draw


KINDS: dict[str, tuple[Callable, tuple[str, ...]]] = {
    "constant": (_constant, ("value",)),
    "uniform": (_uniform, ()),
    "normal": (_normal, ("mean", "std")),
    "lognormal": (_lognormal, ("median", "mean", "sigma")),
    "exponential": (_exponential, ("mean",)),
    "zipf": (_zipf, ("a", "scale")),
    "empirical": (_empirical, ("values", "trace", "column")),
    "sequence": (_sequence, ("values",)),
    "mixture": (_mixture, ("components",)),
}


def parse_dist(d: dict | int, where: str, default_min: int | None = 1) -> Dist:
    """Parse one distribution table; a bare integer means a constant. `where` names it in errors."""
    if isinstance(d, int) and not isinstance(d, bool):
        d = {"dist": "constant", "value": d}
    if not isinstance(d, dict):
        raise WorkloadError(f"{where}: expected a table with 'dist', got {d!r}")
    kind = d.get("dist")
    if kind not in KINDS:
        raise WorkloadError(f"{where}: unknown dist {kind!r} (one of {', '.join(KINDS)})")
    build, keys = KINDS[kind]
    _check_keys(d, keys, where)
    lo = int(_num(d, "min", where)) if "min" in d else default_min
    hi = int(_num(d, "max", where)) if "max" in d else None
    if lo is not None and hi is not None and lo > hi:
        raise WorkloadError(f"{where}: min {lo} > max {hi}")
    return Dist(kind=kind, draw=build(d, where), lo=lo, hi=hi)
