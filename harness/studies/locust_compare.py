"""`cbbench selftest --compare locust`: requests per client CPU-second, Locust vs cbbench.

One zero-delay local server (`fake_server`, its own process), then three runs one after the
other at the same number of streams, request and token count:
- Locust's FastHttpUser (geventhttpclient's C parser, gevent), as a streaming LLM user is
  usually written: POST with `stream=True`, read the body as it comes, split it into SSE
  events and `json.loads` each one (to count tokens); nothing else. Once with one constant
  request body, once building each request's prompt as cbbench does (workloads/tokens.py:
  a seeded draw per request, the same work cbbench does per request).
- cbbench's own client (`run_bench`, one worker in this process): SSE parsing, token counting,
  per-token timing, a record per request written to disk, telemetry samples. As in any run,
  its requests are built ahead (harness/load/lookahead.py: up to 16,384 before t0, the rest by a
  refill during the run, whose CPU counts), so runs past that size show the refill's cost.
Each side's CPU is what its process spent while the load ran (`time.process_time`, user +
system, so the kernel's share of loopback sends counts for both), from the first request to
the last: start-up, cbbench's probe and summary are left out of both.
The ratios are cbbench / Locust requests per client CPU-second: above 1, cbbench is cheaper.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cbbench.harness.errors import CbbenchError
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.workloads.spec import RequestSpec, Workload

LOCUSTFILE = """
import json, os, time
from locust import FastHttpUser, constant, events, task

OUT = os.environ["CBB_COMPARE_OUT"]
TOKENS = int(os.environ["CBB_COMPARE_TOKENS"])
BODY = json.dumps({"model": "fake-model", "prompt": list(range(16)), "max_tokens": TOKENS,
                   "stream": True, "ignore_eos": True, "return_token_ids": True})
PROMPTS = None
if os.environ.get("CBB_COMPARE_PROMPTS"):  # the same per-request prompts cbbench sends
    from cbbench.workloads.tokens import PromptTokenIds
    PROMPTS = PromptTokenIds(0, 512)
STATE = {"done": 0, "failed": 0, "tokens": 0, "cpu0": None, "t0": None, "next": 0}


def body():
    if PROMPTS is None:
        return BODY
    i = STATE["next"]
    STATE["next"] = i + 1
    return json.dumps({"model": "fake-model", "prompt": PROMPTS(i, 16), "max_tokens": TOKENS,
                       "stream": True, "ignore_eos": True, "return_token_ids": True})


@events.test_start.add_listener
def _start(**_):
    STATE["cpu0"], STATE["t0"] = time.process_time(), time.monotonic()


@events.quitting.add_listener
def _quit(**_):
    cpu = time.process_time() - STATE["cpu0"]
    wall = time.monotonic() - STATE["t0"]
    with open(OUT, "w") as fh:
        json.dump({"requests": STATE["done"], "failed": STATE["failed"],
                   "tokens": STATE["tokens"], "cpu_s": cpu, "wall_s": wall}, fh)


class StreamUser(FastHttpUser):
    wait_time = constant(0)

    @task
    def stream(self):
        headers = {"content-type": "application/json"}
        with self.client.post("/v1/completions", data=body(), headers=headers, stream=True,
                              catch_response=True) as resp:
            buf, tokens, done = b"", 0, False
            while True:
                data = resp.stream.read(65536)
                if not data:
                    break
                *events, buf = (buf + data).split(b"\\n\\n")
                for ev in events:
                    payload = ev[6:]
                    if payload == b"[DONE]":
                        done = True
                        continue
                    obj = json.loads(payload)
                    for c in obj.get("choices") or ():
                        tokens += len(c.get("token_ids") or ())
            if done:
                STATE["done"] += 1
                STATE["tokens"] += tokens
                resp.success()
            else:
                STATE["failed"] += 1
                resp.failure("no [DONE]")
"""


@dataclass
class ClientCost:
    name: str
    requests: int
    failed: int
    cpu_s: float
    wall_s: float

    @property
    def requests_per_cpu_s(self) -> float:
        return self.requests / self.cpu_s if self.cpu_s > 0 else 0.0


def run_locust(
    url: str, streams: int, tokens: int, seconds: float, prompts: bool = False
) -> ClientCost:
    """Locust's streaming user; `prompts`: each request's prompt built as cbbench builds it
    (workloads/tokens.py), else one constant body."""
    with tempfile.TemporaryDirectory(prefix="cbbench-compare-") as tmp:
        lf, out = Path(tmp) / "locustfile.py", Path(tmp) / "result.json"
        lf.write_text(LOCUSTFILE)
        env = {**os.environ, "CBB_COMPARE_OUT": str(out), "CBB_COMPARE_TOKENS": str(tokens)}
        env["CBB_COMPARE_PROMPTS"] = "1" if prompts else ""
        cmd = [sys.executable, "-m", "locust", "-f", str(lf), "--headless", "--host", url]
        cmd += ["-u", str(streams), "-r", str(max(streams, 1) * 10), "-t", f"{seconds:g}s"]
        cmd += ["--only-summary", "--loglevel", "WARNING", "--stop-timeout", "5"]
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=seconds + 120, cwd=tmp
        )
        if not out.exists():
            tail = (proc.stderr or proc.stdout)[-600:]
            raise CbbenchError(f"selftest --compare locust: Locust did not finish: {tail}")
        r = json.loads(out.read_text())
    name = "locust FastHttpUser" + (", cbbench's prompts" if prompts else ", one body")
    return ClientCost(name, r["requests"], r["failed"], r["cpu_s"], r["wall_s"])


def run_cbbench(url: str, streams: int, tokens: int, seconds: float) -> ClientCost:
    n = int(seconds * 20_000) + streams  # more than it can send: the duration ends the run
    wl = Workload("compare", 0, tuple(RequestSpec(i, 16, tokens) for i in range(n)))
    with tempfile.TemporaryDirectory(prefix="cbbench-compare-") as tmp:
        cfg = BenchConfig(
            base_url=url,
            workload=wl,
            concurrency=streams,
            duration_s=seconds,
            workers=1,
            out_dir=os.path.join(tmp, "run"),
            name="compare",
            live=False,
        )
        from rich.console import Console

        res = run_bench(cfg, console=Console(file=io.StringIO()))
    c = res.summary["counts"]
    cpu = res.summary["client"]["cpu_s"]  # the measured phase, as Locust's
    return ClientCost(
        "cbbench (raw client)", c["completed"], c["failed"], cpu, res.summary["duration_s"]
    )


def compare(url: str, streams: int, tokens: int, seconds: float) -> dict:
    """Locust (one constant body, then cbbench's per-request prompts), then cbbench, against
    the same server; the costs and cbbench's ratio to each Locust run."""
    plain = run_locust(url, streams, tokens, seconds)
    same = run_locust(url, streams, tokens, seconds, prompts=True)
    ours = run_cbbench(url, streams, tokens, seconds)

    def ratio(base: ClientCost) -> float | None:
        b = base.requests_per_cpu_s
        return ours.requests_per_cpu_s / b if b > 0 else None

    return {
        "locust": plain,
        "locust_prompts": same,
        "cbbench": ours,
        "ratio": ratio(plain),
        "ratio_same_prompts": ratio(same),
    }
