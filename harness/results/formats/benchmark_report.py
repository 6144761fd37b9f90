"""The llm-d benchmark report v0.2.1 (llm-d/llm-d-benchmark,
`llmdbenchmark/analysis/benchmark_report/`): a run folder as one (`benchmark_report_import`
reads one back).

Where cbbench's figures go:
- `results.request_performance.aggregate`: requests (total, failures, input/output lengths),
  latency (TTFT, TPOT, ITL, request latency, NTPOT = E2E / output tokens), throughput (input,
  output, total tokens/s, queries/s): the same numbers `cbbench report` shows (successful,
  non-warmup requests over the run's measured window).
- `results.observability.components`: the server's sampled series (KV usage, running and
  waiting requests, GPU utilization, memory, power) under the schema's own names.
- `scenario.stack`: the server as an `inference_engine` component (its own word for its
  version and settings under `native.config`), the client host as a `generic` one.
- `scenario.load`: the workload and load settings, the exact command in `native.args`.
- `results.observability.metadata.cbbench`: what the schema has no field for (TTFO, queue
  times, goodput, the timing error bound, per-replica and expert figures, the environment).
  Observability is the one results object the schema leaves open; no figure goes into a
  field that means something else.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

import numpy as np
from cbbench.harness.results.run_folder import Run
from cbbench.harness.results.summary import measured_window_s, output_tokens, summarize

VERSION = "0.2.1"
# Statistics fields of the schema and the percentile each stands for
PCTS = {
    "p0p1": 0.1,
    "p1": 1,
    "p5": 5,
    "p10": 10,
    "p25": 25,
    "p50": 50,
    "p75": 75,
    "p90": 90,
    "p95": 95,
    "p99": 99,
    "p99p9": 99.9,
}
LATENCY_FIELDS = {  # schema field -> (cbbench summary key, units)
    "time_to_first_token": ("ttft_s", "s"),
    "time_per_output_token": ("tpot_s", "s/token"),
    "inter_token_latency": ("itl_s", "s/token"),
    "request_latency": ("e2e_s", "s"),
}


def _stats(values: np.ndarray, units: str) -> dict | None:
    v = values[~np.isnan(values)]
    if v.size == 0:
        return None
    out: dict[str, Any] = {"units": units, "mean": float(v.mean()), "min": float(v.min())}
    out["stddev"] = float(v.std(ddof=1)) if v.size > 1 else 0.0
    for k, q in PCTS.items():
        out[k] = float(np.percentile(v, q))
    out["max"] = float(v.max())
    return out


def _from_summary(s: dict | None, units: str) -> dict | None:
    if not isinstance(s, dict) or s.get("mean") is None:
        return None
    out = {"units": units, "mean": s["mean"]}
    out.update({k: s[k] for k in ("p50", "p90", "p95", "p99", "max") if s.get(k) is not None})
    return out


def _rate(v: float | None, units: str) -> dict | None:
    return None if v is None else {"units": units, "mean": float(v)}


def _seq_len(values: list[int]) -> dict:
    if not values:
        return {"distribution": "other", "value": 0}
    a = np.asarray(values, dtype=np.float64)
    fixed = bool(np.all(a == a[0]))
    out: dict[str, Any] = {"distribution": "fixed" if fixed else "other", "value": float(a.mean())}
    if not fixed:
        out.update(std_dev=float(a.std()), min=int(a.min()), max=max(1, int(a.max())))
    elif a[0] == int(a[0]):
        out["value"] = int(a[0])
    return out


def _mean_len(meta: dict) -> dict:
    """An aggregate-only import's input length: its mean, where the totals tell it."""
    s = meta.get("summary") or {}
    done = (s.get("counts") or {}).get("completed")
    total = s.get("total_input_tokens")
    return {"distribution": "other", "value": total / done if total and done else 0}


