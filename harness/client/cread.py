"""The raw client's compiled read path (`csrc/cread.c`): one C call per socket read does the
chunked framing, the SSE split and the common chunk's decode that `chunks.py`, `sse.py` and
`fast_events.py` do in Python (`Response.read_chunked` calls it; docs/performance.md).
The same module reads a socket with its kernel stamp (`recv`, for `SockConn._readable`) and
decodes a stream's first, finish and usage chunks (`first`, `last`, `usage`) as `_apply`
would fold them (`Response._events`).

Built like the CPU kernels: compiled once per source and interpreter with the C compiler
(`CC`, else Python's, else `cc`), cached in `CBBENCH_KERNEL_DIR` (else `~/.cache/cbbench`)
under a key of everything that makes two builds differ, and imported from there. A failed
build says so in one line on stderr, is remembered (no retry per process), and the Python
path runs instead, as it does with `CBBENCH_NO_CREAD=1`. `python -m
cbbench.harness.client.cread` builds it ahead of time (CI's setup), retrying a failed one.

The Python path stays the reference: tests/test_client_cread.py runs the client's framing and
stream tests through both and fuzzes one against the other.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shlex
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

from cbbench.harness.envflags import env_flag

NAME = "_cbbench_cread"
SOURCE = Path(__file__).parent / "csrc" / "cread.c"
CFLAGS = ("-O2", "-fPIC", "-shared", "-fno-strict-aliasing", "-ffp-contract=off") + (
    ("-undefined", "dynamic_lookup") if sys.platform == "darwin" else ()
)
PREFIX = "cbbench client: "

_reason: str | None = None


def compiler() -> list[str]:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shlex.split(cc)


def build_folder() -> Path:
    root = os.environ.get("CBBENCH_KERNEL_DIR")
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / ("cbbench" if not root else "") / "client"


def build_key() -> str:
    h = hashlib.sha256()
    for part in (sys.version, sysconfig.get_paths()["include"], *compiler(), *CFLAGS):
        h.update(part.encode() + b"\0")
    h.update(SOURCE.read_bytes())
    return h.hexdigest()[:16]


def _paths() -> tuple[Path, Path]:
    stem = build_folder() / f"{NAME}-{build_key()}"
    return stem.with_suffix(sysconfig.get_config_var("EXT_SUFFIX") or ".so"), stem.with_suffix(
        ".failed"
    )


def _build(so: Path, failed: Path) -> None:
    """Compile to a private file, then rename it into place (atomic: workers may race)."""
    so.parent.mkdir(parents=True, exist_ok=True)
    tmp = so.with_name(f"{so.name}.{os.getpid()}.tmp")
    cmd = [*compiler(), *CFLAGS, f"-I{sysconfig.get_paths()['include']}", str(SOURCE), "-o"]
    try:
        out = subprocess.run([*cmd, str(tmp)], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{cmd[0]}: {exc}") from None
    if out.returncode != 0:
        tmp.unlink(missing_ok=True)
        first = (out.stderr.strip().splitlines() or ["no message"])[0]
        raise RuntimeError(f"{cmd[0]} exited {out.returncode}: {first}")
    os.replace(tmp, so)
    failed.unlink(missing_ok=True)


def _import(so: Path):  # noqa: ANN202
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(so))
    spec = importlib.util.spec_from_file_location(NAME, str(so), loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load(retry: bool = False):  # noqa: ANN201
    """The built module (building it first if needed), or None (see `reason`)."""
    global _reason
    if env_flag("CBBENCH_NO_CREAD"):
        _reason = "off (CBBENCH_NO_CREAD)"
        return None
    try:
        so, failed = _paths()
        if failed.exists() and not retry:
            _reason = f"build failed before: {failed.read_text().strip()}"
            return None
        if not so.exists():
            try:
                _build(so, failed)
            except RuntimeError as exc:
                _reason = f"build failed: {exc}"
                _note(f"did not build ({exc})")
                failed.write_text(str(exc) + "\n")  # remembered: no retry per process
                return None
        return _import(so)
    except (OSError, ImportError) as exc:  # a folder it cannot write, a module it cannot load
        _reason = f"unavailable: {type(exc).__name__}: {exc}"
        _note(f"is unavailable ({type(exc).__name__}: {exc})")
        return None


def _note(what: str) -> None:
    print(
        f"{PREFIX}the compiled read path {what}; using the Python path (slower, same results; "
        "`python -m cbbench.harness.client.cread` retries)",
        file=sys.stderr,
        flush=True,
    )


def reason() -> str | None:
    """None when the compiled read path is in use, else why not."""
    return _reason


_module = load()
SCAN: Callable | None = _module.scan if _module is not None else None  # one read, one call
COUNT: Callable | None = _module.count if _module is not None else None  # common chunks
TIMES: Callable | None = _module.times if _module is not None else None  # token times, gaps
FIRST: Callable | None = _module.first if _module is not None else None  # an answer's text
LAST: Callable | None = _module.last if _module is not None else None  # the finish chunk
USAGE: Callable | None = _module.usage if _module is not None else None  # the usage chunk
# a socket read with its receive stamp (Linux: SO_TIMESTAMPNS), else None
RECV: Callable | None = getattr(_module, "recv", None) if _module is not None else None


def main() -> int:
    module = load(retry=True)
    print(f"{NAME}: {'ready' if module is not None else _reason}")
    return 0 if module is not None or env_flag("CBBENCH_NO_CREAD") else 1


if __name__ == "__main__":
    sys.exit(main())
