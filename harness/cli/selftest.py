"""`cbbench selftest`: how fast and how exact is this client, on this machine?

Starts the zero-delay scripted server (`fake_server`) in a separate process on 127.0.0.1 and
runs closed-loop streaming load against it at each (streams, workers) setting. Prints per
setting requests/s, output tokens/s per worker process and the timing error: client receive
time minus the server's own send time of each chunk (both CLOCK_MONOTONIC), p50 and p99.
Whatever the client cannot do here, it cannot do against a real server either: when a real
run gets near these figures, the client, not the server, sets the pace. Against a zero-delay
server any backlog at the ceiling shows up as timing error; `--itl-ms 20` paces the server
instead, to measure the timing error at a load the client can carry.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile

import numpy as np
from cbbench.harness.errors import CbbenchError
from cbbench.harness.fake_server import Behavior, FakeServerConfig
from cbbench.harness.runner import BenchConfig, run_bench
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console
from rich.table import Table


def _int_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers >= 1")
    return out


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("selftest", help="measure the client's own ceiling and timing error locally")
    p.add_argument("--streams", type=_int_list, default=[1, 64, 256], help="e.g. 1,64,256")
    p.add_argument("--workers", type=_int_list, default=[1, 2], help="e.g. 1,2")
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--requests", type=int, default=2000, help="at most this many per setting")
    p.add_argument("--seconds", type=float, default=5.0, help="at most this long per setting")
    p.add_argument("--http-client", choices=("raw", "httpx"), default="raw")
    p.add_argument(
        "--itl-ms",
        type=float,
        default=0.0,
        help="server gap between tokens (default 0: as fast as it can; e.g. 20 for a paced load)",
    )
    p.add_argument(
        "--server-procs", type=int, default=1, help="fake-server processes (SO_REUSEPORT)"
    )
    p.add_argument(
        "--compare",
        choices=("locust",),
        help="client cost side by side: Locust's FastHttpUser, then cbbench, on the same "
        "zero-delay server at the first --streams value; prints requests per client CPU-second",
    )
    p.set_defaults(func=run)


def run_compare(args: argparse.Namespace) -> int:
    from cbbench.harness.locust_compare import compare

    streams = args.streams[0]
    config = FakeServerConfig(default=Behavior(itl_s=0.0, queue_time_s=None))
    with ServerProcess(config, args.server_procs) as server:
        res = compare(server.url, streams, args.tokens, args.seconds)
    table = Table(
        title=f"client cost: zero-delay local server, {streams} streams, "
        f"{args.tokens} tokens/request, {args.seconds:g} s each"
    )
    for col in ("client", "requests", "failed", "CPU s", "wall s", "req per CPU-s"):
        table.add_column(col, justify="right")
    for c in (res["locust"], res["cbbench"]):
        table.add_row(
            c.name,
            str(c.requests),
            str(c.failed),
            f"{c.cpu_s:.2f}",
            f"{c.wall_s:.2f}",
            f"{c.requests_per_cpu_s:.0f}",
        )
    console = Console(width=max(Console().width, 100))
    console.print(table)
    ratio = res["ratio"]
    console.print(
        "cbbench / Locust requests per client CPU-second: "
        + ("-" if ratio is None else f"{ratio:.2f}x")
    )
    return 0


class ServerProcess:
    """The fake server in its own Python process; context manager."""

    def __init__(self, config: FakeServerConfig, procs: int = 1) -> None:
        self.config = config
        self.procs = procs
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> ServerProcess:
        cmd = [
            sys.executable,
            "-m",
            "cbbench.harness.fake_server",
            "--config",
            self.config.to_json(),
        ]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.__exit__()
            raise CbbenchError("selftest: the local test server did not start")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def measure(
    url: str,
    streams: int,
    workers: int,
    tokens: int,
    requests: int,
    seconds: float,
    http_client: str = "raw",
) -> dict:
    n = max(requests, 1)
    wl = Workload("selftest", 0, tuple(RequestSpec(i, 16, tokens) for i in range(n)))
    with tempfile.TemporaryDirectory(prefix="cbbench-selftest-") as tmp:
        cfg = BenchConfig(
            base_url=url,
            workload=wl,
            concurrency=streams,
            duration_s=seconds,
            warmup=min(streams, 64),
            workers=workers,
            out_dir=os.path.join(tmp, "run"),
            name=f"selftest-s{streams}-w{workers}",
            live=False,
            collect_server_times=True,
            http_client=http_client,
        )
        res = run_bench(cfg, console=Console(file=io.StringIO()))
    workers = res.meta["load"]["workers"]  # never more than streams
    errs = [
        d
        for r in res.records
        if r.ok and not r.warmup
        for d in r.extra.get("recv_minus_send_s", [])
    ]
    err = np.asarray(errs) * 1e3
    s = res.summary
    return {
        "streams": streams,
        "workers": workers,
        "http_client": http_client,
        "requests": s["counts"]["completed"],
        "failed": s["counts"]["failed"],
        "requests_per_s": s["request_throughput"] or 0.0,
        "tokens_per_s": s["output_throughput"] or 0.0,
        "tokens_per_s_per_worker": (s["output_throughput"] or 0.0) / workers,
        "timing_error_ms_p50": float(np.percentile(err, 50)) if err.size else None,
        "timing_error_ms_p99": float(np.percentile(err, 99)) if err.size else None,
        "client_cpu_mean": s["client"]["cpu"]["mean"],
        # the ceiling per core whatever the server's speed: tokens per second of client CPU
        "tokens_per_client_cpu_s": (
            (s["output_throughput"] or 0.0) / (s["client"]["cpu"]["mean"] * workers)
            if s["client"]["cpu"]["mean"]
            else None
        ),
    }


def run(args: argparse.Namespace) -> int:
    if min(args.tokens, args.requests, args.server_procs) < 1 or args.seconds <= 0:
        raise CbbenchError("selftest: --tokens, --requests, --seconds, --server-procs must be > 0")
    if args.compare:
        return run_compare(args)
    console = Console(width=max(Console().width, 120))
    table = Table(
        title=f"cbbench selftest: local server, {args.itl_ms:g} ms between tokens, "
        f"{args.tokens} tokens/request, "
        f"{args.http_client} client; timing error in ms"
    )
    for col in (
        "streams",
        "workers",
        "requests",
        "req/s",
        "tok/s",
        "tok/s per worker",
        "err p50",
        "err p99",
        "client CPU",
        "tok per CPU-s",
    ):
        table.add_column(col, justify="right")
    if args.itl_ms < 0:
        raise CbbenchError("selftest: --itl-ms must be >= 0")
    config = FakeServerConfig(default=Behavior(itl_s=args.itl_ms / 1e3, queue_time_s=None))
    with ServerProcess(config, args.server_procs) as server:
        for w in args.workers:
            for s in args.streams:
                m = measure(
                    server.url, s, w, args.tokens, args.requests, args.seconds, args.http_client
                )
                fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
                fmt0 = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
                table.add_row(
                    str(s),
                    str(m["workers"]),
                    f"{m['requests']} ({m['failed']} failed)"
                    if m["failed"]
                    else str(m["requests"]),
                    f"{m['requests_per_s']:.0f}",
                    f"{m['tokens_per_s']:.0f}",
                    f"{m['tokens_per_s_per_worker']:.0f}",
                    fmt(m["timing_error_ms_p50"]),
                    fmt(m["timing_error_ms_p99"]),
                    "-" if m["client_cpu_mean"] is None else f"{m['client_cpu_mean'] * 100:.0f}%",
                    fmt0(m["tokens_per_client_cpu_s"]),
                )
    console.print(table)
    console.print(
        "timing error = client receive time - server send time per chunk (same monotonic clock); "
        "the server runs in one process on the same cores, so figures include its share."
    )
    return 0
