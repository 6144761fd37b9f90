"""Start-up never hangs and leaves nothing behind (issue #47's last two findings): nothing a
failed start began survives it, a launched server dies with its launcher, a kernel build
stretches the readiness limit, a server that never says "ready" fails its test in time, and
a hung test fails by name while the run goes on.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cbbench.harness.errors import CbbenchError
from cbbench.harness.servers import launcher
from cbbench.harness.servers.launcher import fake_server_command, start_server
from process_support import Lines, kill, readline_within

ROOT = Path(__file__).resolve().parents[1]

# A "server" that starts a helper process (as serve starts its engine), says so, and never
# becomes ready.
NEVER_READY = textwrap.dedent("""
    import subprocess, sys, time
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    print("helper", helper.pid, flush=True)
    time.sleep(300)
""")


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that never comes counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _gone_within(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_no_child_of_a_failed_start_survives_it():
    t0 = time.monotonic()
    with pytest.raises(CbbenchError, match="did not become ready within 3s") as failed:
        start_server([sys.executable, "-c", NEVER_READY], ready_timeout_s=3, name="slow one")
    assert time.monotonic() - t0 < 3 + launcher.STOP_TIMEOUT_S + 5
    helper = int(re.search(r"last output: helper (\d+)", str(failed.value)).group(1))
    assert _gone_within(helper, 5), f"the failed start's helper {helper} survived it"


def test_a_child_that_exits_before_ready_takes_its_helpers_along():
    """Its helper still holds the output pipe open: the exit, not EOF, ends the wait."""
    code = NEVER_READY.rsplit("time.sleep(300)", 1)[0] + "sys.exit(3)\n"
    t0 = time.monotonic()
    with pytest.raises(CbbenchError, match="exited with code 3 before it was ready") as failed:
        start_server([sys.executable, "-c", code], ready_timeout_s=60, name="quitter")
    assert time.monotonic() - t0 < 30  # not the 60 s readiness limit
    helper = int(re.search(r"helper (\d+)", str(failed.value)).group(1))
    assert _gone_within(helper, 5), f"the quitter's helper {helper} survived it"


def test_a_launched_server_dies_with_its_launcher():
    """kill -9 of the command that launched a server (a `cbbench run`): the server goes."""
    code = textwrap.dedent(f"""
        import time
        from cbbench.harness.servers.launcher import start_server
        from cbbench.reference_engine.server.lifeline import descendants
        handle = start_server({fake_server_command(procs=2)!r}, ready_timeout_s=60, name="fake")
        print("server", handle.process.pid, *descendants(handle.process.pid), flush=True)
        time.sleep(300)
    """)
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = readline_within(parent, 60, "the launching process")
        server, *helpers = (int(pid) for pid in line.split()[1:])
        assert _alive(server) and helpers, line  # --procs 2: a second server process
        parent.kill()
        parent.wait(10)
        for pid in (server, *helpers):
            assert _gone_within(pid, 10), f"fake server process {pid} outlived its launcher"
    finally:
        kill(parent)


def test_a_kernel_build_stretches_the_readiness_limit(monkeypatch, capsys):
    building = textwrap.dedent("""
        import sys, time
        print("cbbench kernels: building the CPU kernels (usually about a minute)",
              file=sys.stderr, flush=True)
        time.sleep(4)
        print("cbbench serve: ready at http://127.0.0.1:9", flush=True)
        time.sleep(300)
    """)
    monkeypatch.setattr(launcher, "KERNEL_BUILD_ALLOWANCE_S", 30.0)
    handle = start_server([sys.executable, "-c", building], ready_timeout_s=1.5, name="builder")
    try:
        assert handle.base_url == "http://127.0.0.1:9"
    finally:
        handle.stop()
    echoed = capsys.readouterr().err  # the user of `cbbench run` sees the build too
    assert "builder: cbbench kernels: building the CPU kernels (usually about a minute)" in echoed
    silent = building.replace("print(\"cbbench kernels:", "print(\"something else:")
    with pytest.raises(CbbenchError, match="within 1.5s"):
        start_server([sys.executable, "-c", silent], ready_timeout_s=1.5, name="silent")


def test_the_launcher_knows_the_kernel_builds_lines():
    from cbbench.kernels import build

    assert launcher.KERNEL_LINE_PREFIX == build.KERNEL_LINE_PREFIX
    assert launcher.KERNEL_BUILD_ALLOWANCE_S >= build.BUILD_WAIT_S


def test_a_server_that_never_prints_ready_fails_its_test_in_time():
    """What test_locust_netns did with a bare readline(): waited forever on a silent server."""
    quiet = "import sys, time; print('loading kernels', file=sys.stderr, flush=True); " \
            "time.sleep(300)"  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-c", quiet], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    t0 = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as failed:
        readline_within(proc, 2.0, "the server")
    assert time.monotonic() - t0 < 15
    assert "the server printed nothing within 2s" in str(failed.value)
    assert "loading kernels" in str(failed.value)  # its stderr is in the message
    assert proc.poll() is not None  # and it was stopped

    proc = subprocess.Popen(
        [sys.executable, "-c", quiet], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    with pytest.raises(pytest.fail.Exception, match="did not print 'ready at' within 1s"):
        Lines(proc, "the server").until("ready at", 1.0)
    assert proc.poll() is not None


HUNG = textwrap.dedent("""
    import subprocess, sys, time

    def test_waits_for_a_server_that_never_speaks():
        server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                  stdout=subprocess.PIPE)
        try:
            server.stdout.readline()  # no bound: the hang issue #47 found
        finally:
            server.kill()
            server.wait()

    def test_after_the_hung_one():
        assert True
