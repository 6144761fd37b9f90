"""Soak benchmark: `cbbench serve` under many concurrent streams for a long time, its memory
and open file descriptors sampled, and whether memory is flat after warm-up.

    python -m tests.benchmarks.studies.soak --streams 1000 --duration 600
    python -m tests.benchmarks.studies.soak --streams 200 --duration 120 -- --max-num-seqs 64

Starts `cbbench serve` (tiny model on CPU unless serve flags after `--` say otherwise), drives
it closed-loop with `--streams` streaming requests in flight until `--duration` is up (the
harness's own load generator, one process), and samples every `--interval` seconds the RSS
and open fds of the server process and of its children (the engine process). Writes
`soak.json` (samples, verdict) and the load's run folder under `--out`, prints a table.

Verdict: the first `--warmup` fraction of the run is warm-up (allocator pools, caches, the
first compile of everything). After it, RSS is "flat" when the mean of the last quarter of
the samples is within max(5 %, 16 MiB) of the mean of the first quarter, and fds return to
their post-warm-up level (no leak of one fd per request).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

WARMUP_FRACTION = 0.2
FLAT_REL, FLAT_ABS_MB = 0.05, 16.0

SOAK_WORKLOAD = {
    "name": "soak",
    "description": "short requests, many of them: churn through the server's per-request state",
    "prompt": {"dist": "uniform", "min": 8, "max": 48},
    "output": {"dist": "uniform", "min": 4, "max": 32},
}


@dataclass
class SoakOptions:
    streams: int = 1000
    duration_s: float = 600.0
    interval_s: float = 5.0
    warmup_fraction: float = WARMUP_FRACTION
    out_dir: Path = field(default_factory=lambda: Path("results") / "soak")
    serve_args: list[str] = field(default_factory=list)
    max_requests: int | None = None  # the workload's length (default: ~300 req/s of it)


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
            out.append(int(entry.name))
    return out


def process_usage(pid: int) -> tuple[float, int]:
    """(RSS in MiB, open fds) of one process; (0, 0) once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kb = next(
            int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")
        )
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return 0.0, 0
    return rss_kb / 1024.0, fds


def sample(server_pid: int, t0_ns: int) -> dict:
    rss, fds = process_usage(server_pid)
    kids = [process_usage(c) for c in _children(server_pid)]
    return {
        "t_s": round((time.monotonic_ns() - t0_ns) / 1e9, 3),
        "rss_mb": round(rss, 2),
        "fds": fds,
        "children_rss_mb": round(sum(r for r, _ in kids), 2),
        "children_fds": sum(f for _, f in kids),
    }


