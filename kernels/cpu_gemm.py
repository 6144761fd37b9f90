"""The CPU kernels (csrc/): the "panels" projection (cpu_gemm.cpp), paged decode attention
(cpu_attention.cpp, through kernels/cpu_attention.py) and row ops (cpu_ops.cpp, through
kernels/cpu_ops.py), one extension built on first use.

fp32 only, AVX-512 CPUs only. `load()` compiles the C++ source with
`torch.utils.cpp_extension.load` through kernels/build.py (a folder per environment and flags,
an OS lock that dies with its holder, progress on stderr) and returns the module, or None with
one logged reason: not x86-64 Linux, no AVX-512F, no ninja/compiler, the build failed or
another process's build took too long. Callers then keep oneDNN. Nothing here is needed to
install cbbench.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import threading
import warnings
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

CSRC = Path(__file__).parent / "csrc"
SOURCES = [
    CSRC / f
    for f in (
        "cpu_gemm.cpp", "cpu_attention.cpp", "cpu_prefill_attention.cpp", "cpu_ops.cpp",
        "cpu_sample.cpp", "bindings.cpp",
    )
]  # fmt: skip
PANEL = 32  # outputs per panel, as in the C++ source
CFLAGS = ["-O3", "-march=native", "-fopenmp"]

_lock = threading.Lock()
_state: dict[str, object] = {}  # "module" or "reason", set once


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _precheck(need_avx512: bool = True) -> str | None:
    """Why the kernel cannot be built here, or None (`need_avx512=False`: the portable
    sources, e.g. cpu_kv_attention's)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"needs x86-64 Linux, not {platform.system()} {platform.machine()}"
    if need_avx512 and "avx512f" not in _cpu_flags():
        return "the CPU lacks AVX-512F"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.utils import cpp_extension

    if not cpp_extension.is_ninja_available():
        return "ninja is not installed (torch builds extensions with it)"
    return None


def _build(
    extra_cflags: list[str] | None = None,
    name: str = "cbbench_cpu_kernels",
    sources: list[Path] | None = None,
    what: str = "CPU kernels",
    usual: str = "about a minute",
) -> ModuleType:
    from cbbench.kernels.build import build_extension

    return build_extension(
        name, sources or SOURCES, what, CFLAGS + list(extra_cflags or []), ["-fopenmp"], usual
    )


def load_portable(
    state: dict[str, object],
    lock: threading.Lock,
    name: str,
    sources: list[Path],
    what: str,
    fallback: str,
) -> ModuleType | None:
    """Build (once, into `state`) and return a portable extension of these sources (no
    AVX-512 needed: cpu_linear_bf16's, cpu_kv_attention's), or None with one logged reason
    kept in state["reason"]: not x86-64 Linux, no compiler or ninja, or the build failed."""
    mod = state.get("module")  # built: no lock (every projection of a step asks)
    if mod is not None:
        return mod  # type: ignore[return-value]
    with lock:
        if not state:
            reason = _precheck(need_avx512=False)
            cxx = os.environ.get("CXX", "c++")
            if reason is None and shutil.which(cxx) is None:
                reason = f"no C++ compiler ({cxx!r} is not on PATH)"
            if reason is None:
                log.info("loading the %s (built once, under a minute)", what)
                try:
                    usual = "about 30 s"
                    state["module"] = _build(name=name, sources=sources, what=what, usual=usual)
                except Exception as exc:  # compiler missing, build or import error
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    reason = f"build failed: {first[:300]}"
            if reason is not None:
                state["reason"] = reason
                log.warning("%s unavailable (%s): %s", what, reason, fallback)
        return state.get("module")  # type: ignore[return-value]


def load() -> ModuleType | None:
    """The compiled module, or None (the reason is in `unavailable_reason()`)."""
    mod = _state.get("module")  # built: no lock (every projection of a step asks)
    if mod is not None:
        return mod  # type: ignore[return-value]
    with _lock:
        if not _state:
            reason = _precheck()
            if reason is None:
                log.info("loading the CPU kernels (built once, about a minute)")
                try:
                    _state["module"] = _build()
                except Exception as exc:  # compiler missing, build or import error
                    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                    reason = f"build failed: {first[:300]}"
            if reason is not None:
                _state["reason"] = reason
                log.warning("CPU kernels unavailable (%s): oneDNN linears, torch attention", reason)
        return _state.get("module")  # type: ignore[return-value]


def unavailable_reason() -> str | None:
    load()
    return _state.get("reason")  # type: ignore[return-value]


def pack(
    weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """W [N, K] fp32 -> (panels [ceil(N/32), K, 32], bias padded to the panels or None)."""
    mod = load()
    assert mod is not None and weight.dtype == torch.float32 and weight.dim() == 2
    panels = mod.pack(weight.detach().contiguous())
    if bias is None:
        return panels, None
    padded = torch.zeros(panels.shape[0] * PANEL, dtype=torch.float32)
    padded[: bias.numel()] = bias.detach().float()
    return panels, padded


def linear(
    x: torch.Tensor, panels: torch.Tensor, bias: torch.Tensor | None, out_features: int
) -> torch.Tensor:
    """x [..., K] @ W^T (+ bias) -> [..., out_features]."""
    mod = load()
    assert mod is not None
    x2 = x.reshape(-1, x.shape[-1])
    if not x2.is_contiguous():
        x2 = x2.contiguous()
    y = mod.linear(x2, panels, bias, out_features)
    return y.view(*x.shape[:-1], out_features)
