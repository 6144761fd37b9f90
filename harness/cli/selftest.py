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

from cbbench.harness.errors import CbbenchError
from cbbench.harness.servers.fake_server import Behavior, FakeServerConfig
from cbbench.harness.servers.launcher import ServerHandle, fake_server_command, start_server
from cbbench.harness.studies.selftest import measure
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
    p.add_argument(
        "--requests",
        type=int,
        default=2000,
        help="at most this many per setting (at least one per stream)",
    )
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
        "--stamps",
        type=_stamps,
        default=["kernel", "user"],
        help="arrival stamps to measure, side by side: kernel,user (default), kernel or user",
    )
    p.add_argument(
        "--no-prewarm", action="store_true", help="open connections inside the run (cold starts)"
    )
    p.add_argument(
        "--compare",
        choices=("locust",),
        help="client cost side by side: Locust's FastHttpUser, then cbbench, on the same "
        "zero-delay server at the first --streams value; prints requests per client CPU-second",
    )
    p.set_defaults(func=run)


def run_compare(args: argparse.Namespace) -> int:
    from cbbench.harness.studies.locust_compare import compare

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
    for c in (res["locust"], res["locust_prompts"], res["cbbench"]):
        table.add_row(
            c.name,
            str(c.requests),
            str(c.failed),
            f"{c.cpu_s:.2f}",
            f"{c.wall_s:.2f}",
            f"{c.requests_per_cpu_s:.0f}",
        )
    console = Console(width=max(Console(soft_wrap=True).width, 120))
    console.print(table)

    def x(r: float | None) -> str:
        return "-" if r is None else f"{r:.2f}x"

    console.print(
        f"cbbench / Locust requests per client CPU-second: {x(res['ratio'])} "
        f"(Locust with one body), {x(res['ratio_same_prompts'])} (Locust building the same "
        "per-request prompts)"
    )
    return 0


class ServerProcess:
    """The fake server in its own Python process (harness/servers/launcher.py starts it); context
    manager with `.url`."""

    def __init__(self, config: FakeServerConfig, procs: int = 1) -> None:
        self.cmd = fake_server_command(config.to_json(), procs)
        self.handle: ServerHandle | None = None
        self.url = ""

    def __enter__(self) -> ServerProcess:
        try:
            self.handle = start_server(self.cmd, ready_timeout_s=60.0, name="fake server")
        except CbbenchError as exc:
            raise CbbenchError(f"selftest: the local test server did not start ({exc})") from None
        self.url = self.handle.base_url
        return self

    def __exit__(self, *exc) -> None:
        if self.handle is not None:
            self.handle.stop(10)


def _stamps(text: str) -> list[str]:
    out = [x.strip() for x in text.split(",") if x.strip()]
    if not out or any(x not in ("kernel", "user") for x in out):
        raise argparse.ArgumentTypeError(f"{text!r}: expected kernel, user or kernel,user")
    return out


