"""The CPU engine's large long-lived buffers (weights, packed panels, the KV cache) on 2 MiB
transparent huge pages.

A decode step streams every weight once (217 MB in fp32 on `small`); on 4 KiB pages one core
read them here at ~18 GB/s, from memory madvised MADV_HUGEPAGE before its first touch at
28-30 GB/s (fewer TLB misses on a linear stream). Hosts often run THP in "madvise" mode, so
torch's own allocations never get huge pages: here an anonymous mmap, 2 MiB aligned, is
madvised MADV_HUGEPAGE (then MADV_COLLAPSE, Linux 6.1+, for any range the fault path left on
small pages) and the tensors are copied into it, bitwise, as views of one arena.

`CBBENCH_HUGEPAGES=0` keeps torch's allocations (A/B runs). Where THP is "never", the OS is
not Linux or madvise fails, the buffers stay ordinary and `Arena.status` says why in one line
(the engine puts it in its start-up line).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

ENV = "CBBENCH_HUGEPAGES"
HUGE = 2 << 20  # the x86-64 THP size
ALIGN = 4096  # each tensor starts on its own page: the kernels' alignment never changes
MADV_COLLAPSE = 25  # Linux 6.1+; absent from Python's mmap module before 3.14
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def unavailable_reason() -> str | None:
    """Why buffers cannot be put on huge pages here, or None."""
    env = os.environ.get(ENV, "1").strip().lower()
    if env in ("0", "off", "false", "no"):
        return f"off (${ENV}={env})"
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return "this OS has no madvise(MADV_HUGEPAGE)"
    try:
        mode = re.search(r"\[(\w+)\]", THP_ENABLED.read_text())
    except OSError:
        return f"{THP_ENABLED} is unreadable (no transparent huge pages)"
    if mode is None or mode.group(1) == "never":
        return "transparent huge pages are 'never' on this host"
    return None


@dataclass
class Arena:
    """One anonymous mapping; `take` hands out page-aligned byte ranges as tensors (each
    keeps the mapping alive)."""

    nbytes: int
    status: str = ""  # "" until allocated; then a line for the start-up log

    def __post_init__(self) -> None:
        self.reason = unavailable_reason()
        self._used = 0
        self._bytes: torch.Tensor | None = None
        if self.reason is not None or self.nbytes == 0:
            return
        size = -(-self.nbytes // HUGE) * HUGE
        try:
            self._map = mmap.mmap(-1, size + HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            whole = torch.frombuffer(self._map, dtype=torch.uint8)  # holds a reference
            skip = -whole.data_ptr() % HUGE  # the first 2 MiB boundary
            self._map.madvise(mmap.MADV_HUGEPAGE, skip, size)  # before the first touch
        except (OSError, ValueError) as exc:
            self.reason = f"madvise(MADV_HUGEPAGE) failed: {exc}"
            return
        self._bytes = whole[skip : skip + size]
        self._skip, self._size = skip, size

    def take(self, nbytes: int, dtype: torch.dtype, shape: Iterable[int]) -> torch.Tensor:
        """Uninitialised (zero until written) tensor of `shape` from the arena, or from torch
        where the arena is off."""
        shape = tuple(shape)
        if self._bytes is None:
            return torch.empty(shape, dtype=dtype)
        assert self._used + nbytes <= self._bytes.numel(), "arena too small"
        t = self._bytes[self._used : self._used + nbytes].view(dtype).view(shape)
        self._used += -(-nbytes // ALIGN) * ALIGN
        return t

    def settle(self, what: str) -> str:
        """After the arena is written: MADV_COLLAPSE what the fault path left small (best
        effort) and return the start-up line, e.g. "weights: 217 MB, 216 MB on 2 MiB pages"."""
        mb = self.nbytes / 1e6
        if self._bytes is None:
            self.status = f"{what}: {mb:.0f} MB on ordinary pages ({self.reason or 'empty'})"
            return self.status
        if self.huge_bytes() < self._used - HUGE:
            # older kernel, or no free huge pages: keep what the faults got
            with contextlib.suppress(OSError):
                self._map.madvise(MADV_COLLAPSE, self._skip, self._size)
        huge = min(self.huge_bytes(), self.nbytes)
        self.status = f"{what}: {mb:.0f} MB, {huge / 1e6:.0f} MB of it on 2 MiB pages"
        return self.status

    def huge_bytes(self) -> int:
        """Bytes of this mapping backed by huge pages now (/proc/self/smaps)."""
        if self._bytes is None:
            return 0
        return mapping_huge_bytes(self._bytes.data_ptr())


def mapping_huge_bytes(address: int) -> int:
    """AnonHugePages of the mapping holding `address` (0 where /proc is not there)."""
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return 0
    inside = False
    for line in lines:
        head = line.split(None, 1)[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1]) * 1024
    return 0


def _movable(t: torch.Tensor) -> bool:
    return (
        t.device.type == "cpu"
        and t.layout == torch.strided
        and not t.is_mkldnn
        and t.is_contiguous()
        and t.storage_offset() == 0
        and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    )


def _tensor_slots(model: nn.Module):
    """(owner dict, name, tensor) of every parameter, buffer and tensor attribute (packed
    panels, scales, biases) of `model`'s modules."""
    for m in model.modules():
        for d in (m._parameters, m._buffers, m.__dict__):
            for name, t in list(d.items()):
                if isinstance(t, torch.Tensor):
                    yield d, name, t


def move_module(model: nn.Module, min_bytes: int = 64 << 10) -> Arena:
    """Copy every tensor of `model` of `min_bytes` or more into one huge-page arena (tied
    tensors stay tied, values bitwise unchanged); returns the arena (`status`: the log
    line). Where huge pages are unavailable nothing moves."""
    seen: dict[int, torch.Tensor] = {}  # old data_ptr -> its copy
    slots = [[d, n, t, t.data_ptr()] for d, n, t in _tensor_slots(model)
             if t.numel() * t.element_size() >= min_bytes and _movable(t)]  # fmt: skip
    sizes = {ptr: t.numel() * t.element_size() for _, _, t, ptr in slots}
    arena = Arena(sum(-(-b // ALIGN) * ALIGN for b in sizes.values()))
    if arena.reason is not None:
        arena.settle("weights")
        return arena
    with torch.no_grad():
        for slot in slots:
            d, name, t, ptr = slot
            slot[2] = None  # the old storage goes as soon as nothing else holds it
            if ptr not in seen:
                seen[ptr] = arena.take(sizes[ptr], t.dtype, t.shape)
                seen[ptr].copy_(t)
            if isinstance(t, nn.Parameter):
                t.data = seen[ptr]  # the same Parameter object: ties hold
            else:
                d[name] = seen[ptr]
            del t
    arena.settle("weights")
    return arena


def zeros(
    shape: Iterable[int], dtype: torch.dtype, what: str = "KV cache"
) -> tuple[torch.Tensor, Arena]:
    """A zero tensor on huge pages (the KV cache), and its arena (`status`: the log line)."""
    shape = tuple(shape)
    nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    arena = Arena(nbytes)
    t = arena.take(nbytes, dtype, shape)
    t.zero_()  # touch now: the faults (and any compaction) at start-up, not in a step
    arena.settle(what)
    return t, arena
