"""Network namespaces as separate "hosts" for tests (test_locust_netns, test_bench_netns_hosts).

`namespaces(tag, subnet, hub, hosts)` makes one namespace per role: the hub holds a bridge
with SUBNET.1/24, each host a veth whose other end is on that bridge, SUBNET.(10 + k)/24.
Both ends of a veth are created inside the hub's namespace and one end is moved: no
interface ever appears in the host's own namespace and nothing is routed out, so the traffic
never leaves this machine. The namespaces are deleted on exit, whatever happened (which
removes their veths). Skips, with the reason, only where a namespace cannot be made (no
root/CAP_NET_ADMIN, no iproute2); `.ci/run` installs iproute2.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def must(*args: str) -> None:
    r = ip(*args)
    assert r.returncode == 0, f"ip {' '.join(args)}: {r.stderr.strip()}"


@contextlib.contextmanager
def namespaces(tag: str, subnet: str, hub: str, hosts: list[str]) -> Iterator[dict[str, str]]:
    """{role: namespace name} for the hub and every host; always deleted."""
    if shutil.which("ip") is None:
        pytest.skip("iproute2 is not installed (apt-get install -y iproute2)")
    names = {role: f"{tag}-{role}" for role in (hub, *hosts)}
    made: list[str] = []
    try:
        for ns in names.values():
            r = ip("netns", "add", ns)
            if r.returncode != 0:
                pytest.skip(f"cannot create a network namespace: {r.stderr.strip()}")
            made.append(ns)
            must("-n", ns, "link", "set", "lo", "up")
        h = names[hub]
        must("-n", h, "link", "add", "br0", "type", "bridge")
        must("-n", h, "addr", "add", f"{subnet}.1/24", "dev", "br0")
        must("-n", h, "link", "set", "br0", "up")
        for i, role in enumerate(hosts):
            must("-n", h, "link", "add", f"v{i}m", "type", "veth", "peer", "name", f"v{i}w")
            must("-n", h, "link", "set", f"v{i}w", "netns", names[role])
            must("-n", h, "link", "set", f"v{i}m", "master", "br0")
            must("-n", h, "link", "set", f"v{i}m", "up")
            must("-n", names[role], "addr", "add", f"{subnet}.{10 + i}/24", "dev", f"v{i}w")
            must("-n", names[role], "link", "set", f"v{i}w", "up")
        yield names
    finally:
        for ns in made:
            ip("netns", "del", ns)


def links(ns: str) -> set[str]:
    """The interfaces a namespace has."""
    out = ip("-n", ns, "-o", "link", "show").stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def start(ns: str, argv: list[str], **kw) -> subprocess.Popen:
    """`cbbench ARGV` in namespace `ns`, in a session of its own (killpg stops its children)."""
    return start_python(ns, ["-m", "cbbench.harness.cli", *argv], **kw)


def start_python(ns: str, args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", "netns", "exec", ns, sys.executable, *args], start_new_session=True, **kw
    )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def in_ns(ns: str, code: str) -> subprocess.CompletedProcess:
    """Python `code` run in namespace `ns`."""
    return subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
    )


def gone(tag: str) -> bool:
    """No namespace named `tag-*` is left."""
    listed = ip("netns", "list").stdout if shutil.which("ip") else ""
    if f"{tag}-" in listed:
        return False
    return not (os.path.isdir("/run/netns") and any(
        n.startswith(f"{tag}-") for n in os.listdir("/run/netns")
    ))  # fmt: skip
