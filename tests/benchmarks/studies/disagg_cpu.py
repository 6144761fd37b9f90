"""Aggregated vs disaggregated on this CPU, measured and simulated (docs/disaggregation.md).

The same trace (decode streams with long prompts arriving among them) against two
deployments of the same CPU budget, two one-thread engines each: `cbbench serve --replicas 2`
(least-outstanding router) and `cbbench serve --prefill-replicas 1 --decode-replicas 1`.
Runs alternate (A, D, A, D, ...) so a neighbour's load on a shared machine hits both. Then
both are simulated (`router/pd_sim.py`) from measurements only, nothing fitted on the
figures compared: this host's `cbbench calibrate` at one torch thread (CPU clock; run once,
cached in --out), each engine's wait for a core (the kernel's schedstat, over the run and as
a 0.1 s timeline), and the KV hand-off from the decode workers' phase stamps. Prints ITL p99,
TTFT p50, TPOT p50 per run, their medians, each simulation with its error, the phases and
the engines' CPU measured vs simulated, and whether the worst error is within 15 %; writes
OUT/disagg_cpu.json. About 6 minutes with the calibration, 1 a run after it.

    python -m tests.benchmarks.studies.disagg_cpu --repeats 2 --out /tmp/disagg
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.planning.pd_handoff import fit_handoff_runs
from cbbench.harness.servers.launcher import start_server
from cbbench.reference_engine.config.options import SIM_DEFAULTS, build_engine_config
from cbbench.reference_engine.execution.cost_model import get_hardware
from cbbench.reference_engine.execution.kv_import import describe as describe_import
from cbbench.reference_engine.execution.kv_link import get_link
from cbbench.reference_engine.router.options import POLL_INTERVAL_S
from cbbench.reference_engine.router.pd_sim import simulate_pd
from cbbench.reference_engine.sim.request_overhead import overhead_of, with_overhead
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console

MODEL = "small"
DEPLOYMENTS = {
    "aggregated": ["--replicas", "2"],
    "disaggregated": ["--prefill-replicas", "1", "--decode-replicas", "1"],
}


def trace(duration_s: float, stream_every_s: float, long_every_s: float, long_len: int,
          stream_out: int, arrivals: str = "poisson", seed: int = 0) -> Workload:  # fmt: skip
    """Decode streams (32-token prompts, `stream_out` tokens), one every `stream_every_s` on
    average, and long prompts (`long_len` tokens, 4 out), one every `long_every_s`: Poisson
    arrivals (seeded), or `periodic` (offset by half a period). A periodic trace lets a
    deterministic replay place every long prompt where no stream runs (the simulated ITL
    then has no tail at all), while the real servers' jitter makes them meet now and then:
    the tail the comparison is about must come from collisions both sides see."""
    import numpy as np

    rng = np.random.default_rng(seed)
    reqs: list[tuple[float, int, int]] = []
    for every, start, plen, out in ((stream_every_s, 0.0, 32, stream_out),
                                    (long_every_s, long_every_s / 2, long_len, 4)):  # fmt: skip
        t = start if arrivals == "periodic" else float(rng.exponential(every))
        while t < duration_s:
            reqs.append((t, plen, out))
            t += every if arrivals == "periodic" else float(rng.exponential(every))
    reqs.sort()
    specs = tuple(RequestSpec(i, p, o, arrival_s=a) for i, (a, p, o) in enumerate(reqs))
    return Workload("pd-mix", seed, specs)


def _engines(pid: int) -> dict[int, str]:
    """The deployment's engine processes (multiprocessing children of the workers), each with
    its worker's role: prefill, decode or both."""
    import psutil

    out = {}
    for proc in psutil.Process(pid).children(recursive=True):
        try:
            cmd = " ".join(proc.cmdline())
            if "spawn_main" not in cmd:
                continue
            up = " ".join(" ".join(a.cmdline()) for a in proc.parents())
        except psutil.Error:
            continue
        out[proc.pid] = next((r for r in ("prefill", "decode") if f"--role {r}" in up), "both")
    return out


