"""What does sampling cost the load generator?  `python -m tests.benchmarks.studies.telemetry_overhead`

Runs the same closed-loop streaming load against the zero-delay scripted server
(`fake_server`, the one `cbbench selftest` uses) with and without the telemetry samplers,
interleaved (off/on, on/off, ...) so drift and warm-up hit both alike. Prints per pair the
requests/s and this process's CPU time per request (which the machine's other load moves far
less than wall-clock throughput), and their median on/off ratios. The samplers scrape a
vLLM-sized Prometheus exposition served by a second process, at the interval given (default
4 Hz). It also prints the CPU one steady-state scrape takes here, times the scrape rate: the
server sampler's share of one core.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
from cbbench.harness.servers.launcher import ready_line, start_server
from cbbench.harness.telemetry import GpuSampler, ServerMetricsSampler
from rich.console import Console
from rich.table import Table

# vLLM's histogram bounds (seconds / tokens), for an exposition the size of a real one.
_LATENCY = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0)
_REQUEST = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
_TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
SAMPLER_SHARE: list[float] = []  # sampler-thread CPU seconds per run second, per "on" run


def vllm_like_exposition() -> bytes:
    """Prometheus text with vLLM's names, types and bucket counts (about a real scrape's size)."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

    r = CollectorRegistry()
    lab = ["model_name"]
    m = "meta-llama/Llama-3.1-8B-Instruct"
    for name, v in (
        ("vllm:num_requests_running", 48),
        ("vllm:num_requests_waiting", 7),
        ("vllm:kv_cache_usage_perc", 0.62),
    ):
        Gauge(name, name, lab, registry=r).labels(m).set(v)
    for name, v in (
        ("vllm:num_preemptions", 3),
        ("vllm:prompt_tokens", 1.2e6),
        ("vllm:generation_tokens", 9.1e5),
        ("vllm:prefix_cache_queries", 1.2e6),
        ("vllm:prefix_cache_hits", 3.1e5),
    ):
        Counter(name, name, lab, registry=r).labels(m).inc(v)
    for name, buckets in (
        ("vllm:time_to_first_token_seconds", _LATENCY),
        ("vllm:inter_token_latency_seconds", _LATENCY),
        ("vllm:e2e_request_latency_seconds", _REQUEST),
        ("vllm:request_queue_time_seconds", _REQUEST),
        ("vllm:request_inference_time_seconds", _REQUEST),
        ("vllm:request_prefill_time_seconds", _REQUEST),
        ("vllm:request_decode_time_seconds", _REQUEST),
        ("vllm:request_prompt_tokens", _TOKENS),
        ("vllm:request_generation_tokens", _TOKENS),
        ("vllm:iteration_tokens_total", _TOKENS),
    ):
        h = Histogram(name, name, lab, buckets=buckets, registry=r).labels(m)
        for i in range(200):
            h.observe(buckets[i % len(buckets)] * 0.9)
    return generate_latest(r)


def serve_metrics() -> int:
    """Child process: serve `vllm_like_exposition()` at /metrics; print `PORT n`."""
    body = vllm_like_exposition()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    print(ready_line("cbbench metrics-server", url), flush=True)
    httpd.serve_forever()
    return 0


class _Child:
    """A server child process, started by the one launcher (ready line on stdout)."""

    def __init__(self, cmd: list[str]) -> None:
        self.handle = start_server(cmd, ready_timeout_s=60.0)
        self.url = self.handle.base_url

    def close(self) -> None:
        self.handle.stop()


def scrape_cpu_s(url: str, n: int) -> tuple[float, int]:
    """CPU seconds (this process) per steady-state sample: GET, parse, map, record."""
    sampler = ServerMetricsSampler(url)
    with httpx.Client(trust_env=False) as client:
        size = len(client.get(url).content)
        sampler._client, sampler._t0_ns = client, time.monotonic_ns()
        sampler._scrape_once()  # the first scrape: full parse and detection
        assert sampler.adapter is not None and sampler.failures == 0
        start = time.process_time()
        for _ in range(n):
            sampler._scrape_once()
        return (time.process_time() - start) / n, size


