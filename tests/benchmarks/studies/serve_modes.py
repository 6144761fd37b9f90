"""The reference server's engine modes side by side, on one machine in one run:

    python -m tests.benchmarks.studies.serve_modes --model small --requests 24 --concurrency 8

Each mode is a `cbbench serve` subprocess (engine in a thread of the API process, or in its
own process; async scheduling off or on). For each: a closed loop of `--concurrency`
streaming completions (fixed prompt and output lengths, ignore_eos) while a prober GETs
/v1/models every 20 ms. The prober is a process of its own, so the load generator's threads
(one GIL) cannot delay its requests: its latencies are the server's. Printed per mode: output
tokens/s, /v1/models p50/p99 under load, and
from the engine's own histograms the step gap p50 and the mean step time (busy time / steps),
so "step gap p50 as a share of the step time" reads off directly. Modes run one after the
other; repeat the command to see the noise of a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from cbbench.harness.servers.launcher import launch_reference_server
from cbbench.harness.telemetry.prom import parse_metrics
from cbbench.harness.telemetry.queue_time import histogram_delta, quantile

MODES = {
    "thread": ["--no-engine-process", "--no-async-scheduling"],
    "thread+async": ["--no-engine-process", "--async-scheduling"],
    "process": ["--engine-process", "--no-async-scheduling"],
    "process+async": ["--engine-process", "--async-scheduling"],
    "process+nice": ["--engine-process", "--no-async-scheduling", "--engine-nice", "10"],
    "process+rt": ["--engine-process", "--no-async-scheduling", "--api-rt-priority", "10"],
}


@dataclass
class ModeResult:
    tokens_per_s: float
    models_p50_ms: float
    models_p99_ms: float
    gap_p50_ms: float | None
    step_mean_ms: float | None
    sched_p50_us: float | None


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run_mode(flags: list[str], args: argparse.Namespace) -> ModeResult:
    extra = [*flags, "--max-num-seqs", str(args.concurrency), "--max-model-len", "1024"]
    with launch_reference_server(args.model, "continuous", "cpu", extra) as server:
        url = server.base_url
        body = {
            "prompt": [7] * args.prompt_len,
            "max_tokens": args.output_len,
            "stream": True,
            "ignore_eos": True,
            "temperature": 0,
        }
        with httpx.Client(timeout=120) as c:  # warm-up: one request
            c.post(url + "/v1/completions", json={**body, "stream": False, "max_tokens": 4})
            before = parse_metrics(c.get(url + "/metrics").text)
        mp = multiprocessing.get_context("spawn")
        stop = mp.Event()
        results = mp.Queue()

        def one(_: int) -> int:
            n = 0
            with (
                httpx.Client(timeout=300) as c,
                c.stream("POST", url + "/v1/completions", json=body) as r,
            ):
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        n += 1
            return n

        prober = mp.Process(target=probe, args=(url, stop, results), daemon=True)
        prober.start()
        assert results.get(timeout=60) == "ready"
        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            chunks = sum(pool.map(one, range(args.requests)))
        wall = time.perf_counter() - t0
        stop.set()
        probes: list[float] = results.get(timeout=30)
        prober.join(5)
        with httpx.Client(timeout=30) as c:
            after = parse_metrics(c.get(url + "/metrics").text)
    assert chunks >= args.requests * args.output_len, "streams ended early"

    def hist(name: str):
        h1 = after.histogram(name)
        return None if h1 is None else histogram_delta(before.histogram(name), h1)

    gap, sched = hist("cbbench:engine_step_gap_seconds"), hist("cbbench:scheduler_time_seconds")
    steps = sched.count if sched is not None else 0
    return ModeResult(
        tokens_per_s=args.requests * args.output_len / wall,
        models_p50_ms=statistics.median(probes) * 1e3,
        models_p99_ms=_percentile(probes, 0.99) * 1e3,
        gap_p50_ms=None if gap is None else (quantile(gap, 0.5) or 0.0) * 1e3,
        step_mean_ms=wall / steps * 1e3 if steps else None,
        sched_p50_us=None if sched is None else (quantile(sched, 0.5) or 0.0) * 1e6,
    )


class _Stamps:
    """A probe's Sink: when the request was written, and the arrival of its last read."""

    def __init__(self) -> None:
        self.sent_ns = self.last_ns = 0
        self.status = 0
        self.send_window_ns: int | None = None
        self.user_read = False

    def sent(self, t: int, connect_ns: int | None, reused: bool | None) -> None:
        self.sent_ns = t

    def head(self, status: int, header) -> None:
        self.status = status

    def data(self, raw: bytes, t: int) -> None:
        self.last_ns = t


async def _probe_loop(url: str, stop, results) -> None:
    from cbbench.harness.client.http1 import H1Pool

    pool = H1Pool(url)  # cbbench's own client: kernel receive stamps, ~50 us of CPU a GET
    req = pool.request_bytes("GET", "/v1/models", {}, b"")
    try:
        await pool.send_request(req, _Stamps())  # connect before the measured phase
        results.put("ready")
        latencies: list[float] = []
        while not stop.is_set():
            s = _Stamps()
            await pool.send_request(req, s, timeout_s=30)
            assert s.status == 200, f"/v1/models answered {s.status}"
            latencies.append((s.last_ns - s.sent_ns) / 1e9)
            await asyncio.sleep(0.02)
    finally:
        pool.close()
    results.put(latencies)


def probe(url: str, stop, results) -> None:
    """The prober process: GET /v1/models every 20 ms until `stop`; puts the latencies, each
    from writing the request to the kernel's receive time of the response's last bytes. With
    httpx here the prober's own CPU (1.7 ms a GET on this 2-core VM, idle server: 0.07 ms)
    was most of what it measured."""
    asyncio.run(_probe_loop(url, stop, results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="small")
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    args = ap.parse_args()
    names = [m for m in args.modes.split(",") if m]
    print(
        f"{'mode':<14} {'tok/s':>7} {'models p50 ms':>13} {'p99 ms':>7} {'gap p50 ms':>10} "
        f"{'step ms':>8} {'gap/step':>8} {'sched p50 us':>12}"
    )
    for name in names:
        r = run_mode(MODES[name], args)
        share = (
            f"{r.gap_p50_ms / r.step_mean_ms:8.1%}"
            if r.gap_p50_ms is not None and r.step_mean_ms
            else f"{'-':>8}"
        )
        print(
            f"{name:<14} {r.tokens_per_s:7.1f} {r.models_p50_ms:13.2f} {r.models_p99_ms:7.2f} "
            f"{r.gap_p50_ms or 0:10.3f} {r.step_mean_ms or 0:8.2f} {share} "
            f"{r.sched_p50_us or 0:12.0f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