def _schedstat(pid: int) -> tuple[float, float]:
    """(CPU s, runnable-but-waiting s) of all the process's threads (/proc/PID/task/*/schedstat:
    the kernel's own accounting of time on a core and time queued for one)."""
    run = wait = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            a, b, _ = (task / "schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        run, wait = run + int(a) / 1e9, wait + int(b) / 1e9
    return run, wait


class _Timeline:
    """Every engine's schedstat every `every_s` while the run lasts (a thread)."""

    def __init__(self, pids: list[int], every_s: float = 0.1):
        import threading

        self.pids, self.every_s, self.rows = pids, every_s, []  # (t, {pid: (run, wait)})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        import time

        t0 = time.monotonic()
        while True:
            self.rows.append((time.monotonic() - t0, {p: _schedstat(p) for p in self.pids}))
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> _Timeline:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5.0)


SPAN = 3  # samples a contention window spans (0.3 s)


def load_timeline(run_dir: Path) -> dict | None:
    """A run's contention timeline from its contention.json (None for older runs)."""
    f = run_dir / "contention.json"
    if not f.exists():
        return None
    d = json.loads(f.read_text())
    engines = {int(p): role for p, role in d["engines"]}
    pids = list(engines)
    rows = [(t, {p: tuple(v) for p, v in zip(pids, vals, strict=True)}) for t, vals in d["rows"]]
    return _by_role(rows, engines, SPAN)


def _by_role(rows: list, engines: dict[int, str], span: int = SPAN) -> dict[str, list]:
    """Per role (a list, one per engine): [(t, slowdown)] over windows of `span` samples;
    a window where the engine ran under 5 ms gets None (idle: its average applies)."""
    out: dict[str, list] = {}
    for p, role in engines.items():
        series = []
        for (t0, a), (_, b) in zip(rows, rows[span:], strict=False):
            run = b[p][0] - a[p][0]
            wait = b[p][1] - a[p][1]
            series.append((t0, (run + wait) / run if run > 0.005 else None))
        out.setdefault(role, []).append(series)
    return out


def _step_fn(series: list, mean: float):
    """slowdown(t) from a timeline: the window that starts at or before t."""
    import bisect

    ts = [t for t, _ in series]
    vals = [mean if f is None else f for _, f in series]

    def f(t: float) -> float:
        i = bisect.bisect_right(ts, t) - 1
        return vals[i] if 0 <= i < len(vals) else mean

    return f


def measure(mode: str, wl: Workload, out: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "cbbench.harness.cli", "serve", "--model", MODEL,
           "--host", "127.0.0.1", "--port", "0", *DEPLOYMENTS[mode], *extra]  # fmt: skip
    handle = start_server(cmd, 300.0, name=f"{mode} deployment")
    try:
        engines = _engines(handle.process.pid)
        before = {p: _schedstat(p) for p in engines}
        cfg = BenchConfig(base_url=handle.base_url, workload=wl, out_dir=out, live=False,
                          model=MODEL)  # fmt: skip
        with _Timeline(list(engines)) as timeline:
            res = run_bench(cfg, console=Console(file=io.StringIO()))
        after = {p: _schedstat(p) for p in engines}
    finally:
        handle.stop()
    # each engine's host contention: (on a core + queued for one) / on a core while it ran
    slowdown: dict[str, list[float]] = {}
    for p, role in engines.items():
        run, wait = (a - b for a, b in zip(after[p], before[p], strict=True))
        if run > 0:
            slowdown.setdefault(role, []).append((run + wait) / run)
    (out / "contention.json").write_text(json.dumps(  # raw, for a replay with --from-json
        {"engines": list(engines.items()), "every_s": timeline.every_s,
         "rows": [[t, [list(x[p]) for p in engines]] for t, x in timeline.rows]}))  # fmt: skip
    s = res.summary
    return {"itl_p99": s["itl_s"]["p99"], "ttft_p50": s["ttft_s"]["p50"],
            "tpot_p50": s["tpot_s"]["p50"], "failed": s["counts"]["failed"],
            "slowdown": {r: statistics.mean(v) for r, v in slowdown.items()},
            "timeline": _by_role(timeline.rows, engines, SPAN),
            "engine_cpu_s": {r: sum(after[p][0] - before[p][0] for p in engines
                                    if engines[p] == r) for r in set(engines.values())},
            "phases": s.get("phases")}  # fmt: skip


