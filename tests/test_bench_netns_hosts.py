"""One workload from three load-generator "hosts": each in its own network namespace, made by
this test (tests/netns_support.py), runs `cbbench bench --shard I/3 --start-at T` against one
server in the hub's namespace, reached only over a veth through a bridge (10.213.78.0/24:
the addresses exist only inside those namespaces, nothing is routed out, the host's own
interfaces are never touched); then `cbbench merge` makes one run folder of the three: every
request exactly once, none lost, sessions on one host, one t0 on the wall clock.

Skipped, with the reason, only where namespaces cannot be made (no root/CAP_NET_ADMIN, no
iproute2); `.ci/run` installs iproute2.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from cbbench.harness.results.run_folder import load_run
from netns_support import gone, in_ns, links, namespaces, start, start_python, stop
from process_support import readline_within

SUBNET = "10.213.78"  # test_locust_netns uses 10.213.77
SERVER_IP = f"{SUBNET}.1"
SERVER_PORT = 18000  # free: the namespace is new
HOSTS = ["h0", "h1", "h2"]
N = 36
TAG = f"cbh{os.getpid()}"
SPEC = {
    "prompt": {"dist": "constant", "value": 16},
    "output": {"dist": "uniform", "min": 3, "max": 6},
    "session": {
        "turns": {"dist": "uniform", "min": 1, "max": 3},
        "think_ms": {"dist": "constant", "value": 2},
        "message": {"dist": "constant", "value": 8},
    },
}
# the scripted server (harness/servers/fake_server.py) on the bridge's address
SERVER = f"""
import asyncio
from cbbench.harness.servers.fake_server import Behavior, FakeServer, FakeServerConfig
from cbbench.harness.servers.launcher import ready_line

async def main():
    server = FakeServer(FakeServerConfig(Behavior(itl_s=0.002)))
    port = await server.start(host="{SERVER_IP}", port={SERVER_PORT})
    print(ready_line("cbbench fake-server", f"http://{SERVER_IP}:{{port}}"), flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def _bench(base_url: str, spec, i: int, start_at: str, out) -> list[str]:
    return [
        "bench", "--base-url", base_url, "--workload", str(spec), "--seed", "2",
        "--num-requests", str(N), "--rate", "20", "--concurrency", "6",
        "--no-live", "--no-server-metrics", "--no-gpu-metrics",
        "--shard", f"{i}/3", "--start-at", start_at, "--out", str(out),
    ]  # fmt: skip


def test_three_hosts_one_server_records_merged(tmp_path):
    spec = tmp_path / "sessions.json"
    spec.write_text(json.dumps(SPEC), encoding="utf-8")
    base_url = f"http://{SERVER_IP}:{SERVER_PORT}"
    with namespaces(TAG, SUBNET, "srv", HOSTS) as ns:
        for i, host in enumerate(HOSTS):  # a host has exactly lo and its veth
            assert links(ns[host]) == {"lo", f"v{i}w"}
        procs: list[subprocess.Popen] = []
        try:
            server_log = tmp_path / "server.log"
            server = start_python(
                ns["srv"],
                ["-c", SERVER],
                stdout=subprocess.PIPE,
                stderr=server_log.open("w"),
                text=True,
            )
            procs.append(server)
            ready = readline_within(server, 120, "the server", server_log)
            assert "ready at" in ready, "server did not start"
            # the server is on the bridge only: not on a host's own loopback
            probe = in_ns(
                ns["h0"],
                "import socket; s = socket.socket(); s.settimeout(2)\n"
                f"print(s.connect_ex(('127.0.0.1', {SERVER_PORT})), "
                f"socket.create_connection(('{SERVER_IP}', {SERVER_PORT}), 5) is not None)",
            )
            assert probe.stdout.split()[1:] == ["True"] and probe.stdout.split()[0] != "0", (
                probe.stdout + probe.stderr[-2000:]
            )
            start_at = f"{time.time() + 8.0:.3f}"  # after three interpreters have started
            hosts = [
                start(
                    ns[host],
                    _bench(base_url, spec, i, start_at, tmp_path / host),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for i, host in enumerate(HOSTS)
            ]
            procs += hosts
            errs = [h.communicate(timeout=90)[1] for h in hosts]
        finally:
            for p in reversed(procs):
                stop(p)
        for h, err in zip(hosts, errs, strict=True):
            assert h.returncode == 0, err[-3000:]
    merge = subprocess.run(
        [sys.executable, "-m", "cbbench.harness.cli", "merge", str(tmp_path / "merged"),
         *(str(tmp_path / h) for h in HOSTS)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert merge.returncode == 0, merge.stderr[-3000:]
    parts = [load_run(tmp_path / h) for h in HOSTS]
    for i, run in enumerate(parts):
        assert run.meta["shard"]["index"] == i and run.meta["target"]["base_url"] == base_url
        assert run.meta["clock"]["t0_unix_s"] == float(start_at)
        assert run.records, f"host {i} sent nothing"
    run = load_run(tmp_path / "merged")
    indices = sorted(r.index for r in run.records)
    assert indices == list(range(N)), "every request exactly once: none lost, none duplicated"
    assert all(r.ok for r in run.records), [r.error for r in run.records if not r.ok][:3]
    for i, part in enumerate(parts):  # what each host sent, and only that, is host i's
        assert sorted(r.index for r in part.records) == sorted(
            r.index for r in run.records if r.worker == i
        )
    owner: dict[str, set[int]] = {}
    for r in run.records:
        owner.setdefault(r.session_id, set()).add(r.worker)
    assert all(len(w) == 1 for w in owner.values()), "a session on one host"
    summary = run.meta["summary"]
    assert summary["counts"]["completed"] == N
    assert [s["shard"] for s in summary["shards"]] == [0, 1, 2]
    assert run.meta["load"]["workers"] == 3 and run.meta["status"] == "complete"


def test_namespaces_are_gone_afterwards():
    # The previous test's namespaces were deleted, whatever happened in it.
    assert gone(TAG)
