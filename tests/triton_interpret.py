"""Import triton and the Triton kernel modules under TRITON_INTERPRET=1, then restore the
environment. triton.jit reads the variable when it decorates, so a test module whose fixture
sets it later imports this first: otherwise whatever imports triton before (torch._dynamo does)
leaves a compiled standard library that the interpreter refuses."""

from __future__ import annotations

import importlib.util
import os

if importlib.util.find_spec("triton") is not None:
    _saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton.language  # noqa: F401
        from cbbench.kernels import triton_attention, triton_cache  # noqa: F401
    finally:
        if _saved is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _saved
