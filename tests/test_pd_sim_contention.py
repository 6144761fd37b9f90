"""Workers sharing a host's cores in the P/D simulator: each step takes slowdown(t) times its
hardware's time (router/pd_sim.py `slowdown`, a measured contention timeline replayed)."""

from __future__ import annotations

import pytest
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.execution.kv_link import get_link
from cbbench.reference_engine.router.pd_sim import simulate_pd
from cbbench.workloads.spec import RequestSpec

CFG = EngineConfig(model="tiny", executor="sim", hardware="cpu-measured", max_model_len=512)
REQS = [RequestSpec(i, 32, 16, arrival_s=float(i)) for i in range(10)]  # one at a time


def _tpot(res, which=lambda r: True) -> list[float]:
    return [r.tpot_s for r in res.requests if which(r)]


def test_a_constant_slowdown_stretches_every_step_of_that_worker_only():
    link = get_link("same-node")
    free = simulate_pd(REQS, CFG, 1, 1, link)
    slow = simulate_pd(REQS, CFG, 1, 1, link, slowdown=[None, lambda t: 2.0])  # decode only
    for a, b in zip(free.requests, slow.requests, strict=True):
        assert b.tpot_s == pytest.approx(2 * a.tpot_s)
        assert b.phases()["prefill_s"] == pytest.approx(a.phases()["prefill_s"])


def test_a_timeline_slows_the_steps_that_start_inside_it():
    res = simulate_pd(REQS, CFG, 0, 1, slowdown=[lambda t: 3.0 if t >= 5.0 else 1.0])
    free = simulate_pd(REQS, CFG, 0, 1)
    early = lambda r: r.arrival_s < 4.5  # noqa: E731 - finished well before t = 5
    late = lambda r: r.arrival_s >= 5.0  # noqa: E731
    assert _tpot(res, early) == pytest.approx(_tpot(free, early))
    assert _tpot(res, late) == pytest.approx([3 * x for x in _tpot(free, late)])