def verdict(samples: list[dict], duration_s: float, warmup_fraction: float) -> dict:
    """Flat or not, for the server (API) process and its children (the engine process) each,
    from the samples after warm-up (the closing sample, taken after the load, is left out)."""
    load = [s for s in samples if s["t_s"] <= duration_s]
    after = [s for s in load if s["t_s"] >= warmup_fraction * duration_s]
    if len(after) < 4:
        return {"flat": None, "reason": "too few samples after warm-up"}
    q = max(1, len(after) // 4)

    def mean(rows: list[dict], key: str) -> float:
        return sum(r[key] for r in rows) / len(rows)

    out: dict = {}
    flat = True
    for who, rss_key, fds_key in (
        ("server", "rss_mb", "fds"),
        ("children", "children_rss_mb", "children_fds"),
    ):
        first, last = mean(after[:q], rss_key), mean(after[-q:], rss_key)
        fds_first, fds_last = mean(after[:q], fds_key), mean(after[-q:], fds_key)
        ok = last - first <= max(FLAT_REL * first, FLAT_ABS_MB) and fds_last <= fds_first + 8
        flat = flat and ok
        out[who] = {
            "flat": ok,
            "rss_mb_after_warmup": round(first, 1),
            "rss_mb_end": round(last, 1),
            "rss_growth_mb": round(last - first, 1),
            "rss_growth_pct": round(100 * (last - first) / first, 2) if first else None,
            "fds_after_warmup": round(fds_first, 1),
            "fds_end": round(fds_last, 1),
        }
    out["flat"] = flat
    out["rule"] = (
        f"per process: the last quarter's mean RSS within max({FLAT_REL:.0%}, {FLAT_ABS_MB:g} "
        "MiB) of the first quarter's after warm-up, and fds back to their level"
    )
    return out


class ProcessSampler:
    """A run_bench sampler: the server's RSS and fds every `interval_s` from the load's t0
    (its samples also go to the run's timeseries.jsonl, source "process")."""

    name = "process"

    def __init__(self, pid: int, interval_s: float):
        self.pid, self.interval_s = pid, interval_s
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0_ns = 0

    def start(self, t0_ns: int, sink) -> None:
        self._t0_ns = t0_ns

        def loop() -> None:
            while True:
                row = sample(self.pid, t0_ns)
                self.samples.append(row)
                sink({"source": "process", **row})
                if self._stop.wait(self.interval_s):
                    return

        self._thread = threading.Thread(target=loop, name="cbbench-soak-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + 5)
            self.samples.append(sample(self.pid, self._t0_ns))  # the end of the load

    def latest(self) -> dict:
        return dict(self.samples[-1]) if self.samples else {}

    def summary(self) -> dict:
        return {"samples": len(self.samples)}


def run_soak(opts: SoakOptions) -> dict:
    from cbbench.harness.load.runner import BenchConfig, run_bench
    from cbbench.harness.servers.launcher import start_reference_server
    from cbbench.workloads.loader import build_from_spec
    from rich.console import Console

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(opts.out_dir) / stamp
    out.mkdir(parents=True, exist_ok=True)
    n = opts.max_requests or max(5_000, int(opts.duration_s * 300))
    workload = build_from_spec(SOAK_WORKLOAD, "soak", "soak workload", 0, n)
    handle = start_reference_server(extra_args=opts.serve_args)
    sampler = ProcessSampler(handle.process.pid, opts.interval_s)
    try:
        cfg = BenchConfig(
            base_url=handle.base_url,
            workload=workload,
            concurrency=opts.streams,
            duration_s=opts.duration_s,
            out_dir=out / "run",
            name="soak",
            timeout_s=max(60.0, opts.duration_s),
            live=False,
            command=list(sys.argv),
        )
        result = run_bench(cfg, [sampler], console=Console(stderr=True, quiet=True))
    finally:
        code = handle.stop()
    samples = sampler.samples
    counts = result.summary.get("counts", {})
    doc = {
        "options": {
            "streams": opts.streams,
            "duration_s": opts.duration_s,
            "interval_s": opts.interval_s,
            "warmup_fraction": opts.warmup_fraction,
            "serve_args": opts.serve_args,
        },
        "requests": {"completed": counts.get("completed"), "failed": counts.get("failed")},
        "server_exit_code": code,
        "verdict": verdict(samples, opts.duration_s, opts.warmup_fraction),
        "samples": samples,
        "run_dir": str(result.run_dir),
    }
    (out / "soak.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    doc["dir"] = str(out)
    return doc


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    serve_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, serve_args = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.studies.soak",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--streams", type=int, default=1000, help="streams in flight (default 1000)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    p.add_argument("--warmup", type=float, default=WARMUP_FRACTION, help="warm-up fraction")
    p.add_argument("--out", type=Path, default=Path("results") / "soak")
    args = p.parse_args(argv)
    if args.streams < 1 or args.duration <= 0 or args.interval <= 0:
        print("soak: error: --streams, --duration and --interval must be positive", file=sys.stderr)
        return 2
    doc = run_soak(
        SoakOptions(args.streams, args.duration, args.interval, args.warmup, args.out, serve_args)
    )
    print(f"{'t (s)':>8} {'RSS MiB':>9} {'fds':>5} {'engine RSS':>11} {'engine fds':>11}")
    for s in doc["samples"]:
        print(
            f"{s['t_s']:8.1f} {s['rss_mb']:9.1f} {s['fds']:5d} {s['children_rss_mb']:11.1f} "
            f"{s['children_fds']:11d}"
        )
    v, r = doc["verdict"], doc["requests"]
    print(f"requests: {r['completed']} completed, {r['failed']} failed")
    print(f"verdict: {json.dumps(v)}")
    print(f"soak folder: {doc['dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