def _cfg_id(obj: Any) -> str:
    return hashlib.md5(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _aggregate(run: Run) -> dict:
    meta = run.meta
    if (meta.get("imported") or {}).get("aggregate_only"):
        s = meta.get("summary") or {}
        c = s.get("counts") or {}
        latency = {f: _from_summary(s.get(k), u) for f, (k, u) in LATENCY_FIELDS.items()}
        return {
            "requests": {"total": int(c.get("total") or 0), "failures": int(c.get("failed") or 0)},
            "latency": {k: v for k, v in latency.items() if v},
            "throughput": _throughput(s),
        }
    measured = [r for r in run.records if not r.warmup]
    ok = [r for r in measured if r.ok]
    window = (meta.get("summary") or {}).get("duration_s") or measured_window_s(measured)
    s = summarize(run.records, window or None)

    def col(values: list) -> np.ndarray:
        return np.asarray([np.nan if v is None else float(v) for v in values], dtype=np.float64)

    out_tok = [output_tokens(r) for r in ok]
    latency = {
        f: _stats(col([getattr(r, k) for r in ok]), u)
        for f, (k, u) in LATENCY_FIELDS.items()
        if k != "itl_s"
    }
    itl = np.asarray([x for r in ok for x in r.itl_s], dtype=np.float64)
    latency["inter_token_latency"] = _stats(itl, "s/token")
    latency["normalized_time_per_output_token"] = _stats(
        col([r.e2e_s / n if r.e2e_s is not None and n else None for r, n in zip(ok, out_tok)]),
        "s/token",
    )
    ins = [r.prompt_tokens_server or r.prompt_tokens_client or r.prompt_len for r in ok]
    requests: dict[str, Any] = {
        "total": len(measured),
        "failures": len(measured) - len(ok),
        "input_length": _stats(col(ins), "count"),
        "output_length": _stats(col(out_tok), "count"),
    }
    return {
        "requests": {k: v for k, v in requests.items() if v is not None},
        "latency": {k: v for k, v in latency.items() if v},
        "throughput": _throughput(s),
    }


def _throughput(s: dict) -> dict:
    dur = s.get("duration_s")
    tin = s.get("total_input_tokens")
    t = {
        "input_token_rate": _rate(tin / dur if tin is not None and dur else None, "tokens/s"),
        "output_token_rate": _rate(s.get("output_throughput"), "tokens/s"),
        "total_token_rate": _rate(s.get("total_token_throughput"), "tokens/s"),
        "request_rate": _rate(s.get("request_throughput"), "queries/s"),
    }
    return {k: v for k, v in t.items() if v}


def _engine_component(meta: dict) -> dict:
    target, env = meta.get("target") or {}, meta.get("environment") or {}
    server = env.get("server") or {}
    engine = target.get("engine") or {}
    gpus = env.get("gpus") or []
    local = server.get("same_host", False)
    if local and gpus:
        accel = {"model": gpus[0]["name"], "count": len(gpus)}
    elif local:
        accel = {"model": "none (CPU: no GPU on the host, NVML)", "count": 0}
    else:
        accel = {"model": "unknown (server on another host)", "count": 0}
    accel["parallelism"] = {}
    config = {"server": server, "engine": engine}
    return {
        "metadata": {
            "label": server.get("name") or engine.get("owned_by") or "server",
            "cfg_id": _cfg_id(config),
            "description": f"the server at {target.get('base_url') or 'unknown'}",
        },
        "standardized": {
            "kind": "inference_engine",
            "tool": str(server.get("name") or engine.get("owned_by") or "unknown"),
            "tool_version": str(server.get("version") or "unknown"),
            "role": "replica",
            "replicas": max(1, int(server.get("replicas") or 1)),
            "model": {"name": str(target.get("model") or "unknown")},
            "accelerator": accel,
        },
        "native": {"config": config},
    }


def _client_component(meta: dict) -> dict:
    env = {k: v for k, v in (meta.get("environment") or {}).items() if k != "server"}
    return {
        "metadata": {
            "label": "cbbench-client",
            "cfg_id": _cfg_id(env),
            "description": "load generator host",
        },
        "standardized": {
            "kind": "generic",
            "tool": "cbbench",
            "tool_version": str(env.get("cbbench_version") or "unknown"),
            "host": env.get("hostname"),
            "cpu": env.get("cpu"),
            "gpus": env.get("gpus"),
            "gpu": env.get("gpu"),
        },
        "native": {"config": env},
    }


def _load(run: Run) -> dict:
    meta = run.meta
    load, imported = meta.get("load") or {}, meta.get("imported") or {}
    recs = [r for r in run.records if not r.warmup]
    std: dict[str, Any] = {
        "tool": imported.get("tool") or "cbbench",
        "tool_version": str(
            (
                imported.get("version")
                if imported
                else (meta.get("environment") or {}).get("cbbench_version")
            )
            or "unknown"
        ),
        "parallelism": max(1, int(load.get("workers") or 1)),
        "source": "random" if not imported else "unknown",
        "input_seq_len": _seq_len([r.prompt_len for r in recs]) if recs else _mean_len(meta),
    }
    if recs:
        std["output_seq_len"] = _seq_len([r.output_len for r in recs])
    rate = load.get("rate")
    if isinstance(rate, (int, float)) and not isinstance(rate, bool) and 0 < rate < float("inf"):
        std["rate_qps"] = float(rate)
    conc = load.get("concurrency")
    if isinstance(conc, int) and not isinstance(conc, bool) and conc >= 1:
        std["concurrency"] = conc
    workload = meta.get("workload") or {}
    return {
        "metadata": {
            "cfg_id": _cfg_id({"workload": workload, "load": load}),
            "description": str(workload.get("name") or "unknown workload"),
        },
        "standardized": std,
        "native": {
            "args": {"argv": meta.get("command")},
            "config": {"workload": workload, "load": load},
        },
    }


# the server's sampled series (timeseries.jsonl) -> ResourceMetrics fields: (key, source, scale, units)
SERIES = {
    "kv_cache_usage": ("kv_usage", "server", 100.0, "percent"),
    "cache_hit_rate": ("prefix_cache_hit_rate", "server", 100.0, "percent"),
    "running_requests": ("running", "server", 1.0, "count"),
    "waiting_requests": ("waiting", "server", 1.0, "count"),
    "gpu_utilization": ("util_gpu", "gpu", 1.0, "percent"),
    "gpu_memory_usage": ("mem_used_bytes", "gpu", 1.0 / 2**30, "GiB"),
    "power_consumption": ("power_w", "gpu", 1.0, "Watts"),
}


def _components(run: Run, label: str) -> list[dict]:
    """The server's figures as the schema names them, from what the run sampled; none that
    the run did not sample."""
    aggregate = {}
    for name, (key, source, scale, units) in SERIES.items():
        values = [
            float(x[key]) * scale
            for x in run.timeseries
            if x.get("source") == source and isinstance(x.get(key), (int, float))
        ]
        stats = _stats(np.asarray(values, dtype=np.float64), units) if values else None
        if stats:
            aggregate[name] = stats
    return [{"component_label": label, "aggregate": aggregate}] if aggregate else []


def _extras(run: Run) -> dict:
    """What the schema has no field for: cbbench's own figures, named as cbbench names them."""
    s = run.meta.get("summary") or {}
    if not s.get("ttft_s") and run.records:  # a run folder written without a summary
        s = {**summarize(run.records, None), **s}
    tel = s.get("telemetry") or {}
    client = s.get("client") or {}
    out = {
        "definitions": "docs/timing.md of cbbench: TTFT = first token of any kind - request "
        "written; TTFO = first answer token; TPOT = (E2E - TTFT) / (tokens - 1)",
        "ttfo_s": s.get("ttfo_s"),
        "server_queue_s": s.get("server_queue_s"),
        "client_queue_s": s.get("client_queue_s"),
        "goodput": s.get("goodput"),
        "timing_bound_s": client.get("timing_bound_s"),
        "timing_bound_exceeded": client.get("timing_bound_exceeded"),
        "replicas": tel.get("replicas"),
        "experts": tel.get("experts") or s.get("experts"),
        "efficiency": s.get("efficiency"),  # energy and cost per token, when measured
        "error_rate": s.get("error_rate"),
        "errors_by_kind": s.get("errors_by_kind"),
        "environment": run.meta.get("environment"),
        "imported": run.meta.get("imported"),
        "run_folder": run.name,
    }
    return {k: v for k, v in out.items() if v is not None}


def to_benchmark_report(run: Run) -> dict:
    """A run folder as an llm-d benchmark report v0.2.1 (a JSON-ready dict)."""
    meta = run.meta
    seed = f"{run.dir.resolve()}|{meta.get('started_at')}|{meta.get('name')}"
    time: dict[str, Any] = {}
    for k, key in (("start", "started_at"), ("end", "ended_at")):
        if isinstance(meta.get(key), str) and "T" in meta[key]:
            time[k] = meta[key]
    dur = (meta.get("summary") or {}).get("duration_s")
    if isinstance(dur, (int, float)):
        time["duration"] = f"PT{dur:.3f}S"
    engine = _engine_component(meta)
    report = {
        "version": VERSION,
        "run": {
            "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, seed)),
            "eid": str(meta.get("name") or run.name),
            "time": time or None,
            "description": "cbbench run " + run.name,
            "keywords": ["cbbench"],
        },
        "scenario": {
            "stack": [engine, _client_component(meta)],
            "load": _load(run),
        },
        "results": {
            "request_performance": {"aggregate": _aggregate(run)},
            "observability": {
                "components": _components(run, engine["metadata"]["label"]) or None,
                "metadata": {"cbbench": _extras(run)},
            },
        },
    }
    return json.loads(json.dumps(report, default=str, allow_nan=False))
