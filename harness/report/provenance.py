"""The report header's lines about each run: where it came from (an imported tool's name,
version and file, aggregate only or per request, the definitions that differ from cbbench's)
and the environment needed to repeat it (server and its settings, GPU or its absence, client
host, the exact command)."""

from __future__ import annotations

import shlex
from typing import Any

from cbbench.harness.report.runs import LoadedRun
from cbbench.harness.results.environment import gpu_line

# the server settings worth a place in the header (the rest is in the configuration table)
_SERVER_KEYS = (
    "block_size",
    "gpu_memory_utilization",
    "num_gpu_blocks",
    "cache_dtype",
    "enable_prefix_caching",
    "max_num_seqs",
    "max_num_batched_tokens",
    "scheduler",
    "device",
    "dtype",
    "num_kv_blocks",
    "max_model_len",
    "enable_chunked_prefill",
    "tensor_parallel_size",
    "kv_cache_dtype",
)


def _settings(server: dict, told: Any = None) -> str:
    """`told`: run.json's `target.server_settings` (any server's, in cbbench's names: TGI's and
    llama.cpp's only there), after what the server's own identity holds."""
    found: dict[str, Any] = {}
    sources = (server.get("cache_config_info"), server.get("config"), server.get("server_info"), told)
    for src in sources:
        if isinstance(src, dict):
            for k in _SERVER_KEYS:
                if k in src and k not in found and src[k] not in (None, ""):
                    found[k] = src[k]
    return ", ".join(f"{k} {v}" for k, v in found.items())


def imported_lines(meta: dict) -> list[str]:
    imp = meta.get("imported")
    if not isinstance(imp, dict):
        return []
    what = (
        "aggregate only: no per-request data, so no distributions and no gate intervals"
        if imp.get("aggregate_only")
        else "per request"
    )
    own = (imp.get("printed") or {}).get("ttft_p50_s")
    said = f"; its own TTFT p50 {own * 1e3:.2f} ms" if isinstance(own, (int, float)) else ""
    lines = [
        f"imported from {imp.get('tool')} {imp.get('version') or '(version not in the file)'} "
        f"({imp.get('format')}, {imp.get('file')}): {what}{said}"
    ]
    lines += [f"definition differs: {d}" for d in imp.get("definitions") or []]
    return lines


def environment_lines(meta: dict) -> list[str]:
    env = meta.get("environment")
    if not isinstance(env, dict) or not env:
        return []
    lines = []
    server = env.get("server")
    if isinstance(server, dict):
        name = server.get("name") or "unknown"
        version = server.get("version") or "(version not reported)"
        settings = _settings(server, (meta.get("target") or {}).get("server_settings"))
        lines.append(f"server: {name} {version}" + (f"; {settings}" if settings else ""))
    if "gpus" in env or "gpu" in env:
        where = "" if not isinstance(server, dict) or server.get("same_host") else " (client host)"
        lines.append(f"GPU{where}: {gpu_line(env)}")
    host = env.get("hostname")
    if host:
        cpu = f", {env.get('cpu_count')} x {env.get('cpu')}" if env.get("cpu") else ""
        lines.append(f"client host: {host}{cpu}")
    cmd = meta.get("command")
    if isinstance(cmd, list) and cmd and not meta.get("imported"):
        lines.append(f"command: {shlex.join(str(c) for c in cmd)}")
    return lines


def run_lines(lr: LoadedRun) -> list[str]:
    return imported_lines(lr.meta) + environment_lines(lr.meta)


def grouped(runs: list[LoadedRun]) -> tuple[list[str], list[list[str]]]:
    """(lines every run shares, said once; each run's own lines): a sweep's levels share
    their server, GPU, host and command."""
    per = [run_lines(lr) for lr in runs]
    if len(per) < 2:
        return [], per
    common = [line for line in per[0] if all(line in p for p in per[1:])]
    return common, [[line for line in p if line not in common] for p in per]