def run(args: argparse.Namespace) -> int:
    if min(args.tokens, args.requests, args.server_procs) < 1 or args.seconds <= 0:
        raise CbbenchError("selftest: --tokens, --requests, --seconds, --server-procs must be > 0")
    if args.itl_ms < 0:
        raise CbbenchError("selftest: --itl-ms must be >= 0")
    if args.compare:
        return run_compare(args)
    console = Console(width=max(Console(soft_wrap=True).width, 190))
    table = Table(
        title=f"cbbench selftest: local server, {args.itl_ms:g} ms between tokens, "
        f"{args.tokens} tokens/request, {args.http_client} client; errors vs the server's log "
        "in ms"
    )
    cols = ("streams", "workers", "stamps", "server stamps", "requests", "req/s", "tok/s/worker")
    cols += ("TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "chunk p50", "chunk p99")
    cols += ("client CPU", "tok/CPU-s", "client-bound")
    for col in cols:
        table.add_column(col, justify="right")
    config = FakeServerConfig(default=Behavior(itl_s=args.itl_ms / 1e3, queue_time_s=None))
    stamps = args.stamps if args.http_client == "raw" else ["user"]
    measured: list[dict] = []
    with ServerProcess(config, args.server_procs) as server:
        for w in args.workers:
            for s in args.streams:
                for stamp in stamps:
                    m = measure(
                        server.url,
                        s,
                        w,
                        args.tokens,
                        args.requests,
                        args.seconds,
                        args.http_client,
                        kernel_timestamps=stamp == "kernel",
                        prewarm=not args.no_prewarm,
                    )
                    table.add_row(*_row(m))
                    measured.append(m)
    console.print(table)
    console.print(_worker_table(measured))
    for line in _verdicts(measured):
        console.print(line, highlight=False)
    console.print(
        "TTFT err = client TTFT - (first chunk sent - request received, by the server); ITL err "
        "= client gap - server gap; chunk err = client arrival - server send. One clock "
        "(CLOCK_MONOTONIC); the server shares the machine, so its own delays count too. "
        "stamps: who stamped the client's arrivals (kernel = SO_TIMESTAMPNS receive time); "
        "server stamps: who stamped the requests' arrival at the server."
    )
    return 0


def _worker_table(measured: list[dict]) -> Table:
    """The error per worker: its own requests graded against the server's log, beside the
    bound it reports from its own samples (summary client.workers)."""
    table = Table(title="per worker: errors vs the server's log and the reported bound, ms")
    cols = ("streams", "workers", "stamps", "worker", "requests", "TTFT p50", "TTFT p99")
    cols += ("ITL p50",)
    cols += ("ITL p99", "loop lag p99", "read delay p99", "send window p99", "bound p99")
    cols += ("within 1 ms",)
    for col in cols:
        table.add_column(col, justify="right")
    for m in measured:
        for w in m["per_worker"]:
            table.add_row(
                str(m["streams"]),
                str(m["workers"]),
                m["timestamp_source"],
                str(w["worker"]),
                str(w["requests"]),
                *[_fmt(w[k]) for k in ("ttft_error_ms_p50", "ttft_error_ms_p99")],
                *[_fmt(w[k]) for k in ("itl_error_ms_p50", "itl_error_ms_p99")],
                *[_fmt(w[k]) for k in ("loop_lag_ms_p99", "read_delay_ms_p99")],
                *[_fmt(w[k]) for k in ("send_window_ms_p99", "bound_ms")],
                _within(w),
            )
    return table


def _within(w: dict) -> str:
    if w["error_exceeds"]:
        return "NO: error"
    return "NO: bound" if w["bound_exceeds"] else "yes"


def _coverage(w: dict) -> str:
    """Whether a worker's reported bound covered its measured TTFT error, and why it stalled."""
    covers = w.get("bound_covers_ttft")
    said = "covers" if covers else "does NOT cover" if covers is False else "vs"
    low = w.get("ttft_written_error_ms_p99")
    client = w.get("bound_covers_client")
    return (
        f"worker {w['worker']}: bound {_fmt(w['bound_ms'])} ms {said} TTFT error p99 "
        f"{_fmt(w['ttft_error_ms_p99'])} ms"
        + (
            ""
            if low is None
            else f" ({_fmt(low)} ms from the server's send returned: "
            + ("covered" if client else "NOT covered")
            + ")"
        )
        + (f" (stalled: {w['stall']})" if w.get("stall") else "")
    )


def _verdicts(measured: list[dict]) -> list[str]:
    """One line per setting where a worker's error or bound passed the limit: said, not hidden."""
    out = []
    for m in measured:
        over = [w for w in m["per_worker"] if w["error_exceeds"] or w["bound_exceeds"]]
        if over:
            out.append(
                f"EXCEEDED at {m['streams']} streams, {m['workers']} workers, "
                f"{m['timestamp_source']} stamps: worker(s) "
                f"{', '.join(str(w['worker']) for w in over)} over {over[0]['limit_ms']:g} ms "
                "(measured p99 error or reported bound): this machine needs more workers, cores "
                "or hosts for this load; "
                + "; ".join(_coverage(w) for w in over)
            )
    return out


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def _row(m: dict) -> list[str]:
    def pair(key: str) -> list[str]:
        vals = (m[f"{key}_error_ms_p50"], m[f"{key}_error_ms_p99"])
        return ["-" if v is None else f"{v:.3f}" for v in vals]

    done = str(m["requests"]) + (f" ({m['failed']} failed)" if m["failed"] else "")
    cpu = m["client_cpu_mean"]
    per_cpu = m["tokens_per_client_cpu_s"]
    return [
        str(m["streams"]),
        str(m["workers"]),
        m["timestamp_source"],
        m["server_stamps"],
        done,
        f"{m['requests_per_s']:.0f}",
        f"{m['tokens_per_s_per_worker']:.0f}",
        *pair("ttft"),
        *pair("itl"),
        *pair("chunk"),
        "-" if cpu is None else f"{cpu * 100:.0f}%",
        "-" if per_cpu is None else f"{per_cpu:.0f}",
        "yes" if m["client_bound"] else "no",
    ]
