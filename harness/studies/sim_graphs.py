"""Agent graphs in `cbbench sim` (the replay itself: reference_engine/sim/graph_calls.py): which
requests `--drop-too-long` keeps (graph calls with their spliced answers, and not after a
dropped call), and the graph session figures of a replay, labelled."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.graph_summary import graph_lines, graph_summary
from cbbench.harness.results.records import RequestRecord
from cbbench.reference_engine.sim.graph_calls import spliced_prompt_len
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console


def fitting(requests: Sequence[RequestSpec], limit: int) -> tuple[tuple[RequestSpec, ...], int]:
    """The requests whose prompt (a graph call's with its spliced answers) and output fit
    `limit`, less the graph calls after a dropped one (nothing to wait for or splice); and
    how many of those went."""
    by_index = {r.index: r for r in requests}
    have = {r.index for r in requests if spliced_prompt_len(r, by_index) + r.output_len <= limit}
    fit = len(have)
    for r in sorted(requests, key=lambda r: r.index):  # predecessors come first
        if r.graph is not None and r.index in have and any(p not in have for p in r.graph.after):
            have.discard(r.index)
    return tuple(r for r in requests if r.index in have), fit - len(have)


def drop_too_long(wl: Workload, limit: int, console: Console, name: str) -> Workload:
    """`--drop-too-long`: the workload less what cannot fit `limit`, said in one line."""
    kept, orphaned = fitting(wl.requests, limit)
    console.print(
        f"--drop-too-long: skipped {len(wl) - len(kept)} of {len(wl)} requests longer "
        f"than max_model_len {limit}"
        + (f" ({orphaned} of them agent-graph calls after a skipped one)" if orphaned else "")
    )
    if not kept:
        raise CbbenchError(f"every request of {name} exceeds max_model_len {limit}")
    return dataclasses.replace(wl, requests=kept)


def graph_part(records: Sequence[RequestRecord], simulated: bool) -> dict | None:
    """The summary's `graph` part (results/graph_summary.py), marked simulated or not."""
    graphs = graph_summary(records)
    return None if graphs is None else {**graphs, "simulated": simulated}


def print_graph(console: Console, name: str, summary: dict, simulated: bool) -> None:
    """A replay's agent-graph session figures (nothing without graph calls), labelled."""
    lines = graph_lines(summary)
    if not lines:
        return
    label = "SIMULATED" if simulated else "MEASURED, offline"
    console.print(f"  {name} ({label}): " + lines[0], highlight=False)
    for line in lines[1:]:
        console.print(f"  {line}", highlight=False)
