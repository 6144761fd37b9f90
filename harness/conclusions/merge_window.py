"""`cbbench merge` with the steady window: the merged run's window found on the merged
records (shards' clocks already aligned), so `gate` compares merged runs over their steady
windows as it does single runs. The window kind is what every shard led with (`bench
--window`, the same command on each host); shards that led with different kinds, or a shard
stopped over-saturated (no steady window then), merge to the whole run, with a note."""

from __future__ import annotations

from pathlib import Path

from cbbench.harness.conclusions.run_summary import OVER_SATURATED
from cbbench.harness.conclusions.window import add_window_summary, run_lead
from cbbench.harness.results.merge import MergeResult, merge_runs
from cbbench.harness.results.records import RequestRecord


def add_merged_window(summary: dict, records: list[RequestRecord], shards: list[dict]) -> None:
    """The window part of a merged summary (`merge_runs`'s `conclude`)."""
    leads = [run_lead(m) for m in shards]
    spec = leads[0] if all(x == leads[0] for x in leads) else "all"
    saturated = any(
        m.get("status") == OVER_SATURATED or (m.get("summary") or {}).get("over_saturated")
        for m in shards
    )
    slo = (shards[0].get("load") or {}).get("slo_s") or None
    add_window_summary(summary, records, spec, slo, steady=not saturated)
    if spec == "all" and len(set(map(str, leads))) > 1:
        summary["lead_note"] = (
            "the shards led with different windows (bench --window): the merged summary leads "
            "with the whole run"
        )


def merge_with_window(out_dir: str | Path, run_dirs: list[str | Path], **kw) -> MergeResult:
    """`merge_runs` (its keywords) with the steady window added to the merged summary."""
    return merge_runs(out_dir, run_dirs, conclude=add_merged_window, **kw)
