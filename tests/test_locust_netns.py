"""Distributed Locust across hosts: the master (with the server) and two workers each in their
own network namespace, made by this test, joined by veth pairs through a bridge in the
master's namespace. Every address (10.213.77.0/24) exists only inside those namespaces and
nothing is routed out of them: the traffic never leaves this machine, and never touches the
host's own interfaces. Workers reach the master and the server only at 10.213.77.1, so this
proves what loopback cannot: the distributed mode works between machines, and the master
merges every worker's records into one run folder, none lost or duplicated.

Skipped, with the reason, only where namespaces cannot be made (no root/CAP_NET_ADMIN, no
iproute2); `.ci/run` installs iproute2.
"""

from __future__ import annotations

import os
import subprocess

from cbbench.harness.results.run_folder import load_run
from netns_support import gone, in_ns, links, namespaces, start, stop
from process_support import readline_within

SUBNET = "10.213.77"
MASTER_IP = f"{SUBNET}.1"
SERVER_PORT, MASTER_PORT, WEB_PORT = 18000, 15557, 18089  # free: the namespace is new
PROC_TIMEOUT_S = 150
N = 40
TAG = f"cbb{os.getpid()}"


def test_distributed_locust_across_network_namespaces(tmp_path):
    out = tmp_path / "run"
    base_url = f"http://{MASTER_IP}:{SERVER_PORT}"
    with namespaces(TAG, SUBNET, "master", ["w0", "w1"]) as ns:
        # The namespaces are isolated from the host: a worker has exactly lo and its veth.
        assert links(ns["w0"]) == {"lo", "v0w"}
        procs: list[subprocess.Popen] = []
        try:
            server_log = tmp_path / "server.log"
            server = start(
                ns["master"],
                ["serve", "--model", "tiny", "--host", MASTER_IP, "--port", str(SERVER_PORT),
                 "--no-engine-process"],
                stdout=subprocess.PIPE, stderr=server_log.open("w"), text=True,
            )  # fmt: skip
            procs.append(server)
            ready = readline_within(server, PROC_TIMEOUT_S, "cbbench serve", server_log)
            assert "ready at" in ready, "server did not start"
            # A worker namespace reaches the server over the veth, through the bridge.
            probe = in_ns(
                ns["w1"], f"import httpx; print(httpx.get('{base_url}/health').status_code)"
            )
            assert probe.stdout.strip() == "200", probe.stderr[-2000:]
            common = [
                "locust", "--base-url", base_url, "--workload", "seed-demo",
                "--num-requests", str(N), "--no-gpu-metrics", "--metrics-interval", "0.1",
            ]  # fmt: skip
            master = start(
                ns["master"],
                [*common, "--out", str(out), "--master", "--expect-workers", "2", "--headless",
                 "-u", "4", "-r", "50", "-t", "60s", "--master-bind-host", MASTER_IP,
                 "--master-port", str(MASTER_PORT), "--web-port", str(WEB_PORT)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
            procs.append(master)
            workers = [
                start(
                    ns[role],
                    [
                        *common,
                        "--out",
                        str(tmp_path / f"unused-{role}"),
                        "--worker",
                        "--master-host",
                        MASTER_IP,
                        "--master-port",
                        str(MASTER_PORT),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )  # fmt: skip
                for role in ("w0", "w1")
            ]
            procs += workers
            _, err = master.communicate(timeout=PROC_TIMEOUT_S)
            codes = [w.wait(timeout=60) for w in workers]
        finally:
            for p in reversed(procs):
                stop(p)
        assert master.returncode == 0, err.decode()[-3000:]
        assert codes == [0, 0]
    for role in ("w0", "w1"):
        assert not (tmp_path / f"unused-{role}").exists(), "workers never write a run folder"
    run = load_run(out)
    indices = sorted(r.index for r in run.records)
    assert indices == list(range(N)), "every request exactly once: none lost, none duplicated"
    assert all(r.ok for r in run.records), [r.error for r in run.records if not r.ok][:3]
    by_worker = {w: sum(r.worker == w for r in run.records) for w in {0, 1}}
    assert sum(by_worker.values()) == N and min(by_worker.values()) >= N // 2 - 1
    assert run.meta["status"] == "complete"
    assert run.meta["summary"]["counts"]["completed"] == N
    assert run.meta["target"]["base_url"] == base_url


def test_namespaces_are_gone_afterwards():
    # The previous test's namespaces were deleted, whatever happened in it.
    assert gone(TAG)
