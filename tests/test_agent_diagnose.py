"""The agent-cache rule on real runs of the reference engine: agent sessions with prefix
caching off miss the cache on every step and the rule says so (with each engine's fix); with
caching on, a run is silent (tests/test_agent_sessions.py)."""

from __future__ import annotations

import io

from cbbench.harness.diagnose import diagnose_run
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.results.run_folder import load_run
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.workloads.loader import build_from_spec
from rich.console import Console

from tests.server_support import serve
from tests.test_agent_sessions import SPEC

SMALL = {"agent": dict(SPEC["agent"], system=32, tools=1, tool_tokens=20, result=15)}


def _findings(caching: bool, tmp_path) -> list:
    wl = build_from_spec(SMALL, "agent", "spec", seed=2, num_requests=14)
    engine = EngineConfig(model="tiny", enable_prefix_caching=caching, block_size=16)
    with serve(engine) as (url, _):
        cfg = BenchConfig(
            base_url=url, workload=wl, endpoint="chat", out_dir=tmp_path / str(caching),
            live=False, concurrency=2,
        )  # fmt: skip
        res = run_bench(cfg, console=Console(file=io.StringIO()))
    assert res.summary["counts"]["completed"] == 14
    return diagnose_run(load_run(res.run_dir)).findings


def test_agent_cache_rule_fires_without_prefix_caching(tmp_path):
    off = [f for f in _findings(False, tmp_path) if f.rule in ("agent-cache", "session-cache")]
    assert [f.rule for f in off] == ["agent-cache"]  # one finding, not the chat rule too
    f = off[0]
    assert f.values["step_hit_rate"] < 0.05 and f.values["history_share"] > 0.5
    assert "session-affinity" in f.fixes["cbbench"] and "--routing-logic session" in f.fixes["vllm"]
    # caching on: tests/test_agent_sessions.py diagnoses its reference-engine run (silent)
