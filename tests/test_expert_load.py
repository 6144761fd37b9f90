"""Expert load in the harness: the sampler over Prometheus text, a bench run against the
reference engine serving `tiny-moe` (the report's heatmap, the summary's imbalance), and the
`expert-imbalance` diagnose rule."""

from __future__ import annotations

import copy
import io
import time

import pytest
from cbbench.harness.diagnose.base import RunView
from cbbench.harness.diagnose.rules import expert_imbalance
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.report import build_report
from cbbench.harness.results.run_folder import load_run
from cbbench.harness.telemetry import TelemetryOptions, build_samplers
from cbbench.harness.telemetry.experts import ExpertLoadSampler, layer_counts
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console

from tests.server_support import serve
from tests.telemetry_server import MetricsServer, fixture


def expert_text(grid: dict[int, list[int]]) -> str:
    lines = ["# TYPE cbbench:expert_tokens counter"]
    for layer, row in grid.items():
        for e, n in enumerate(row):
            lines.append(f'cbbench:expert_tokens_total{{layer="{layer}",expert="{e}"}} {n}')
    return "\n".join(lines) + "\n"


def test_layer_counts_and_the_sampler_window():
    assert layer_counts(expert_text({1: [1, 2], 0: [3, 0]})) == {"0": [3.0, 0.0], "1": [1.0, 2.0]}
    with MetricsServer(expert_text({0: [10, 10, 10, 10]})) as m:
        samples: list[dict] = []
        s = ExpertLoadSampler(m.url, interval_s=0.02)
        s.start(time.monotonic_ns(), samples.append)
        m.text = expert_text({0: [70, 20, 20, 10]})  # +60, +10, +10, +0 over the run
        time.sleep(0.1)
        s.stop()
    out = s.summary()
    layer = out["layers"]["0"]
    assert layer["tokens"] == [60.0, 10.0, 10.0, 0.0] and layer["total_tokens"] == 80.0
    assert (
        layer["max_over_mean"] == pytest.approx(3.0)
        and out["max_over_mean"] == layer["max_over_mean"]
    )
    assert samples[0] == {
        "t_s": samples[0]["t_s"],
        "source": "experts",
        "experts": {"0": [10.0] * 4},
    }
    declared = "# HELP cbbench:expert_tokens Tokens.\n# TYPE cbbench:expert_tokens counter\n"
    with MetricsServer(declared) as m:  # cbbench's engine before its first MoE step
        s = ExpertLoadSampler(m.url, interval_s=0.02)
        s.start(time.monotonic_ns(), lambda _x: None)
        m.text = expert_text({0: [5, 1], 1: [3, 3]})  # counted from 0
        time.sleep(0.05)
        s.stop()
    out = s.summary()
    assert out["layers"]["0"]["tokens"] == [5.0, 1.0] and out["layers"]["1"]["cv"] == 0.0
    with MetricsServer(declared) as m:  # a dense model: the series never come
        s = ExpertLoadSampler(m.url, interval_s=0.02)
        s.start(time.monotonic_ns(), lambda _x: None)
        s.stop()
    assert s.summary()["reason"] == f"{m.url} routed no token through experts (a dense model)"
    with MetricsServer(fixture("vllm.txt")) as m:  # a dense server: one scrape, then silence
        s = ExpertLoadSampler(m.url, interval_s=0.02)
        s.start(time.monotonic_ns(), lambda _x: None)
        time.sleep(0.08)
        s.stop()
        assert m.hits == 1
    assert s.summary() == {"available": False, "reason": f"{m.url} exports no per-expert load"}


def test_tiny_moe_run_draws_the_heatmap_and_the_rule_reads_the_skew(tmp_path):
    wl = Workload(name="moe", seed=0, requests=tuple(RequestSpec(i, 24, 12) for i in range(16)))
    with serve(EngineConfig(model="tiny-moe")) as (url, _):
        cfg = BenchConfig(
            base_url=url, workload=wl, concurrency=4, out_dir=str(tmp_path / "run"), live=False
        )
        opts = TelemetryOptions(gpu_metrics=False, interval_s=0.05)
        res = run_bench(cfg, build_samplers(opts, url), console=Console(file=io.StringIO()))
    exp = res.summary["telemetry"]["experts"]
    assert exp["available"] and sorted(exp["layers"]) == ["0", "1"]  # tiny-moe: 2 layers
    for d in exp["layers"].values():
        assert len(d["tokens"]) == 8 and d["max_over_mean"] >= 1.0
        # top-2 of 8: every prompt and generated token counts twice per layer
        assert d["total_tokens"] >= 2 * 16 * (24 + 11)
    html = build_report([str(tmp_path / "run")]).html()
    assert "<h2>Expert load</h2>" in html and 'data-layers="2" data-experts="8"' in html
    assert "expert load max/mean" in html
    run = load_run(tmp_path / "run")
    view = RunView(run)
    if exp["max_over_mean"] < expert_imbalance.IMBALANCED:
        assert expert_imbalance.check(view) is None
    skewed = copy.deepcopy(run.meta)
    layer = skewed["summary"]["telemetry"]["experts"]["layers"]["1"]
    layer.update(tokens=[700.0, 50, 50, 50, 50, 50, 25, 25], max_over_mean=5.6, cv=1.9)
    run.meta.clear()
    run.meta.update(skewed)
    f = expert_imbalance.check(RunView(run))
    assert f is not None and f.values["worst_layer"] == "1"
    assert "expert 0 got 700 of 1,000 tokens" in f.evidence[0]
    assert "--expert-balance" in f.fixes["cbbench"] and "--enable-eplb" in f.fixes["vllm"]
