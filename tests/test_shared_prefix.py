"""Over HTTP on the reference engine: the shared-prefix workload with --flush-cache --prime hits
its intended rate (from usage.prompt_tokens_details.cached_tokens), twice in a row, while a run
without them inherits the previous run's cache."""

from __future__ import annotations

import io

import httpx
import pytest
from cbbench.harness.errors import CbbenchError
from cbbench.harness.load.cache import flush_prefix_cache
from cbbench.harness.load.cache_options import CacheOptions
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.workloads.loader import build_from_spec
from rich.console import Console

from tests.server_support import serve

SPEC = {  # 4 groups x 4 prompts, 96 + 32 tokens: 75 % of each prompt is its group's prefix
    "shared_prefix": {
        "groups": 4,
        "prompts_per_group": 4,
        "system_len": 96,
        "question_len": 32,
        "output_len": 4,
    }
}
ENGINE = EngineConfig(model="tiny", enable_prefix_caching=True, block_size=16)


def _run(url: str, tmp_path, name: str, cache: CacheOptions) -> tuple[dict, str]:
    wl = build_from_spec(SPEC, "shared-prefix", "spec", seed=0)
    out = io.StringIO()
    cfg = BenchConfig(base_url=url, workload=wl, out_dir=tmp_path / name, live=False, cache=cache)
    cfg.concurrency = len(wl)
    res = run_bench(cfg, console=Console(file=out, width=200))
    assert res.summary["counts"]["completed"] == 16
    return res.summary["prefix_cache"], out.getvalue()


def test_shared_prefix_flush_prime_hits_intended_rate(tmp_path):
    with serve(ENGINE, engine_process=True) as (url, _):  # the reset crosses to the engine process
        fresh = CacheOptions(flush_cache=True, prime=True)
        first, printed = _run(url, tmp_path, "a", fresh)
        second, _ = _run(url, tmp_path, "b", fresh)
        warm, _ = _run(url, tmp_path, "c", CacheOptions())  # no flush: the last run's cache
    assert first["intended_hit_rate"] == pytest.approx(0.75)
    assert first["requests_reported"] == 16
    assert abs(first["hit_rate"] - 0.75) <= 0.05, first
    assert second["hit_rate"] == pytest.approx(first["hit_rate"]), (first, second)
    assert warm["hit_rate"] > first["hit_rate"] + 0.05, (first, warm)  # whole prompts cached
    assert "achieved hit rate 75.0 % (intended 75.0 %, primed)" in printed


def test_primed_run_without_hits_asks_whether_prefix_caching_is_on(tmp_path):
    # `cbbench serve` caches no prefixes by default: a primed run said only "achieved hit rate
    # 0.0 % (intended 75.0 %, primed)", leaving the user to guess why
    off = EngineConfig(model="tiny", enable_prefix_caching=False, block_size=16)
    with serve(off) as (url, _):
        pc, printed = _run(url, tmp_path, "off", CacheOptions(flush_cache=True, prime=True))
    assert pc["hit_rate"] == 0 and pc["intended_hit_rate"] == pytest.approx(0.75)
    assert "not one hit after priming: is the server's prefix caching on?" in printed
    assert "--enable-prefix-caching" in printed


def test_cold_run_after_flush_misses_each_group_once(tmp_path):
    with serve(ENGINE) as (url, _):  # the engine thread's reset
        _run(url, tmp_path, "warm", CacheOptions())
        cold, _ = _run(url, tmp_path, "cold", CacheOptions(flush_cache=True))
    assert cold["intended_hit_rate"] == pytest.approx(0.75 * 3 / 4)
    # all 16 at once: a group's later prompts may arrive before its first one is computed
    assert cold["hit_rate"] <= 0.75 * 3 / 4 + 0.05, cold


def test_flush_endpoints_and_a_server_without_them(tmp_path):
    with serve(ENGINE) as (url, _):
        for path in ("/reset_prefix_cache", "/flush_cache"):
            r = httpx.post(url + path, timeout=10)
            assert r.status_code == 200, (path, r.text)
        assert flush_prefix_cache(url, None) == "/reset_prefix_cache"
    with pytest.raises(CbbenchError, match="--flush-cache: .* empties no prefix cache"):
        flush_prefix_cache(url, None, timeout_s=2)  # the server is gone


def test_shared_prefix_workload_states_its_intended_rate():
    from cbbench.workloads import summarize_workload

    wl = build_from_spec(SPEC, "shared-prefix", "spec", seed=0)
    assert len(wl) == 16
    assert sorted(r.prefix_ids[0] for r in wl.requests) == [g for g in range(4) for _ in range(4)]
    assert [r.index for r in wl.requests] == list(range(16))
    assert [r.prefix_ids for r in wl.requests] != sorted(r.prefix_ids for r in wl.requests)
    assert summarize_workload(wl)["intended_hit_rate"] == {"primed": 0.75, "cold": 0.5625}


def test_prime_sends_each_group_prefix_as_the_run_builds_it():
    from cbbench.harness.load.cache import _prime_prompts
    from cbbench.harness.load.prompts import PromptBuilder

    wl = build_from_spec(SPEC, "shared-prefix", "spec", seed=3)
    pb = PromptBuilder(wl.prompt_seed, wl.prefix_block_size)  # as the workers build them
    for text in (False, True):
        todo = _prime_prompts(wl, text)
        assert len(todo) == 4  # one per group
        for what, prompt in todo:
            r = wl.requests[int(what.rsplit(" ", 1)[1])]
            whole = (pb.text if text else pb.token_ids)(r.index, r.prompt_len, r.prefix_ids)
            assert len(prompt) > 0 and whole[: len(prompt)] == prompt
            if not text:
                assert len(prompt) == 96