def bench_once(url: str, metrics_url: str | None, args: argparse.Namespace) -> tuple[float, float]:
    """(requests/s, CPU seconds of this process per completed request) of one run."""
    from cbbench.harness.load.runner import BenchConfig, run_bench
    from cbbench.workloads.spec import RequestSpec, Workload

    wl = Workload(
        "overhead", 0, tuple(RequestSpec(i, 16, args.tokens) for i in range(args.requests))
    )
    samplers = []
    if metrics_url:
        samplers = [
            ServerMetricsSampler(metrics_url, interval_s=args.interval),
            GpuSampler(interval_s=args.interval),
        ]
    with tempfile.TemporaryDirectory(prefix="cbbench-overhead-") as tmp:
        cfg = BenchConfig(
            base_url=url,
            workload=wl,
            concurrency=args.streams,
            warmup=min(args.streams, 64),
            out_dir=str(Path(tmp) / "run"),
            name="overhead",
            live=False,
        )
        cpu0 = time.process_time()
        res = run_bench(cfg, samplers, console=Console(file=io.StringIO()))
        cpu = time.process_time() - cpu0
    if metrics_url:
        server = res.summary["telemetry"]["server"]
        assert server["samples"] > 0 and server["failures"] == 0, server
    done = res.summary["counts"]["completed"]
    assert done > 0, "no request completed"
    if metrics_url:  # the samplers' own thread CPU, per second of run
        used = sum(t.get("cpu_s") or 0.0 for t in res.summary["telemetry"].values())
        SAMPLER_SHARE.append(used / res.summary["duration_s"])
    return float(res.summary["request_throughput"] or 0.0), cpu / done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.studies.telemetry_overhead")
    p.add_argument("--requests", type=int, default=3000, help="requests per measurement")
    p.add_argument("--streams", type=int, default=64, help="closed-loop concurrency")
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--pairs", type=int, default=5, help="off/on measurement pairs")
    p.add_argument("--interval", type=float, default=0.25, help="sampling interval (s)")
    p.add_argument("--serve-metrics", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_metrics:
        return serve_metrics()

    from cbbench.harness.servers.fake_server import Behavior, FakeServerConfig

    console = Console()
    fake = _Child(
        [
            sys.executable,
            "-m",
            "cbbench.harness.servers.fake_server",
            "--config",
            FakeServerConfig(default=Behavior(queue_time_s=None)).to_json(),
        ]
    )
    metrics = _Child(
        [sys.executable, "-m", "tests.benchmarks.studies.telemetry_overhead", "--serve-metrics"]
    )
    try:
        cpu_s, size = scrape_cpu_s(metrics.url + "/metrics", 200)
        table = Table(title=f"load generator with/without samplers at {1 / args.interval:g} Hz")
        for col in ("pair", "off req/s", "on req/s", "on/off", "off CPU ms/req", "on CPU ms/req"):
            table.add_column(col, justify="right")
        wall, cpu = [], []
        for i in range(args.pairs):
            if i % 2 == 0:  # alternate which goes first, so warm-up favours neither
                off = bench_once(fake.url, None, args)
                on = bench_once(fake.url, metrics.url + "/metrics", args)
            else:
                on = bench_once(fake.url, metrics.url + "/metrics", args)
                off = bench_once(fake.url, None, args)
            wall.append(on[0] / off[0])
            cpu.append(on[1] / off[1])
            table.add_row(
                str(i + 1),
                f"{off[0]:.0f}",
                f"{on[0]:.0f}",
                f"{wall[-1]:.4f}",
                f"{off[1] * 1e3:.3f}",
                f"{on[1] * 1e3:.3f}",
            )
    finally:
        fake.close()
        metrics.close()
    console.print(table)
    w, c = statistics.median(wall), statistics.median(cpu)
    console.print(
        f"throughput on/off: median {w:.4f} (spread {min(wall):.4f}..{max(wall):.4f}; wall-clock "
        f"figures move with the machine's other load)"
    )
    console.print(
        f"client CPU per request on/off: median {c:.4f} (spread {min(cpu):.4f}..{max(cpu):.4f}); "
        f"the samplers cost CPU per second, not per request, so the slower the run the larger "
        f"this share"
    )
    share = statistics.median(SAMPLER_SHARE)
    console.print(
        f"sampler threads' own CPU during the 'on' runs: median {100 * share:.2f}% of one core "
        f"(max {100 * max(SAMPLER_SHARE):.2f}%): a load generator that saturates its core "
        f"loses at most that share of its throughput"
    )
    console.print(
        f"one steady-state server sample (GET + parse + map) of a {size / 1024:.1f} KiB "
        f"exposition: {cpu_s * 1e3:.2f} ms CPU; at {1 / args.interval:g} Hz that is "
        f"{100 * cpu_s / args.interval:.2f}% of one core"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
