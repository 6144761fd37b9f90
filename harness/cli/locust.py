"""`cbbench locust`: drive a workload through Locust (web UI or headless, one process or
Locust's master/worker mode) with the cbbench user; write a run folder like `cbbench bench`.

Runs `python -m locust -f <cbbench locustfile>` as a child process; cbbench's settings travel
in the CBBENCH_LOCUST_SETTINGS environment variable, Locust's own options on its command
line (anything after `--` is passed to Locust unchanged).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

from cbbench.harness.cli.bench import add_reasoning_args
from cbbench.harness.durations import seconds_arg
from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.slo import SLO_HELP
from cbbench.harness.results.summary import parse_duration, parse_slo
from cbbench.harness.telemetry import TelemetryOptions

DEFAULT_WEB_PORT = 8089
DEFAULT_MASTER_PORT = 5557


def register(sub: argparse._SubParsersAction) -> None:
    from cbbench.harness.client.endpoints import ENDPOINTS

    p = sub.add_parser(
        "locust",
        help="load through Locust: web UI or headless, distributed workers, same run folder",
        description=__doc__,
    )
    g = p.add_argument_group("workload and target (as in cbbench bench)")
    g.add_argument("--base-url", help="server root, e.g. http://127.0.0.1:8000")
    g.add_argument("--workload", default="mixed", help="preset name, trace file or spec file")
    g.add_argument("--endpoint", choices=ENDPOINTS, default="completions")
    g.add_argument("--model", help="model name (default: the first one /v1/models lists)")
    g.add_argument("--num-requests", type=int, help="take the first N requests of the workload")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--rate", type=float, help="open loop: requests/s (Poisson; see --burstiness)")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma shape with --rate")
    g.add_argument("--arrival", choices=("poisson", "constant"), help="arrival kind for --rate")
    g.add_argument(
        "--closed-loop",
        action="store_true",
        help="ignore arrival times: each user sends its next request when the last one ends",
    )
    g.add_argument("--cycle", action="store_true", help="repeat the workload until Locust stops")
    g.add_argument(
        "--pacing", help="Locust constant_pacing: at most one request per user per DURATION"
    )
    g.add_argument("--slo", help=SLO_HELP)
    g.add_argument("--tokenizer", help="tokenizer.json (or its folder): exact-length text prompts")
    g.add_argument("--text-prompts", action="store_true", help="send text, not token ids")
    g.add_argument("--api-key", help="sent as a Bearer token")
    g.add_argument(
        "--timeout", type=seconds_arg, default=600.0, help="per-request limit (600s; 10m)"
    )
    g.add_argument("--no-stream", action="store_true", help="non-streaming requests")
    g.add_argument("--no-extensions", action="store_true", help="plain OpenAI request body")
    g.add_argument("--extra-body", help="JSON object merged into every request body")
    g.add_argument(
        "--embeddings-batch", type=int, default=1, help="--endpoint embeddings: inputs per request"
    )
    g.add_argument(
        "--no-itl-events", action="store_true", help="no per-token ITL samples in Locust's stats"
    )
    g.add_argument("--out", help="run folder (default results/runs/<timestamp>-<name>)")
    g.add_argument("--name", help="run name (default: the workload's)")
    lo = p.add_argument_group("Locust")
    lo.add_argument("--headless", action="store_true", help="no web UI; start at once")
    lo.add_argument("-u", "--users", type=int, help="peak number of users (default 1)")
    lo.add_argument("-r", "--spawn-rate", type=float, help="users started per second")
    lo.add_argument("-t", "--run-time", help="stop after this long, e.g. 60s, 5m (headless)")
    lo.add_argument("--processes", type=int, help="fork N local Locust workers (-1: one per CPU)")
    lo.add_argument("--master", action="store_true", help="Locust master (workers connect to it)")
    lo.add_argument("--worker", action="store_true", help="Locust worker of a --master")
    lo.add_argument("--master-host", default="127.0.0.1", help="the master a --worker joins")
    lo.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT)
    lo.add_argument(
        "--master-bind-host",
        default="127.0.0.1",
        help="interface the master listens on for workers (0.0.0.0 for other machines)",
    )
    lo.add_argument("--expect-workers", type=int, help="headless master: wait for N workers")
    lo.add_argument("--web-host", default="127.0.0.1", help="web UI interface")
    lo.add_argument("--web-port", type=int, default=DEFAULT_WEB_PORT)
    lo.add_argument("--csv", help="Locust CSV stats prefix (PREFIX_stats.csv, ...)")
    lo.add_argument("--html", help="Locust HTML report file")
    p.add_argument("locust_args", nargs="*", help="after --: passed to Locust unchanged")
    add_reasoning_args(p)
    TelemetryOptions.add_args(p)
    p.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace):
    from cbbench.harness.locust.settings import LocustSettings, load_workload_for

    if not args.base_url:
        raise CbbenchError("--base-url is required (the server root, e.g. http://127.0.0.1:8000)")
    if args.timeout <= 0:
        raise CbbenchError(f"--timeout must be > 0, got {args.timeout}")
    extra: dict = {}
    if args.extra_body:
        try:
            extra = json.loads(args.extra_body)
        except ValueError as exc:
            raise CbbenchError(f"--extra-body: not JSON ({exc})") from None
        if not isinstance(extra, dict):
            raise CbbenchError("--extra-body: expected a JSON object")
    from cbbench.harness.load.options import reasoning_body

    reasoning = reasoning_body(args.endpoint, args.reasoning_effort, args.chat_template_kwargs)
    extra = {**reasoning, **extra}
    pacing = parse_duration(args.pacing, "--pacing") if args.pacing else None
    if args.embeddings_batch < 1:
        raise CbbenchError(f"--embeddings-batch must be >= 1, got {args.embeddings_batch}")
    settings = LocustSettings(
        base_url=args.base_url.rstrip("/"),
        workload=args.workload,
        model=args.model,
        endpoint=args.endpoint,
        seed=args.seed,
        num_requests=args.num_requests,
        rate=args.rate,
        burstiness=args.burstiness,
        arrival=args.arrival,
        schedule=False if args.closed_loop else None,
        cycle=args.cycle,
        pacing_s=pacing,
        out_dir=args.out,
        name=args.name,
        slo=parse_slo(args.slo),
        tokenizer=args.tokenizer,
        text_prompts=args.text_prompts,
        api_key=args.api_key,
        timeout_s=args.timeout,
        stream=not args.no_stream,
        embeddings_batch=args.embeddings_batch,
        extensions=not args.no_extensions,
        extra_body=extra,
        reasoning_parser=args.reasoning_parser,
        itl_events=not args.no_itl_events,
        telemetry=TelemetryOptions.from_args(args).to_dict(),
        command=list(sys.argv),
    )
    load_workload_for(settings)  # a bad spec fails here, in one line, before Locust starts
    return settings


def locust_command(args: argparse.Namespace, locustfile: str, base_url: str) -> list[str]:
    if args.master and args.worker:
        raise CbbenchError("--master and --worker exclude each other")
    if args.processes is not None and (args.master or args.processes == 0):
        raise CbbenchError("--processes N (N >= 1 or -1) starts its own master; drop --master")
    workers = args.processes if args.processes is not None else args.expect_workers
    if args.users is not None and workers is not None and 0 < args.users < workers:
        raise CbbenchError(
            f"-u {args.users} is fewer users than the {workers} workers: a worker without "
            "users would leave its share of the requests unsent"
        )
    cmd = [sys.executable, "-m", "locust", "-f", locustfile, "--host", base_url]
    if args.worker:
        cmd += [
            "--worker",
            "--master-host",
            args.master_host,
            "--master-port",
            str(args.master_port),
        ]
        if args.processes is not None:
            cmd += ["--processes", str(args.processes)]
        return cmd + list(args.locust_args)
    cmd += ["--web-host", args.web_host, "--web-port", str(args.web_port)]
    if args.headless:
        cmd.append("--headless")
    for flag, value in (("-u", args.users), ("-r", args.spawn_rate), ("-t", args.run_time)):
        if value is not None:
            cmd += [flag, str(value)]
    for flag, value in (("--csv", args.csv), ("--html", args.html)):
        if value:
            cmd += [flag, value]
    if args.master or args.processes is not None:
        cmd += ["--master-bind-host", args.master_bind_host]
        cmd += ["--master-bind-port", str(args.master_port)]
    if args.master:
        cmd.append("--master")
        if args.expect_workers is not None:
            cmd += ["--expect-workers", str(args.expect_workers)]
    if args.processes is not None:  # the forked workers connect to --master-port
        cmd += ["--processes", str(args.processes), "--master-port", str(args.master_port)]
    return cmd + list(args.locust_args)


def run(args: argparse.Namespace) -> int:
    from cbbench.harness.client.api import probe_server
    from cbbench.harness.locust import LOCUSTFILE
    from cbbench.harness.locust.settings import ENV_VAR

    settings = settings_from_args(args)
    cmd = locust_command(args, str(LOCUSTFILE), settings.base_url)
    if not settings.model:
        models = probe_server(settings.base_url, settings.api_key)["models"]
        if not models:
            raise CbbenchError(f"{settings.base_url}/v1/models lists no model; pass --model")
        settings.model = models[0]
    env = {**os.environ, ENV_VAR: settings.to_env()}
    if not args.worker and not args.headless:
        url = f"http://{args.web_host}:{args.web_port}"
        print(f"cbbench locust: web UI at {url} (cbbench page: {url}/cbbench)", flush=True)
    background = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    proc = subprocess.Popen(cmd, env=env)
    previous = signal.signal(signal.SIGTERM, lambda *_: proc.send_signal(signal.SIGTERM))
    if background:  # a script's `&`: no Ctrl-C reaches Locust, so `kill -INT` this one is passed on
        signal.signal(signal.SIGINT, lambda *_: proc.send_signal(signal.SIGINT))
    try:
        return proc.wait()
    except KeyboardInterrupt:  # Locust got the same SIGINT: let it write its results
        try:
            return proc.wait(60)
        except (KeyboardInterrupt, subprocess.TimeoutExpired):
            proc.kill()
            return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        if background:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
