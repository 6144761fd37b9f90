"""A socket read with its receive time (CLOCK_MONOTONIC, ns): the kernel's `SO_TIMESTAMPNS`
stamp where Linux attached one, else the time the read returned (docs/timing.md "Kernel
receive timestamps"). `SockConn._readable` reads with the compiled `cread.recv` where it is
built, else with `read_py`, the reference it is tested against
(tests/test_client_cread_recv.py).
"""

from __future__ import annotations

import platform
import socket
import struct
import sys
import time

from cbbench.harness.client.cread import RECV

# SO_TIMESTAMPNS(_OLD) = SCM_TIMESTAMPNS on the asm-generic ABI (x86, arm, riscv, ...); Python's
# socket module does not export it. 64-bit only: the cmsg is a native struct timespec.
SO_TIMESTAMPNS = 35
_GENERIC_ABI = ("x86_64", "aarch64", "arm64", "riscv64", "ppc64le", "s390x", "loongarch64")
_ANC_SIZE = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0


def read_py(sock: socket.socket, size: int) -> tuple[bytes, int, int] | None:
    """(data, t, delay): at most `size` bytes (b"" at the end of file) and their stamp; delay
    = when the read returned - t for a kernel stamp, -1 for a user one (t = that time).
    None: nothing to read. OSError for anything else."""
    try:
        data, anc, _, _ = sock.recvmsg(size, _ANC_SIZE)
    except (BlockingIOError, InterruptedError):
        return None
    now = time.monotonic_ns()
    for level, kind, cdata in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(cdata) >= 16:
            sec, nsec = struct.unpack_from("qq", cdata)
            # CLOCK_REALTIME -> CLOCK_MONOTONIC (both slew alike; a step between the two
            # reads of the clocks is the only error); a stamp not below `now` is not taken
            t = min(now, sec * 1_000_000_000 + nsec - (time.time_ns() - now))
            if t is not now:
                return data, t, now - t
            break
    return data, now, -1


_recv = RECV  # `read_py` in one C call on the descriptor (or None); use_compiled_read toggles it


def kernel_timestamps_supported() -> str | None:
    """None when SO_TIMESTAMPNS can be used here, else why not."""
    if sys.platform != "linux":
        return f"not Linux ({sys.platform})"
    if platform.machine().lower() not in _GENERIC_ABI or not _ANC_SIZE:
        return f"SO_TIMESTAMPNS not mapped for {platform.machine()}"
    return None
