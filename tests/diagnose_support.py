"""Provoked runs for the diagnosis rules: the reference engine (`cbbench serve`, the tiny
model's shape on the simulated executor, paced to the wall clock) on 127.0.0.1, set up to
show one symptom each, and a healthy run. Small on purpose: a few dozen requests each.
`demo_runs` is `cbbench run` itself on a small cut of its workload.

The simulated executor keeps step times deterministic on a loaded CI machine: a step costs
8 ms + 0.5 ms per sequence + FLOPs x 3.5e-10 s (a 1500-token prompt: ~0.3 s), so symptoms
are large next to scheduling noise.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.servers.launcher import launch_reference_server
from cbbench.harness.telemetry import ServerMetricsSampler, metrics_url_for
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console

HARDWARE = {
    "name": "diag-test",
    "peak_flops": 1.0,
    "mem_bw": 1.0,
    "mem_gb": 1.0,
    "gpu_memory_utilization": 1.0,
    "linear": {"c0": 0.008, "c_flops": 3.5e-10, "c_bytes": 0.0, "c_seq": 0.0005},
}


def hardware_file(folder: Path, **linear: float) -> Path:
    spec = json.loads(json.dumps(HARDWARE))
    spec["linear"].update(linear)
    path = folder / ("hw-" + "-".join(f"{k}{v:g}" for k, v in sorted(linear.items())) + ".json")
    path.write_text(json.dumps(spec), encoding="utf-8")
    return path


def sim_args(hw: Path, *extra: str) -> list[str]:
    return ["--executor", "sim", "--hardware", str(hw), *extra]


def workload(name: str, lengths: list[tuple[int, int]], arrivals: list[float] | None = None):
    reqs = tuple(
        RequestSpec(i, p, o, None if arrivals is None else arrivals[i])
        for i, (p, o) in enumerate(lengths)
    )
    return Workload(name=name, seed=0, requests=reqs)


def bench(
    base_url: str, wl: Workload, out: Path, concurrency: int | None, interval_s: float = 0.1
) -> Path:
    cfg = BenchConfig(
        base_url=base_url,
        workload=wl,
        concurrency=concurrency,
        out_dir=out,
        name=wl.name,
        live=False,
        timeout_s=60.0,
    )
    sampler = ServerMetricsSampler(metrics_url_for(base_url), interval_s=interval_s)
    run_bench(cfg, [sampler], console=Console(file=io.StringIO()))
    return out


def provoke(scenario: str, root: Path) -> Path:
    """Run one scenario into root/scenario and return the run folder."""
    out = root / scenario
    hw = hardware_file(root)
    uniform = [(32, 32)] * 32
    if scenario == "healthy":  # the same step time, none of it host work between steps
        hw = hardware_file(root, c0=0.012, c_seq=0.0)
        server, wl, conc = ["--max-num-seqs", "8"], workload("healthy", uniform), 8
    elif scenario == "scheduling-delay":  # 12 ms host work + 0.5 ms/sequence between steps
        hw = hardware_file(root, c_host=0.012)
        server, wl, conc = ["--max-num-seqs", "8"], workload("sched", [(32, 32)] * 16), 8
    elif scenario == "kv-pressure":
        server = ["--max-num-seqs", "8", "--num-kv-blocks", "12"]
        wl, conc = workload("kv", [(32, 64)] * 24), 8
    elif scenario == "batch-cap":
        server, wl, conc = ["--max-num-seqs", "2"], workload("cap", [(32, 32)] * 20), 8
    elif scenario == "errors":  # a waiting-queue limit of 1 with 8 in flight: HTTP 429s
        server = ["--max-num-seqs", "2", "--max-waiting", "1"]
        wl, conc = workload("errors", [(32, 32)] * 16), 8
    elif scenario == "low-concurrency":
        server, wl, conc = ["--max-num-seqs", "8"], workload("low", [(32, 32)] * 8), 1
    elif scenario == "hol-blocking":  # also length-skew: 2 long of 20
        lengths = [(16, 8)] * 20
        lengths[0] = lengths[10] = (256, 120)
        server = ["--scheduler", "static", "--batch-size", "4", "--drain-timeout", "0.2"]
        wl, conc = workload("hol", lengths), 4
    elif scenario == "queue-delay":
        server = ["--scheduler", "dynamic", "--max-batch-size", "8", "--max-queue-delay", "0.4"]
        wl, conc = workload("queue", [(16, 8)] * 10), 2
    elif scenario == "prefill-stall":
        # 4 long-running streams; a 1500-token prompt arrives every 0.35 s while they run
        lengths = [(16, 200)] * 4 + [(1500, 4)] * 6
        arrivals = [0.0] * 4 + [0.3 + 0.35 * k for k in range(6)]
        server = ["--no-enable-chunked-prefill", "--max-num-batched-tokens", "2048"]
        wl, conc = workload("stall", lengths, arrivals), None
    elif scenario == "pd-interference":
        # 6 decode streams; a 1200-token prompt every 0.5 s among them, chunked 256 at a time
        lengths = [(16, 160)] * 6 + [(1200, 2)] * 6
        arrivals = [0.1 * k for k in range(6)] + [0.4 + 0.5 * k for k in range(6)]
        server = ["--max-num-batched-tokens", "256"]
        wl, conc = workload("pd", lengths, arrivals), None
    elif scenario == "client-bound":
        n = 600  # all at t = 0: the client sends them behind schedule (p50 > 10 ms) however fast it is
        hw = hardware_file(root, c0=0.001, c_seq=0.00001)
        server = ["--max-num-seqs", "256"]
        wl, conc = workload("client", [(8, 2)] * n, [0.0] * n), None
    else:
        raise ValueError(scenario)
    with launch_reference_server("tiny", "continuous", "cpu", sim_args(hw, *server)) as srv:
        return bench(srv.base_url, wl, out, conc)


# the KV pool `cbbench run` gets on the CPU: every one of its B = 8 slots at the tiny model's
# full length (max_model_len 2048, 16-token blocks), so static's reservations fill it exactly
DEMO_KV_BLOCKS = 8 * 2048 // 16


def demo_runs(root: Path, num_requests: int = 48, scale: int = 4) -> dict[str, Path]:
    """`cbbench run` at small scale: `run_demo` itself with its own defaults (tiny model,
    B = 8, all requests at once, the default telemetry) on the demo's workload cut to
    `num_requests` requests with output lengths divided by `scale`. The device is the
    simulated executor (12 ms a step, none of it host work, so the run lasts long enough for
    the 4 Hz telemetry whatever the machine's load) with the CPU's KV pool. Returns
    scheduler -> run folder."""
    from cbbench.harness.studies.run_demo import RUN_WORKLOAD, RunOptions, run_demo

    spec = json.loads(json.dumps(RUN_WORKLOAD))
    spec.update(name="run-demo-small", num_requests=num_requests)
    out = spec["output"]
    out.update(median=out["median"] // scale, max=out["max"] // scale)
    root.mkdir(parents=True, exist_ok=True)
    path = root / "run-demo-small.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    hw = hardware_file(root, c0=0.012, c_seq=0.0)
    engine = {"executor": "sim", "hardware": str(hw), "num_kv_blocks": DEMO_KV_BLOCKS}
    opts = RunOptions(
        workload=str(path), engine=engine, out=root / "demo", report=False, live=False
    )
    res = run_demo(opts, Console(file=io.StringIO()))
    assert not res.interrupted and len(res.run_dirs) == 3, res
    return {d.name: d for d in res.run_dirs}


SCENARIOS = (
    "healthy",
    "kv-pressure",
    "batch-cap",
    "errors",
    "low-concurrency",
    "hol-blocking",
    "queue-delay",
    "prefill-stall",
    "client-bound",
    "scheduling-delay",
)