def simulate(mode: str, wl: Workload, extra: dict, link: str = "loopback",
             slowdown: dict[str, float] | None = None, timeline: dict | None = None,
             seed: int = 0, base: float = 1.0) -> dict:  # fmt: skip
    """The deployment simulated; `slowdown` (role -> factor, measured host contention) runs
    each pool's steps that many times as long (the engine's calibrated time on a core of its
    own, times the wait for a core the kernel measured); `seed`: the step jitter's draws;
    `base`: the hardware's own wait for a core (its steps carry it), the timeline divided by it."""
    hw = extra["hardware"]
    slow = slowdown or {}

    def config(role: str):
        f = slow.get(role, 1.0)
        return replace(build_engine_config({"model": MODEL, **extra, "hardware": f"{hw}@{f:.4f}"},
                                           SIM_DEFAULTS, scheduler="continuous"), seed=seed)  # fmt: skip

    roles = ["both", "both"] if mode == "aggregated" else ["prefill", "decode"]
    fns = None
    if timeline:  # each worker's contention over time, as its engine met it in the run
        slow, seen = {}, {r: 0 for r in roles}
        fns = []
        for r in roles:
            series = timeline[r][seen[r]]
            seen[r] += 1
            known = [f for _, f in series if f is not None] or [1.0]
            fns.append(_step_fn([(t, None if f is None else f / base) for t, f in series],
                                statistics.mean(known) / base))  # fmt: skip
    if mode == "aggregated":
        p, d, cfg, pcfg = 0, 2, config("both"), None
    else:
        p, d, cfg, pcfg = 1, 1, config("decode"), config("prefill")
    # a from-run fit's time outside the steps (HTTP, tokenizing), paid per request as sim and
    # plan pay it (zero for `cbbench calibrate`'s step-only fit)
    over = overhead_of(get_hardware(hw))
    res = with_overhead(wl.requests, over, lambda reqs: simulate_pd(
        reqs, cfg, p, d, get_link(link), token_times=True, prefill_config=pcfg,
        prefix_block_size=wl.prefix_block_size, seed=wl.prompt_seed, slowdown=fns,
        poll_interval_s=POLL_INTERVAL_S),
        p + d if mode == "aggregated" else 1)  # fmt: skip
    s = res.summary()
    return {
        "itl_p99": s["itl_s"]["p99"],
        "ttft_p50": s["ttft_s"]["p50"],
        "tpot_p50": s["tpot_s"]["p50"],
        "busy_s": [t.busy_s for t in res.replicas],  # prefill workers first
        "phases_p50": {k: v["p50"] for k, v in s.get("phases", {}).items()},
    }


def calibration(out: Path, given: str | None, recalibrate: bool, clock: str) -> str:
    """This host's step-time model for `small` at one torch thread, as the study's engines run:
    `cbbench calibrate` (the reference engine's own steps timed and fitted), cached in the out
    folder so a rerun reuses it; `given` (a calibrate JSON) skips it. Nothing in it is fitted
    on the study's outcome."""
    if given:
        return given
    path = out / f"calibration-{MODEL}-cpu-1thread-{clock}.json"
    if path.exists() and not recalibrate:
        print(f"calibration: reusing {path} (--recalibrate to refit)", flush=True)
        return str(path)
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "cbbench.harness.cli", "calibrate", "--model", MODEL,
           "--threads", "1", "--clock", clock, "--out", str(path)]  # fmt: skip
    print("calibration: " + " ".join(cmd[2:]) + " (a few minutes)", flush=True)
    env = {**os.environ, "CBBENCH_TORCH_THREADS": "1"}
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=1800)  # fmt: skip
    if done.returncode != 0 or not path.exists():
        sys.exit(f"calibrate failed ({done.returncode}):\n{done.stdout[-2000:]}")
    return str(path)


# the from-run calibration's own workload: not the study's trace (other prompt and output
# lengths, Poisson arrivals), at two rates, against one served engine as a replica runs
CAL_SPEC = {"prompt": {"dist": "uniform", "min": 16, "max": 320},
            "output": {"dist": "uniform", "min": 8, "max": 96}}  # fmt: skip
