"""No process outlives its parent: `kill -9` of a multi-worker bench leaves nothing behind
(workers, multiprocessing's resource tracker), and neither does a killed `cbbench serve`
(its body-parser worker)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cbbench.reference_engine.server.lifeline import die_with_parent
from servers.fake import Behavior, FakeServerConfig, threaded

CLI = [sys.executable, "-m", "cbbench.harness.cli"]
pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of a live process, None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def descendants(pid: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
            parents[int(entry.name)] = st[1]
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    return {p for p in pids if (st := _stat(p)) is not None and st[0] not in ("Z", "X")}


def wait_until(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return result


def test_kill_9_of_a_multi_worker_bench_leaves_no_process(tmp_path):
    out = tmp_path / "run"
    with threaded(FakeServerConfig(Behavior(itl_s=0.02))) as srv:
        bench = subprocess.Popen(
            [
                *CLI,
                "bench",
                "--base-url",
                srv.url,
                "--out",
                str(out),
                "--no-live",
                "--workload",
                "seed-demo",
                "--num-requests",
                "400",
                "--concurrency",
                "8",
                "--workers",
                "2",
                "--no-server-metrics",
                "--no-gpu-metrics",
            ],  # fmt: skip
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:

            def running() -> set[int] | None:
                kids = descendants(bench.pid)
                records = out / "requests.jsonl"
                started = records.exists() and records.stat().st_size > 0
                return kids if len(kids) >= 3 and started else None  # 2 workers + tracker

            kids = wait_until(running, 60, "bench never started its workers")
            bench.send_signal(signal.SIGKILL)
            bench.wait(10)
            left = wait_until(lambda: not alive(kids) or None, 15, f"left behind: {alive(kids)}")
            assert left
        finally:
            if bench.poll() is None:
                bench.kill()
            for pid in alive(descendants(bench.pid)):  # never leak, even when failing
                os.kill(pid, signal.SIGKILL)


def _child(parent_pid: int, ready: str) -> None:  # pragma: no cover - runs in a grandchild
    die_with_parent(parent_pid)
    Path(ready).write_text(str(os.getpid()))
    time.sleep(120)


def test_die_with_parent_also_when_the_parent_dies_first(tmp_path):
    # A middle process starts a child then is killed; the child must go too.
    ready = tmp_path / "ready"
    code = (
        "import multiprocessing as mp, os, sys, time\n"
        "from tests.test_process_lifetime import _child\n"
        "if __name__ == '__main__':\n"
        "    ctx = mp.get_context('spawn')\n"
        f"    p = ctx.Process(target=_child, args=(os.getpid(), {str(ready)!r}))\n"
        "    p.start()\n"
        "    time.sleep(120)\n"
    )
    root = Path(__file__).parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "tests")])}
    middle = subprocess.Popen([sys.executable, "-c", code], cwd=root, env=env)
    try:
        wait_until(lambda: ready.exists() and ready.read_text(), 60, "child never started")
        child = int(ready.read_text())
        middle.send_signal(signal.SIGKILL)
        middle.wait(10)
        wait_until(lambda: not alive({child}) or None, 15, "child outlived its parent")
    finally:
        if middle.poll() is None:
            middle.kill()


def test_kill_9_of_serve_leaves_no_process(tmp_path):
    import httpx
    from cbbench.reference_engine.server.body import OFFLOAD_BYTES

    serve = subprocess.Popen(
        [*CLI, "serve", "--port", "0", "--max-model-len", "64"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = wait_until(serve.stdout.readline, 120, "serve never got ready")
        url = line.strip().rsplit(" ", 1)[-1]
        big = b'{"prompt": [' + b"5, " * (OFFLOAD_BYTES // 3) + b'5], "max_tokens": 1}'
        r = httpx.post(
            url + "/v1/completions",
            content=big,
            timeout=60,
            headers={"content-type": "application/json"},
        )  # starts the body parser
        assert r.status_code == 400, r.text
        kids = descendants(serve.pid)
        assert kids  # the engine process and the body parser's worker (and its tracker)
        serve.send_signal(signal.SIGKILL)
        serve.wait(10)
        wait_until(lambda: not alive(kids) or None, 15, f"left behind: {_cmdlines(alive(kids))}")
    finally:
        if serve.poll() is None:
            serve.kill()
        for pid in alive(descendants(serve.pid)):
            os.kill(pid, signal.SIGKILL)


def _cmdlines(pids: set[int]) -> list[str]:
    out = []
    for pid in pids:
        with contextlib.suppress(OSError):
            out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
    return out
