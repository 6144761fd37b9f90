"""The comparison table (`cbbench run`, `cbbench sim`) has TTFO rows (first answer token,
p50/p99) beside TTFT's when a run reasoned, and none for plain runs, where TTFO is TTFT
(issue f1, item 4). Summaries from real runs: the tiny engine over HTTP, one with its
reasoning split on (half of each chat output streamed as reasoning), one without."""

from __future__ import annotations

import io

from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.results.compare import comparison_table, markdown, reasoned
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.server.reasoning import ReasoningOptions
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console
from server_support import serve

CONFIG = EngineConfig(model="tiny", scheduler="continuous", max_model_len=256)


def _summary(tmp_path, name: str, reasoning: ReasoningOptions | None) -> dict:
    wl = Workload(name, 0, tuple(RequestSpec(i, 8, 24, None) for i in range(4)))
    kw = {"reasoning": reasoning} if reasoning else {}
    with serve(CONFIG, **kw) as (url, _):
        cfg = BenchConfig(base_url=url, workload=wl, endpoint="chat", concurrency=2,
                          out_dir=tmp_path / name, live=False)  # fmt: skip
        res = run_bench(cfg, console=Console(file=io.StringIO(), width=200))
    assert res.summary["counts"]["completed"] == 4
    return res.summary


def _row(text: str, name: str) -> list[str]:
    line = next(x for x in text.splitlines() if x.startswith(f"| {name} |"))
    return [c.strip() for c in line.strip("|").split("|")][1:]


def test_ttfo_rows_when_a_run_reasoned_and_none_for_plain_runs(tmp_path):
    thinking = _summary(tmp_path, "thinking", ReasoningOptions("deepseek_r1", "reasoning", 0.5))
    plain = _summary(tmp_path, "plain", None)
    assert reasoned(thinking) and not reasoned(plain)
    text = markdown(comparison_table({"thinking": thinking, "plain": plain}, "t"))
    for p in ("p50", "p99"):
        ttfo, ttft = _row(text, f"TTFO {p} (ms)"), _row(text, f"TTFT {p} (ms)")
        assert "-" not in ttfo and "-" not in ttft  # the plain run's own TTFO beside
        # the first answer token comes after 12 reasoning tokens (>=: on a loaded host one
        # read may bring them together)
        assert thinking["ttfo_s"][p] >= thinking["ttft_s"][p]
    assert thinking["total_reasoning_tokens"] == 4 * 12 and plain["total_reasoning_tokens"] == 0
    lines = [x.split("|")[1].strip() for x in text.splitlines() if x.startswith("| TT")]
    assert lines == ["TTFT p50 (ms)", "TTFT p99 (ms)", "TTFO p50 (ms)", "TTFO p99 (ms)"]
    # plain runs only: no TTFO rows (they would repeat TTFT)
    text = markdown(comparison_table({"a": plain, "b": plain}, "t"))
    assert "TTFO" not in text and "| TTFT p50 (ms) |" in text
