"""The C++ kernel build (kernels/build.py) never hangs a start and never rebuilds another
environment's kernels: issue #47's first two findings, reproduced.

A tiny CPython extension stands in for the kernels (it compiles in about a second through the
same torch machinery); each test builds into its own CBBENCH_KERNEL_DIR. A slow build is a
compiler wrapper (CXX) that sleeps while a marker file exists.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cbbench.kernels import build
from process_support import Lines, kill

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the C++ kernels build on Linux only"
)

SOURCE = r"""
#include <Python.h>
static PyObject* answer(PyObject*, PyObject*) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, ""}, {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "cbb_test_ext", nullptr, -1, methods};
PyMODINIT_FUNC PyInit_cbb_test_ext(void) { return PyModule_Create(&def); }
"""

# Builds the tiny extension; argv[2], when given, is a folder to import torch from: a second
# environment, its torch installed at another path (a symlink to ours, so no download).
DRIVER = """
import sys
from pathlib import Path
if len(sys.argv) > 2:
    sys.path.insert(0, sys.argv[2])
import torch
assert len(sys.argv) == 2 or torch.__file__.startswith(sys.argv[2]), torch.__file__
from cbbench.kernels.build import build_extension
m = build_extension("cbb_test_ext", [Path(sys.argv[1])], "test kernel", usual="a second")
print("answer", m.answer(), flush=True)
"""


SLOW_CXX = """#!/bin/sh
[ -e "$CBB_SLOW_MARK" ] && sleep 120
exec c++ "$@"
"""


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "cbb_test_ext.cpp"
    path.write_text(SOURCE)
    return path


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "CBBENCH_KERNEL_DIR": str(tmp_path / "kd"), **extra}


def _build(src: Path, env: dict[str, str], *other_env: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", DRIVER, str(src), *other_env]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and "answer 42" in proc.stdout, proc.stderr[-3000:]
    return proc


def test_two_environments_build_apart_and_neither_rebuilds(tmp_path, src):
    """The issue's first finding: two environments (torch installed at two paths) shared
    torch's one extension folder, and each switch rebuilt the kernels there."""
    import torch

    other = tmp_path / "other-env"
    other.mkdir()
    (other / "torch").symlink_to(Path(torch.__file__).parent)
    env = _env(tmp_path)
    first = _build(src, env)
    assert "cbbench kernels: building the test kernel (first use" in first.stderr
    assert "usually a second" in first.stderr and "built the test kernel in" in first.stderr
    (mine,) = (tmp_path / "kd" / "cbbench").iterdir()
    so = mine / "cbb_test_ext.so"
    stamp = so.stat().st_mtime_ns

    second = _build(src, env, str(other))  # the other environment: its own folder
    assert "building the test kernel" in second.stderr
    folders = sorted((tmp_path / "kd" / "cbbench").iterdir())
    assert len(folders) == 2 and mine in folders
    (theirs,) = (f for f in folders if f != mine)
    # Their build commands differ (torch's include and library paths): in one shared
    # folder, ninja would rebuild on every switch.
    assert str(other) in (theirs / "build.ninja").read_text()
    assert str(other) not in (mine / "build.ninja").read_text()

    for other_env in ((), (str(other),)):  # back and forth: nothing is built again
        again = _build(src, env, *other_env)
        assert "building" not in again.stderr, again.stderr
    assert so.stat().st_mtime_ns == stamp
    assert len(list((tmp_path / "kd" / "cbbench").iterdir())) == 2


def test_build_key_follows_what_makes_builds_differ(src, monkeypatch):
    base = build.build_key([src], ["-O3"], [], ["/a"])
    assert build.build_key([src], ["-O3"], [], ["/a"]) == base
    assert build.build_key([src], ["-O2"], [], ["/a"]) != base
    assert build.build_key([src], ["-O3"], [], ["/b"]) != base
    monkeypatch.setenv("CXX", "clang++")
    assert build.build_key([src], ["-O3"], [], ["/a"]) != base
    monkeypatch.delenv("CXX")
    src.write_text(SOURCE + "\n// changed\n")
    assert build.build_key([src], ["-O3"], [], ["/a"]) != base


def test_a_start_killed_mid_build_leaves_the_next_able_to_build(tmp_path, src):
    """The issue's second finding: a build killed mid-way left torch's `lock` file, and every
    later start waited on it forever, silently. Here a second start waits for the live build
    aloud, then builds once the first is killed."""
    cxx = tmp_path / "slow-cxx"
    cxx.write_text(SLOW_CXX)
    cxx.chmod(0o755)
    mark = tmp_path / "slow"
    mark.touch()
    env = _env(tmp_path, CXX=str(cxx), CBB_SLOW_MARK=str(mark))
    cmd = [sys.executable, "-c", DRIVER, str(src)]
    popen = dict(env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                 start_new_session=True)  # fmt: skip
    first = subprocess.Popen(cmd, **popen)
    second = None
    try:
        line = Lines(first, "the first build").until("building the test kernel", 120)
        folder = Path(re.search(r" in (\S+)$", line.strip()).group(1))
        deadline = time.monotonic() + 60
        while not (folder / build.TORCH_LOCK_NAME).exists():  # torch's own lock, taken
            assert time.monotonic() < deadline, "torch never took its build lock"
            time.sleep(0.1)

        second = subprocess.Popen(cmd, **popen)
        out = Lines(second, "the second build")
        out.until(f"waiting for the kernel build of pid {first.pid}", 120)
        mark.unlink()  # the next compile is fast
        os.killpg(first.pid, signal.SIGKILL)  # mid-build, as a readiness limit or Ctrl-C did
        first.wait(10)
        out.until(f"the kernel build of pid {first.pid} ended", 60)
        out.until("removed a stale build lock", 60)
        out.until("answer 42", 180)
        assert out.wait_exit(60) == 0
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                kill(p)


def test_the_lock_dies_with_its_holder_and_a_waiter_is_bounded(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "ext-0123"
    folder.mkdir()
    hold = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(folder / build.LOCK_NAME)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, b'%d' % os.getpid())\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        Lines(holder, "the lock holder").until("held", 60)
        monkeypatch.setattr(build, "PROGRESS_S", 0.3)
        waited = pytest.raises(build.KernelBuildWait, match=f"pid {holder.pid}")
        with waited, build.build_lock(folder, "test kernel", wait_s=1.0):
            pass
        err = capsys.readouterr().err
        assert f"cbbench kernels: waiting for the kernel build of pid {holder.pid}" in err
        assert "still waiting for the kernel build" in err
        holder.kill()  # SIGKILL: no clean-up of its own
        holder.wait(10)
        t0 = time.monotonic()
        with build.build_lock(folder, "test kernel", wait_s=30.0):
            assert (folder / build.LOCK_NAME).read_text().strip() == str(os.getpid())
            fd = os.open(folder / build.LOCK_NAME, os.O_RDWR)
            try:  # held by us now: another taker is refused
                with pytest.raises(BlockingIOError):
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            finally:
                os.close(fd)
        assert time.monotonic() - t0 < 5
    finally:
        if holder.poll() is None:
            kill(holder)
