"""`python -m cbbench.kernels.prebuild`: build every CPU kernel this host can run, ahead of
time (CI's setup step, a container image), so a first `cbbench serve` does not compile.

Prints one line per kernel (ready, or why not); exits 1 when a build failed.
"""

from __future__ import annotations

import sys


def main() -> int:
    from cbbench.kernels import cpu_bf16_dot, cpu_gemm, cpu_kv_attention, cpu_linear_bf16

    failed = 0
    for mod in (cpu_gemm, cpu_linear_bf16, cpu_kv_attention, cpu_bf16_dot):
        reason = mod.unavailable_reason()
        print(f"{mod.__name__}: {'ready' if reason is None else 'unavailable: ' + reason}")
        failed += reason is not None and reason.startswith("build failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
