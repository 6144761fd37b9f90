"""Prompts are seeded by the workload too (issue 42, finding 9): two workloads run back to back
at one seed must not share prompt ids, or the second gets prefix-cache hits from the first."""

from __future__ import annotations

from pathlib import Path

from cbbench.harness.load.prompts import PromptBuilder
from cbbench.harness.results.run_folder import load_run
from cbbench.harness.servers.launcher import launch_reference_server
from cbbench.workloads import load_workload

from tests.diagnose_support import bench, hardware_file, sim_args, workload


def test_presets_at_one_seed_send_different_leading_ids() -> None:
    mixed, chat = (load_workload(n, seed=0, num_requests=4) for n in ("mixed", "chat"))
    a = PromptBuilder(mixed.prompt_seed).token_ids(0, 32)
    b = PromptBuilder(chat.prompt_seed).token_ids(0, 32)
    assert a != b
    again = load_workload("mixed", seed=0, num_requests=4)  # still deterministic
    assert PromptBuilder(again.prompt_seed).token_ids(0, 32) == a
    assert load_workload("mixed", seed=1, num_requests=4).prompt_seed != mixed.prompt_seed


def test_back_to_back_workloads_get_no_prefix_cache_hits_from_each_other(tmp_path: Path) -> None:
    lengths = [(96, 2)] * 4
    hw = hardware_file(tmp_path)
    server = sim_args(hw, "--enable-prefix-caching")
    with launch_reference_server("tiny", "continuous", "cpu", server) as srv:
        first = bench(srv.base_url, workload("mixed", lengths), tmp_path / "a", 1)
        second = bench(srv.base_url, workload("chat", lengths), tmp_path / "b", 1)
        repeat = bench(srv.base_url, workload("mixed", lengths), tmp_path / "c", 1)
    cached = {
        name: [r.extra.get("num_cached_tokens") for r in load_run(d).records]
        for name, d in (("first", first), ("second", second), ("repeat", repeat))
    }
    assert cached["second"] == [0, 0, 0, 0], cached  # a different workload: no hits
    assert all(c and c >= 64 for c in cached["repeat"]), cached  # the same one: hits
