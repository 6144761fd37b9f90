"""`cbbench plan`'s words for prefill/decode disaggregation: a point's worker counts, one
frontier per mode, and the serve lines of a disaggregated choice (cbbench, vLLM's P/D
setup behind its proxy, Dynamo's worker counts). docs/disaggregation.md."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cbbench.harness.studies.planner import PlanResult, Point


def workers_text(p: Point) -> str:
    """'3' (aggregated replicas) or '1P:2D' (prefill:decode workers)."""
    return f"{p.prefill}P:{p.replicas}D" if p.mode == "disaggregated" else str(p.replicas)


def frontiers_by_mode(res: PlanResult) -> dict[str, list[Point]]:
    """Each mode's own Pareto frontier (cost vs the binding ratio), when the plan has both."""
    from cbbench.harness.studies.planner import frontier

    modes = {p.mode for p in res.points}
    return {m: frontier([p for p in res.points if p.mode == m]) for m in sorted(modes)}


def pd_serve_lines(p: Point, model: str, serve_line: str, vllm_line: str) -> list[str]:
    """The chosen disaggregated point as commands: cbbench's one line, vLLM's P + D servers
    (NixlConnector) behind its disaggregated proxy, Dynamo's worker counts."""
    link = p.config.get("kv_link", "same-node")
    conf = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
    return [
        f"{serve_line} --prefill-replicas {p.prefill} --decode-replicas {p.replicas}",
        f"{vllm_line} --kv-transfer-config '{conf}'  (x{p.prefill} prefill + x{p.replicas} "
        "decode instances behind vLLM's disaggregated proxy: examples/online_serving/"
        "disaggregated_serving)",
        f"Dynamo: {p.prefill} prefill worker(s) (`python -m dynamo.vllm --model {model} "
        f"--is-prefill-worker`) and {p.replicas} decode worker(s) (`python -m dynamo.vllm "
        f"--model {model}`) behind one frontend; KV over NIXL ({link} link assumed)",
    ]