""")


def test_a_hung_test_fails_by_name_and_the_run_goes_on(tmp_path):
    """The suite's own settings (pyproject's [tool.pytest.ini_options], the per-test timeout
    shortened to 3 s) on a test that blocks forever on a child's stdout."""
    assert importlib.util.find_spec("pytest_timeout"), "pip install -e '.[test]' (pytest-timeout)"
    (tmp_path / "test_hung.py").write_text(HUNG)
    cmd = [
        sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
        str(tmp_path), "-p", "no:cacheprovider", "-o", "timeout=3", str(tmp_path / "test_hung.py"),
    ]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "FAILED test_hung.py::test_waits_for_a_server_that_never_speaks" in out, out[-3000:]
    assert "Timeout" in out and "1 failed, 1 passed" in out, out[-3000:]
    assert time.monotonic() - t0 < 100


def test_the_suite_has_a_per_test_timeout():
    import tomllib

    opts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < opts["timeout"] <= 600 and opts["timeout_method"] == "signal"


def test_no_test_reads_a_child_without_a_bound():
    """A bare `.stdout.readline()` or `.wait()` on a child in a test waits forever."""
    bare = re.compile(r"\.stdout\.readline\(\)|\b(proc|server|master|parent|p)\.wait\(\)")
    found = [
        f"{path.name}:{n}"
        for path in sorted((ROOT / "tests").glob("test_*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if bare.search(line) and path.name != Path(__file__).name
    ]
    assert not found, f"unbounded waits on a child: {found}"


def test_kill_reaps_a_process_group(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", NEVER_READY], stdout=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    helper = int(readline_within(proc, 60, "the group leader").split()[1])
    kill(proc)
    assert proc.poll() is not None and _gone_within(helper, 5)
    assert os.getpgid(os.getpid()) != proc.pid  # we never killed our own group


SLOW_CXX = """#!/bin/sh
[ -e "$CBB_SLOW_MARK" ] && sleep 300
exec c++ "$@"
"""


def _tagged(tag: str) -> list[int]:
    """Live processes whose environment carries `tag` (this test's children and theirs)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if tag.encode() in (entry / "environ").read_bytes() and _alive(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and the C++ build")
def test_serve_stopped_mid_kernel_build_leaves_no_process(tmp_path):
    """The issue's fourth finding, as it was reproduced: a `cbbench serve` stopped with
    SIGTERM while its engine process builds the kernels left that process (and the build)
    running, orphaned. Here the build is slowed by a compiler wrapper; after the SIGTERM
    nothing this start began is alive: not the engine process, not the compiler."""
    from cbbench.kernels import cpu_gemm

    if cpu_gemm._precheck() is not None:
        pytest.skip(f"the CPU kernels are not built here: {cpu_gemm._precheck()}")
    cxx = tmp_path / "slow-cxx"
    cxx.write_text(SLOW_CXX)
    cxx.chmod(0o755)
    (tmp_path / "slow").touch()
    tag = f"cbb-test-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "CBBENCH_KERNEL_DIR": str(tmp_path / "kd"), "CXX": str(cxx),
           "CBB_SLOW_MARK": str(tmp_path / "slow"), "CBB_TEST_TAG": tag}  # fmt: skip
    env.pop("CBBENCH_LIFELINE_PID", None)
    cmd = [sys.executable, "-m", "cbbench.harness.cli", "serve", "--model", "tiny",
           "--host", "127.0.0.1", "--port", "0"]  # fmt: skip
    serve = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)  # fmt: skip
    try:
        out = Lines(serve, "cbbench serve")
        out.until("cbbench kernels: building the CPU kernels (first use", 180)
        deadline = time.monotonic() + 60
        while not any(_comm(p) == "sleep" for p in _tagged(tag)):  # the compile has begun
            assert time.monotonic() < deadline, "the slowed compiler never started"
            time.sleep(0.1)
        serve.send_signal(signal.SIGTERM)
        serve.wait(30)
        deadline = time.monotonic() + 10
        while left := _tagged(tag):
            assert time.monotonic() < deadline, f"still alive: {[(p, _comm(p)) for p in left]}"
            time.sleep(0.1)
    finally:
        kill(serve)
        for pid in _tagged(tag):
            os.kill(pid, signal.SIGKILL)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


@pytest.mark.slow
@pytest.mark.timeout(600)  # a failed start (~35 s) and a real kernel build (~1-2 min)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and the C++ build")
def test_a_failed_run_start_mid_kernel_build_leaves_no_process(tmp_path, monkeypatch):
    """`cbbench run`'s own start (launcher.start_reference_server) of a real serve that is
    still building the kernels when its (stretched) readiness limit runs out: the start
    fails in time, saying so, and nothing it began survives (serve, its engine process, the
    compiler); the next start then builds the kernels (a real build: ~1 min)."""
    from cbbench.harness.servers.launcher import start_reference_server
    from cbbench.kernels import cpu_gemm

    if cpu_gemm._precheck() is not None:
        pytest.skip(f"the CPU kernels are not built here: {cpu_gemm._precheck()}")
    cxx = tmp_path / "slow-cxx"
    cxx.write_text(SLOW_CXX)
    cxx.chmod(0o755)
    (tmp_path / "slow").touch()
    tag = f"cbb-test-{os.getpid()}-{time.monotonic_ns()}"
    for key, value in {"CBBENCH_KERNEL_DIR": str(tmp_path / "kd"), "CXX": str(cxx),
                       "CBB_SLOW_MARK": str(tmp_path / "slow"), "CBB_TEST_TAG": tag}.items():
        monkeypatch.setenv(key, value)  # fmt: skip
    monkeypatch.setattr(launcher, "KERNEL_BUILD_ALLOWANCE_S", 5.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(CbbenchError, match=r"did not become ready within 35s") as failed:
            start_reference_server("tiny", ready_timeout_s=30)
        assert "cbbench kernels: still building the CPU kernels" in str(failed.value) or (
            "cbbench kernels: building the CPU kernels" in str(failed.value)
        )
        assert time.monotonic() - t0 < 35 + launcher.STOP_TIMEOUT_S + 10
        deadline = time.monotonic() + 10
        while left := _tagged(tag):
            assert time.monotonic() < deadline, f"still alive: {[(p, _comm(p)) for p in left]}"
            time.sleep(0.1)
        # The next start finds torch's lock file the killed build left, and builds anyway.
        (tmp_path / "slow").unlink()
        handle = start_reference_server("tiny", ready_timeout_s=120)
        try:
            assert "removed a stale build lock" in handle.log_tail
            assert "built the CPU kernels in" in handle.log_tail
        finally:
            handle.stop()
    finally:
        for pid in _tagged(tag):
            os.kill(pid, signal.SIGKILL)
