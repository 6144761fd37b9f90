"""Building the C++ CPU extensions: a folder per build, a lock that dies with its holder, and a
voice on stderr.

- Folder: `<root>/<name>-<key>`, the key a hash of everything that makes two builds differ:
  torch's version and include paths (so the environment torch lives in), Python's include
  folder, the compiler (`CXX`), the flags, the sources' bytes and the headers beside them.
  Two environments on one machine never share (and so never rebuild) each other's kernels;
  one environment builds once.
  Root: `CBBENCH_KERNEL_DIR`, else `TORCH_EXTENSIONS_DIR`, else torch's extension cache, then
  `cbbench/`.
- Lock: `fcntl.flock` on `<folder>/cbbench.lock`, an OS lock the kernel drops when its holder
  dies (SIGKILL included); the file names the holder's pid. torch's own `lock` file (a plain
  file that a killed build leaves behind, on which every later build waits forever) is only
  ever taken under ours, so one found while we hold ours is stale and removed.
- Voice: a first build says so and how long it usually takes, then "still building" every
  PROGRESS_S; a start that waits for another process's build says "waiting for the kernel
  build of pid N", then progress, and gives up after BUILD_WAIT_S (the caller falls back).
  Every such line starts with KERNEL_LINE_PREFIX: the launcher reads it as progress.

Why build on first use and not ship a binary: the kernels are compiled `-march=native` (their
speed is the host's AVX-512/AVX2 code paths), which a wheel cannot carry. `python -m
cbbench.kernels.prebuild` builds them ahead of time (CI's setup, a container image).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sys
import sysconfig
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType

KERNEL_LINE_PREFIX = "cbbench kernels: "  # harness/servers/launcher.py matches it
PROGRESS_S = 15.0  # between "still building" / "still waiting" lines
BUILD_WAIT_S = 900.0  # longest wait for another process's build, then give up
POLL_S = 0.2
LOCK_NAME = "cbbench.lock"
TORCH_LOCK_NAME = "lock"  # torch.utils.cpp_extension's FileBaton


class KernelBuildWait(RuntimeError):
    """Another process held the build longer than BUILD_WAIT_S."""


def say(message: str) -> None:
    print(KERNEL_LINE_PREFIX + message, file=sys.stderr, flush=True)


def _cpp_extension():  # noqa: ANN202
    with warnings.catch_warnings():  # setuptools' pkg_resources warns about editable installs
        warnings.simplefilter("ignore")
        from torch.utils import cpp_extension
    return cpp_extension


def build_root() -> Path:
    root = os.environ.get("CBBENCH_KERNEL_DIR") or os.environ.get("TORCH_EXTENSIONS_DIR")
    return Path(root or _cpp_extension().get_default_build_root()) / "cbbench"


def build_key(
    sources: Sequence[Path],
    cflags: Sequence[str],
    ldflags: Sequence[str],
    include_paths: Sequence[str] | None = None,
) -> str:
    """16 hex digits over what makes a build differ (include_paths: torch's, by default)."""
    import torch

    if include_paths is None:
        include_paths = _cpp_extension().include_paths()
    h = hashlib.sha256()
    parts = [
        torch.__version__,
        sys.version,
        sysconfig.get_paths()["include"],
        os.environ.get("CXX", "c++"),
        *include_paths,
        "--cflags", *cflags,
        "--ldflags", *ldflags,
    ]  # fmt: skip
    for part in parts:
        h.update(part.encode() + b"\0")
    for src in sources:
        h.update(Path(src).name.encode() + b"\0" + Path(src).read_bytes())
    for header in sorted({f for src in sources for f in Path(src).parent.glob("*.h")}):
        h.update(header.name.encode() + b"\0" + header.read_bytes())  # included, not listed
    return h.hexdigest()[:16]


def build_dir(name: str, key: str) -> Path:
    return build_root() / f"{name}-{key}"


def _holder(lock_path: Path) -> str:
    try:
        return lock_path.read_text().strip() or "?"
    except OSError:
        return "?"


@contextlib.contextmanager
def build_lock(folder: Path, what: str, wait_s: float = BUILD_WAIT_S) -> Iterator[None]:
    """Hold the folder's OS lock (waiting, aloud, up to wait_s for another holder)."""
    folder.mkdir(parents=True, exist_ok=True)
    lock_path = folder / LOCK_NAME
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _wait(fd, lock_path, what, wait_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        stale = folder / TORCH_LOCK_NAME
        if stale.exists():  # left by a build killed mid-way: nobody else can hold it now
            say(f"removed a stale build lock left by a killed build ({stale})")
            stale.unlink(missing_ok=True)
        yield
    finally:
        os.close(fd)  # releases the flock


def _wait(fd: int, lock_path: Path, what: str, wait_s: float) -> None:
    pid = _holder(lock_path)
    say(f"waiting for the kernel build of pid {pid} ({what}, in {lock_path.parent})")
    t0 = time.monotonic()
    next_note = t0 + PROGRESS_S
    while True:
        time.sleep(POLL_S)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            now = time.monotonic()
            if now - t0 > wait_s:
                raise KernelBuildWait(
                    f"waited {wait_s:g}s for the kernel build of pid {pid} in {lock_path.parent}"
                ) from None
            if now >= next_note:
                say(f"still waiting for the kernel build of pid {pid} ({now - t0:.0f} s)")
                next_note = now + PROGRESS_S
            continue
        say(f"the kernel build of pid {pid} ended after {time.monotonic() - t0:.0f} s")
        return


@contextlib.contextmanager
def _ticker(what: str) -> Iterator[None]:
    stop = threading.Event()
    t0 = time.monotonic()

    def tick() -> None:
        while not stop.wait(PROGRESS_S):
            say(f"still building the {what} ({time.monotonic() - t0:.0f} s)")

    thread = threading.Thread(target=tick, name="cbbench-kernel-build", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(1.0)


def build_extension(
    name: str,
    sources: Sequence[Path],
    what: str,
    cflags: Sequence[str] = (),
    ldflags: Sequence[str] = (),
    usual: str = "about a minute",
    wait_s: float = BUILD_WAIT_S,
) -> ModuleType:
    """Build (once per key) and import the extension; raises on a failed build or wait."""
    cpp_extension = _cpp_extension()
    folder = build_dir(name, build_key(sources, cflags, ldflags))
    with build_lock(folder, what, wait_s):
        fresh = not (folder / f"{name}.so").exists()
        if fresh:
            say(f"building the {what} (first use in this environment; usually {usual}) in {folder}")
        t0 = time.monotonic()
        with _ticker(what) if fresh else contextlib.nullcontext():
            module = cpp_extension.load(
                name=name,
                sources=[str(p) for p in sources],
                extra_cflags=list(cflags),
                extra_ldflags=list(ldflags),
                build_directory=str(folder),
                verbose=False,
            )
        if fresh:
            say(f"built the {what} in {time.monotonic() - t0:.0f} s")
        return module
