"""The decode KV layout the simulator prices (kernels/kv_layout.py) is the one the
CPU torch backend runs, and the calibrated model's layout terms and drift-aware fit."""

from __future__ import annotations

import random

import pytest
from cbbench.kernels import torch_split_kv
from cbbench.kernels.kv_layout import gather_calls, split_layout
from cbbench.reference_engine.execution.cost_model import (
    HARDWARE_PRESETS,
    STEP_TERMS,
    CostModel,
    HardwareSpec,
    StepWork,
)
from cbbench.reference_engine.model.config import preset_config
from cbbench.reference_engine.sim.calibration import fit_step_terms

SMALL = preset_config("small")  # 8 KV heads x 64 fp32: one block of K (16 tokens) is 32 KiB


def engine_like_tables(rng: random.Random, n: int) -> tuple[list[list[int]], list[int]]:
    """Prompts get consecutive blocks, decode blocks come one at a time, interleaved."""
    nxt = 0
    tables, lens = [], []
    for _ in range(n):
        p = rng.randint(1, 40)
        tables.append(list(range(nxt, nxt + -(-p * 16 // 16))))
        nxt += len(tables[-1])
        lens.append(p * 16 - rng.randint(0, 15))
    for _ in range(rng.randint(0, 12)):
        for b in rng.sample(range(n), rng.randint(1, n)):
            tables[b].append(nxt)
            nxt += 1
            lens[b] += 16
    return tables, lens


@pytest.mark.parametrize("seed", range(20))
def test_layout_counts_are_what_the_backend_plan_does(seed):
    rng = random.Random(seed)
    tables, lens = engine_like_tables(rng, rng.randint(1, 12))
    block_bytes = rng.choice([1 << 10, 32 << 10, 128 << 10])
    layout = split_layout(tables, lens, 16, block_bytes)
    plan = torch_split_kv.plan_split(tables, lens, 16, block_bytes)
    assert (layout is None) == (plan is None)
    if plan is None:
        return
    assert layout is not None
    in_place, gathered, calls = layout.counts(16)
    assert in_place == 16 * sum(n for _, _, n in plan.runs)
    assert gathered == 16 * sum(g.ids.numel() for g in plan.rest)
    assert calls == len(plan.runs) + len(plan.rest)
    assert in_place + 16 * sum(len(r) for r in layout.rests) == 16 * sum(
        -(-n // 16) for n in lens
    )  # every block exactly once


def test_gather_calls_keep_a_call_within_the_budget():
    assert gather_calls(8, 64, 2048) == 1  # 8 x 2 x 64 x 2 KiB = 2 MiB: one call
    assert gather_calls(8, 1024, 2048) == 8  # 4 MiB per sequence: one each
    assert gather_calls(3, 1 << 20, 2048) == 3  # wider than the budget: still one each


def layout_priced(**coef: float) -> CostModel:
    linear = {t: 0.0 for t in STEP_TERMS}
    linear.update(coef)
    return CostModel(SMALL, HardwareSpec("fit", 1.0, 1.0, 1.0, linear=linear), "float32")


def test_a_step_costs_its_layout():
    """70 tokens over blocks 0..4: four full blocks read in place, the last one gathered, in
    two calls; over scattered blocks (or without tables) all 80 slots are gathered in one."""
    cm = layout_priced(c_dec_in_place=1e-6, c_dec_gathered=3e-6, c_dec_calls=1e-3)
    assert cm.uses_layout
    w = cm.work([(69, 1, True, [0, 1, 2, 3, 4])])
    assert (w.dec_in_place, w.dec_gathered, w.dec_calls) == (64, 16, 2)
    assert cm.time_of(w) == pytest.approx(64e-6 + 48e-6 + 2e-3)
    for chunk in ((69, 1, True, [0, 5, 2, 7, 4]), (69, 1, True)):
        w = cm.work([chunk])
        assert (w.dec_in_place, w.dec_gathered, w.dec_calls) == (0, 80, 1)
    prefill = cm.work([(0, 70, True, [0, 1, 2, 3, 4])])
    assert (prefill.dec_in_place, prefill.dec_gathered, prefill.dec_calls) == (0, 0, 0)


def test_only_fits_with_layout_terms_need_the_tables():
    assert not CostModel(SMALL, HARDWARE_PRESETS["h100-sxm"], "float32").uses_layout
    assert not layout_priced(c0=0.01, c_dec_ctx=1e-6).uses_layout
    assert layout_priced(c_dec_calls=1e-3).uses_layout


def test_drift_aware_fit_is_not_fooled_by_a_slow_minute():
    """Two runs step in turn; the machine is 30 % slower after round 200, when only the
    small-batch run is left. A plain fit reads that as the cost of small batches; the fit
    with rounds gives the machine the blame and keeps the shapes' relative costs."""
    true = {"c0": 0.03, "c_tok": 1e-3, "c_dec_gathered": 8e-6, "c_dec_calls": 1e-3}

    def cost(w: StepWork) -> float:
        return sum(c * w.feature(t) for t, c in true.items())

    works, times, rounds = [], [], []
    for batch, steps in ((12, 200), (2, 400)):
        for r in range(steps):
            ctx = 64 + 4 * r
            w = StepWork(num_tokens=batch, num_seqs=batch, num_samples=batch)
            w.dec_gathered, w.dec_calls = batch * ctx, -(-batch * ctx // 1024)
            works.append(w)
            times.append(cost(w) * (1.3 if r >= 200 else 1.0))
            rounds.append(r)
    host = [1e-9] * len(works)
    big, small = works[0], works[250]
    want = cost(big) / cost(small)
    plain, _ = fit_step_terms(works, times, host)
    aware, err = fit_step_terms(works, times, host, rounds)

    def ratio(coef: dict[str, float]) -> float:
        def t(w: StepWork) -> float:
            return sum(c * w.feature(k) for k, c in coef.items())

        return t(big) / t(small)

    assert abs(ratio(plain) / want - 1) > 0.05
    assert ratio(aware) == pytest.approx(want, rel=1e-3)
    assert err["speed_drift"][1] / err["speed_drift"][0] == pytest.approx(1.3, rel=1e-3)