CAL_RATES = (1.0, 2.5)
CAL_REQUESTS = 48
CAL_CONTENTION = "engine_contention.json"  # in each calibration run's folder


def calibration_contention(out: Path, extra: list[str]) -> float | None:
    """The from-run calibration engine's own wait for a core (mean over its runs): the
    from-run fit's steps carry it, so the deployment's timeline is taken relative to it.
    None where the runs did not record it (before 6 December, v56)."""
    tag = "-".join(x.lstrip("-") for x in extra)
    found = [json.loads(f.read_text())["slowdown"] for k in range(len(CAL_RATES))
             for f in (out / f"calibration-run-{tag}-{k}" / CAL_CONTENTION,
                       out / f"calibration-run-{k}" / CAL_CONTENTION) if f.exists()]  # fmt: skip
    return statistics.mean(found) if found else None


def calibration_from_run(out: Path, extra: list[str], recalibrate: bool) -> str:
    """This host's SERVED engine fitted as any server is (`cbbench calibrate --from-run`,
    issue #53): one `cbbench serve` engine (a replica of the aggregated deployment, same
    settings) benched on CAL_SPEC at CAL_RATES, the runs fitted. Cached in the out folder.
    The step terms then carry what the served path adds to a step (the engine loop, IPC,
    the API process on the other core), which `cbbench calibrate` (steps timed in-process)
    does not see; the fit's request overhead (HTTP, tokenizing) is paid per request."""
    tag = "-".join(x.lstrip("-") for x in extra)  # the engine settings: a cache per setting
    path = out / f"calibration-{MODEL}-from-run-jitter-server-ttft-{tag}.json"
    if path.exists() and not recalibrate:
        print(f"calibration: reusing {path} (--recalibrate to refit)", flush=True)
        return str(path)
    out.mkdir(parents=True, exist_ok=True)
    folders = [out / f"calibration-run-{tag}-{k}" for k in range(len(CAL_RATES))]
    legacy = [out / f"calibration-run-{k}" for k in range(len(CAL_RATES))]  # before the tag
    if not recalibrate and not all((f / "run.json").exists() for f in folders) and all(
            (f / "run.json").exists() for f in legacy):  # fmt: skip
        folders = legacy  # a saved study's runs: refit them, bench nothing
    if recalibrate or not all((f / "run.json").exists() for f in folders):
        _bench_calibration_runs(out, extra, folders)
    fit = [sys.executable, "-m", "cbbench.harness.cli", "calibrate", "--from-run",
           *map(str, folders), "--model", MODEL, "--dtype", "float32", "--holdout", "0",
           "--step-jitter", "--server-ttft", "--out", str(path)]  # fmt: skip
    done = subprocess.run(fit, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=1800)  # fmt: skip
    print(done.stdout[-3000:], flush=True)
    if done.returncode != 0 or not path.exists():
        sys.exit(f"calibrate --from-run failed ({done.returncode})")
    return str(path)


