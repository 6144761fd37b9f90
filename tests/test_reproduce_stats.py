"""The intervals of `cbbench reproduce` and the verdicts drawn from them, on constructed
intervals: holds only inside the tolerance, does not hold only outside, else not resolved."""

from __future__ import annotations

import math
import statistics

import pytest
from cbbench.harness.studies import reproduce_report as rr
from cbbench.harness.studies import reproduce_stats as rs


def interval(mean: float, hw: float, n: int = 5) -> rs.Interval:
    return rs.Interval(mean, hw, n)


def test_t_interval_matches_the_textbook_formula():
    values = [3.1, 3.3, 3.2, 3.5, 3.4]
    iv = rs.t_interval(values)
    sd = statistics.stdev(values)
    assert iv.n == 5 and iv.mean == pytest.approx(3.3)
    assert iv.half_width == pytest.approx(2.776 * sd / math.sqrt(5))
    assert iv.lo == pytest.approx(3.3 - iv.half_width) and iv.hi == pytest.approx(3.3 + iv.half_width)
    # identical replicates (a deterministic simulator, constant lengths): zero width
    same = rs.t_interval([0.97] * 4)
    assert same.half_width == 0 and same.lo == same.hi == pytest.approx(0.97)
    one = rs.t_interval([2.0])
    assert not one.resolved and math.isnan(one.lo) and "no interval" in one.text()
    # the unit sits on the number, never after the note ("3.09 (1 replicate, no interval)x")
    assert one.text(unit="x").endswith("x (1 replicate, no interval)")
    assert rs.t95(1) == pytest.approx(12.706) and rs.t95(100) == 1.96


def test_band_verdict_each_case():
    # tolerance [0.95, 1.05]
    assert rs.band_verdict(interval(1.00, 0.03), 0.95, 1.05) == "holds"
    assert rs.band_verdict(interval(0.97, 0.0), 0.95, 1.05) == "holds"
    assert rs.band_verdict(interval(1.20, 0.10), 0.95, 1.05) == "does not hold"
    assert rs.band_verdict(interval(0.80, 0.10), 0.95, 1.05) == "does not hold"
    # the old table's uniform row: 0.97 ± 0.64 neither inside nor outside
    assert rs.band_verdict(interval(0.97, 0.64, 2), 0.95, 1.05) == "not resolved with 2 replicates"
    # touching an edge from inside holds; straddling it does not resolve
    assert rs.band_verdict(interval(1.00, 0.05), 0.95, 1.05) == "holds"
    assert rs.band_verdict(interval(1.04, 0.02), 0.95, 1.05) == "not resolved with 5 replicates"
    # a point estimate inside the band decides nothing without an interval
    assert rs.band_verdict(rs.t_interval([1.0]), 0.95, 1.05) == "not resolved with 1 replicate"


def test_ratio_verdict_says_where_the_interval_lies():
    assert rs.ratio_verdict(interval(2.40, 0.1), 2.38, 0.15) == "holds"
    v = rs.ratio_verdict(interval(3.30, 0.1), 2.38, 0.15)
    assert v.startswith("does not hold: larger, 134%-143% of 2.38x")
    v = rs.ratio_verdict(interval(4.0, 0.2), 85 / 15, 0.15)
    assert v.startswith("does not hold: smaller")
    assert rs.ratio_verdict(interval(2.94, 1.59), 2.38, 0.15) == "not resolved with 5 replicates"


def test_order_verdict_each_case():
    u, m, h = interval(1.0, 0.01), interval(3.3, 0.1), interval(4.0, 0.1)
    assert rs.order_verdict([u, m, h]) == "holds"
    # the old table: mixed 2.94 ± 1.59 and highly mixed 3.84 ± 0.80 overlap
    old = [interval(0.97, 0.64, 2), interval(2.94, 1.59, 2), interval(3.84, 0.80, 2)]
    assert rs.order_verdict(old) == "not resolved with 2 replicates"
    # one pair apart in the wrong order: does not hold, whatever the other pair does
    assert rs.order_verdict([u, interval(4.5, 0.1), h]) == "does not hold"
    assert rs.order_verdict([interval(3.5, 0.6), m, h]) == "not resolved with 5 replicates"
    assert rs.order_verdict([u, rs.t_interval([3.3]), h]) == "not resolved with 1 replicate"


def _rows(gains: dict[str, tuple[float, float]], n: int = 5) -> dict:
    return {
        w: {"workload": w, "gain_req_s": interval(g, hw, n).to_json()}
        for w, (g, hw) in gains.items()
    }


def test_claims_of_the_report_follow_the_intervals():
    """The report's claims (printed lines, reproduce.json) from constructed rows."""
    rows = _rows({"uniform": (0.99, 0.01), "mixed": (3.30, 0.10), "heavy-mixed": (4.00, 0.15)})
    c = rr.claims(rows)
    assert c["uniform within 5% of 1.0"] == "holds"
    assert c["ordering uniform < mixed < highly mixed"] == "holds"
    assert c["uniform gain within 15% of the seed's 1.00x"] == "holds"
    assert c["mixed gain within 15% of the seed's 2.38x"].startswith("does not hold: larger")
    assert c["heavy-mixed gain within 15% of the seed's 5.67x"].startswith("does not hold: smaller")
    wide = _rows({"uniform": (0.97, 0.64), "mixed": (2.94, 1.59), "heavy-mixed": (3.84, 0.8)}, 2)
    c = rr.claims(wide)
    assert c["uniform within 5% of 1.0"] == "not resolved with 2 replicates"
    assert c["ordering uniform < mixed < highly mixed"] == "not resolved with 2 replicates"
    assert c["mixed gain within 15% of the seed's 2.38x"] == "not resolved with 2 replicates"
    far = _rows({"uniform": (1.20, 0.05), "mixed": (1.10, 0.02), "heavy-mixed": (4.0, 0.1)})
    c = rr.claims(far)
    assert c["uniform within 5% of 1.0"] == "does not hold"
    assert c["ordering uniform < mixed < highly mixed"] == "does not hold"
    line = rr.verdicts(far, None)[0]
    assert line.startswith("simulated (5 replicates, 95 % t-intervals): uniform 1.20 ± 0.05x")
    assert "uniform within 5% of 1.0: does not hold" in line