def _bench_calibration_runs(out: Path, extra: list[str], folders: list[Path]) -> None:
    """CAL_SPEC at CAL_RATES against one served engine with the deployments' settings."""
    spec = out / "calibration-spec.json"
    spec.write_text(json.dumps({"num_requests": CAL_REQUESTS, **CAL_SPEC}))
    cmd = [sys.executable, "-m", "cbbench.harness.cli", "serve", "--model", MODEL,
           "--host", "127.0.0.1", "--port", "0", *extra]  # fmt: skip
    handle = start_server(cmd, 300.0, name="calibration engine")
    try:
        engines = list(_engines(handle.process.pid))
        for k, (rate, folder) in enumerate(zip(CAL_RATES, folders, strict=True)):
            shutil.rmtree(folder, ignore_errors=True)
            bench = [sys.executable, "-m", "cbbench.harness.cli", "bench", "--base-url",
                     handle.base_url, "--no-live", "--seed", str(10 + k), "--arrival", "poisson",
                     "--workload", str(spec), "--rate", str(rate), "--num-requests",
                     str(CAL_REQUESTS), "--out", str(folder)]  # fmt: skip
            print(f"calibration run {k}: {CAL_REQUESTS} requests at {rate}/s", flush=True)
            before = [_schedstat(p) for p in engines]
            subprocess.run(bench, check=True, timeout=900, stdout=subprocess.DEVNULL)
            after = [_schedstat(p) for p in engines]
            run = sum(y[0] - x[0] for x, y in zip(before, after, strict=True))
            wait = sum(y[1] - x[1] for x, y in zip(before, after, strict=True))
            if run > 0:  # the calibration engine's own wait for a core, as measure() reads it
                (folder / CAL_CONTENTION).write_text(json.dumps({"slowdown": (run + wait) / run}))
    finally:
        handle.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--duration", type=float, default=40.0, help="trace length, s")
    ap.add_argument("--stream-every", type=float, default=1.0)
    ap.add_argument("--long-every", type=float, default=2.0)
    ap.add_argument("--long-len", type=int, default=256)
    ap.add_argument("--stream-out", type=int, default=64)
    ap.add_argument("--arrivals", default="poisson", choices=["poisson", "periodic"],
                    help="the trace's arrivals (poisson, seeded by --seed; periodic: the "
                    "study before 6 December)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=64,
        help="both deployments' chunked-prefill budget (64)",
    )
    ap.add_argument("--out", default="/tmp/cbbench-disagg")
    ap.add_argument(
        "--from-json",
        default=None,
        help="reuse the measured runs of an earlier disagg_cpu.json (simulate only)",
    )
    ap.add_argument("--calibration", default=None, metavar="JSON",
                    help="a `cbbench calibrate` JSON to simulate with (default: calibrate "
                    "once, cached in --out)")  # fmt: skip
    ap.add_argument("--recalibrate", action="store_true", help="refit the cached calibration")
    ap.add_argument("--from-run-calibration", action="store_true",
                    help="also fit the served engine from two benched runs of another workload "
                    "(calibrate --from-run) and simulate with that fit")  # fmt: skip
    ap.add_argument("--sim-seeds", type=int, default=5,
                    help="jitter seeds the from-run simulations take the median over (5)")
    ap.add_argument("--clock", default="cpu", choices=["wall", "cpu"],
                    help="calibrate's clock (cpu, default: a step's time on a core of its own; "
                    "the wait for a core is measured on the deployment's engines)")  # fmt: skip
    args = ap.parse_args()
    os.environ.setdefault("CBBENCH_TORCH_THREADS", "1")  # one thread an engine: same budget
    wl = trace(args.duration, args.stream_every, args.long_every, args.long_len,
               args.stream_out, args.arrivals, args.seed)  # fmt: skip
    out = Path(args.out)
    runs: dict[str, list[dict]] = {m: [] for m in DEPLOYMENTS}
    hw_path = calibration(out, args.calibration, args.recalibrate, args.clock)
    serve_extra = ["--max-model-len", "2048", "--max-num-batched-tokens",
                   str(args.max_num_batched_tokens)]  # fmt: skip
    fr_path = (calibration_from_run(out, serve_extra, args.recalibrate)
               if args.from_run_calibration else None)  # fmt: skip
    cal_wait = calibration_contention(out, serve_extra) if fr_path else None
    if args.from_json:  # several: their runs pooled (folders beside each json)
        for path in args.from_json.split(","):
            earlier = json.loads(Path(path).read_text())
            for m in DEPLOYMENTS:
                for k, r in enumerate(earlier[m]["runs"]):
                    run_dir = Path(path).parent / f"{m}-{k}"
                    runs[m].append({**r, "dir": str(run_dir), "timeline": load_timeline(run_dir)})
    for k in range(0 if args.from_json else args.repeats):
        for mode in DEPLOYMENTS:
            shutil.rmtree(out / f"{mode}-{k}", ignore_errors=True)  # an earlier study's run
            r = measure(
                mode,
                wl,
                out / f"{mode}-{k}",
                [
                    "--max-model-len",
                    "2048",
                    "--max-num-batched-tokens",
                    str(args.max_num_batched_tokens),
                ],
            )
            runs[mode].append({**r, "dir": str(out / f"{mode}-{k}")})
            print(f"{mode} run {k}: " + json.dumps({x: r[x] for x in r if x not in ("phases", "dir", "timeline")}),
                  flush=True)  # fmt: skip
    engine = {"max_model_len": 2048, "max_num_batched_tokens": args.max_num_batched_tokens}
    med = {m: {k: statistics.median(r[k] for r in runs[m]) for k in ("itl_p99", "ttft_p50",
           "tpot_p50")} for m in DEPLOYMENTS}  # fmt: skip
    # the simulator's only inputs: this host's calibration (the engine's steps timed alone)
    # and the KV hand-off as the disaggregated requests' phase stamps measured it
    pd_dirs = [Path(r["dir"]) for r in runs["disaggregated"]]
    pull = fit_handoff_runs(pd_dirs, pull_only=True)
    # the hand-off (the pull and what its stamp leaves out), less each hardware's overhead
    link = fit_handoff_runs(pd_dirs, overhead_of(get_hardware(hw_path)))
    fr_link = fit_handoff_runs(pd_dirs, overhead_of(get_hardware(fr_path))) if fr_path else None
    # host contention per pool, as the kernel measured it on the engines (median over runs)
    slow = {m: {role: statistics.median(r["slowdown"][role] for r in runs[m]
                                         if role in r.get("slowdown", {}))
                for role in {x for r in runs[m] for x in r.get("slowdown", {})}}
            for m in DEPLOYMENTS}  # fmt: skip
    print(f"\nhardware: {hw_path} (cbbench calibrate, 1 torch thread)")
    print(f"KV link fitted on the measured pulls alone: {pull}; on the hand-off (TTFT less "
          f"its prefill queue, prefill, decode queue and the fit's request overhead): {link}"
          + (f" (from-run fit: {fr_link})" if fr_link else ""))  # fmt: skip
    print(describe_import(get_hardware(fr_path or hw_path)) + "; the link is the measured "
          "hand-off: the request overhead paid once")  # fmt: skip
    print("host contention (engine time on a core + queued for one) / on a core, median: "
          + "; ".join(f"{m} " + ", ".join(f"{r} {f:.2f}x" for r, f in sorted(slow[m].items()))
                      for m in DEPLOYMENTS))  # fmt: skip
    print("\n| deployment | ITL p99 (ms) | TTFT p50 (ms) | TPOT p50 (ms) |")
    print("|---|---:|---:|---:|")
    result: dict = {"hardware": hw_path, "link": link, "link_pull": pull,
                    "link_from_run": fr_link, "slowdown": slow}  # fmt: skip
    keys = ("itl_p99", "ttft_p50", "tpot_p50")
    for mode in DEPLOYMENTS:
        m = med[mode]
        hw = {**engine, "hardware": hw_path}
        alone = simulate(mode, wl, hw, link)
        sim = simulate(mode, wl, hw, link, slow[mode])
        timed = [simulate(mode, wl, hw, link, timeline=r["timeline"]) for r in runs[mode]
                 if r.get("timeline")]  # fmt: skip
        over_time = ({k: statistics.median(x[k] for x in timed) for k in keys}
                     if timed else None)  # fmt: skip
        result[mode] = {"measured": m, "runs": [{k: v for k, v in r.items() if k != "timeline"}
                                                for r in runs[mode]],
                        "simulated": sim, "simulated_uncontended": alone,
                        "simulated_timeline": over_time}  # fmt: skip
        each = ", ".join(f"{r['itl_p99'] * 1e3:.0f}" for r in runs[mode])
        print(f"| {mode} measured (median of {len(runs[mode])}; ITL p99 each: {each}) | "
              + " | ".join(f"{m[k] * 1e3:.1f}" for k in keys) + " |")  # fmt: skip
        rows = [("SIMULATED, calibration alone", alone),
                ("SIMULATED, calibration x measured contention", sim)]
        if over_time:
            rows.append(("SIMULATED, calibration x contention over time", over_time))
        if fr_path:  # the served engine fitted from runs of another workload (#53)
            # a jittered replay is one sample: the median over --sim-seeds jitter seeds
            seeds = range(args.sim_seeds)
            each = [simulate(mode, wl, {**engine, "hardware": fr_path}, fr_link or link,
                             seed=k) for k in seeds]  # fmt: skip
            fr = {**each[0], **{k: statistics.median(y[k] for y in each) for k in keys}}
            result[mode]["simulated_from_run"] = fr
            result[mode]["simulated_from_run_seeds"] = [{k: y[k] for k in keys} for y in each]
            rows.append((f"SIMULATED, from-run fit of the served engine (median of "
                         f"{len(each)} jitter seeds)", fr))  # fmt: skip
            print(f"  from-run fit over {len(each)} jitter seeds, {mode}: ITL p99 " + ", ".join(
                f"{y['itl_p99'] * 1e3:.1f}" for y in each) + "; TTFT p50 " + ", ".join(
                f"{y['ttft_p50'] * 1e3:.1f}" for y in each))  # fmt: skip
            frt = [simulate(mode, wl, {**engine, "hardware": fr_path}, fr_link or link,
                            timeline=r["timeline"], seed=k, base=cal_wait or 1.0)
                   for r in runs[mode] if r.get("timeline") for k in seeds]  # fmt: skip
            if frt:  # and each engine's wait for a core over time, as in this deployment
                x = {k: statistics.median(y[k] for y in frt) for k in keys}
                result[mode]["simulated_from_run_timeline"] = x
                rows.append(("SIMULATED, from-run fit x contention over time" + (
                    f" / the calibration engine's {cal_wait:.2f}x" if cal_wait else
                    " (upper bound: the calibration engine's own wait not recorded)"), x))  # fmt: skip
        for label, x in rows:
            print(f"| {mode} {label} (error) | " + " | ".join(
                f"{x[k] * 1e3:.1f} ({x[k] / m[k] - 1:+.0%})" for k in keys) + " |")  # fmt: skip
        if sim["phases_p50"]:  # where a disaggregated request's time goes, p50 per phase
            got_ph = {k: statistics.median(r["phases"][k]["p50"] for r in runs[mode])
                      for k in sim["phases_p50"] if all(r.get("phases") for r in runs[mode])}  # fmt: skip
            print("  phases p50 (ms), measured / simulated: " + ", ".join(
                f"{k[:-2]} {got_ph[k] * 1e3:.0f} / {v * 1e3:.0f}"
                for k, v in sim["phases_p50"].items() if k in got_ph and v is not None))  # fmt: skip
        cpu = [r.get("engine_cpu_s", {}) for r in runs[mode]]
        got = statistics.median(sum(c.values()) for c in cpu) if cpu else float("nan")
        roles = ["both", "both"] if mode == "aggregated" else ["prefill", "decode"]
        want = sum(b / slow[mode].get(r, 1.0) for b, r in zip(sim["busy_s"], roles, strict=True))
        print(f"  engines' CPU: measured {got:.1f} s (median over runs), simulated {want:.1f} s "
              f"(the contended simulation's busy time on a core)")  # fmt: skip
    a, d = result["aggregated"], result["disaggregated"]
    for variant in ("simulated", "simulated_from_run", "simulated_from_run_timeline"):
        if variant not in a:
            continue
        for key in ("itl_p99", "ttft_p50"):
            m = d["measured"][key] / a["measured"][key]
            s = d[variant][key] / a[variant][key]
            print(f"{key}: disaggregated / aggregated = {m:.2f} measured, {s:.2f} {variant} "
                  f"({s / m - 1:+.0%}); same order: {(m < 1) == (s < 1)}")  # fmt: skip
    for variant in ("simulated", "simulated_timeline", "simulated_from_run",
                    "simulated_from_run_timeline"):
        if any(result[x].get(variant) is None for x in DEPLOYMENTS):
            continue
        worst = max(abs(result[x][variant][k] / result[x]["measured"][k] - 1)
                    for x in DEPLOYMENTS for k in ("itl_p99", "ttft_p50"))  # fmt: skip
        result[f"worst_error_{variant}"] = worst
        how = {"simulated": "one factor a pool", "simulated_timeline": "contention over time",
               "simulated_from_run": "from-run fit of the served engine",
               "simulated_from_run_timeline": "from-run fit x contention over time"}[variant]
        print(f"worst |error| on ITL p99 and TTFT p50 ({how}): {worst:.0%} "
              f"({'within' if worst <= 0.15 else 'NOT within'} 15 %)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "disagg_cpu.json").write_text(json.dumps(result, indent=2))
    print(f"wrote {out / 'disagg_cpu.json'}")


if __name__ == "__main__":
    main()
