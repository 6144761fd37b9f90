"""Compile every Triton kernel ahead of time for NVIDIA targets, on any machine.

The Triton interpreter (what CPU tests run) accepts code that the GPU compiler rejects
(e.g. reading a plain global from a kernel), so this lowers each kernel, per dtype, through
Triton's real pipeline down to PTX and cubin (ptxas ships with triton) for sm_80 and sm_90.
No GPU or driver needed.

    python -m tests.benchmarks.gpu.compile_check            # exit 1 if any kernel fails
"""

from __future__ import annotations

import argparse
import os
import sys

DTYPES = ("bf16", "fp16", "fp32")
INDEX_PTRS = {"block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "query_start_loc_ptr": "*i32",
              "slot_ptr": "*i64", "part_out_ptr": "*fp32", "part_lse_ptr": "*fp32"}  # fmt: skip


def _signature(arg_names: list[str], dtype: str, constexprs: dict) -> dict[str, str]:
    """Argument types by naming convention: data pointers in `dtype`, index/partial pointers
    as in INDEX_PTRS, `scale` fp32, block strides i64 (pools past 2**31), other ints i32."""
    sig = {}
    for name in arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in INDEX_PTRS:
            sig[name] = INDEX_PTRS[name]
        elif name.endswith("_ptr"):
            sig[name] = f"*{dtype}"
        elif name == "scale":
            sig[name] = "fp32"
        else:
            sig[name] = "i64" if name == "stride_cb" else "i32"
    return sig


def kernel_configs(dtype: str) -> list[tuple[str, object, dict]]:
    """(label, kernel, constexprs) as the launch wrappers use them for llama-like heads."""
    from cbbench.kernels import triton_attention as ta
    from cbbench.kernels import triton_cache as tc

    f32 = dtype == "fp32"
    dot = {"DOT_PRECISION": "ieee" if f32 else "tf32", "DOT_F32": f32, "QUANT": False}
    return [
        ("decode", ta._decode_split_kernel,
         dict(GROUP=4, BLOCK_G=16, BLOCK_N=64, BLOCK_D=128, **dot)),
        ("decode-mha-d64", ta._decode_split_kernel,
         dict(GROUP=1, BLOCK_G=16, BLOCK_N=32, BLOCK_D=64, **dot)),
        ("merge", ta._decode_merge_kernel, dict(BLOCK_S=4, BLOCK_D=128)),
        ("prefill", ta._prefill_kernel,
         dict(GROUP=4, BLOCK_M=64, BLOCK_N=64, BLOCK_D=128, **dot)),
        ("reshape_and_cache", tc._reshape_and_cache_kernel, dict(BLOCK_H=8, BLOCK_D=128, QUANT=False)),
    ]  # fmt: skip


def compile_all(
    archs: list[int], dtypes: tuple[str, ...] = DTYPES, dry_run: bool = False
) -> list[dict]:
    """`dry_run`: build each kernel's typed source (names, signature, constexprs) but do not
    lower it (the CPU dry run of run_all.py; a compile takes minutes on a small CPU)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    results = []
    for arch in archs:
        for dtype in dtypes:
            for label, kernel, constexprs in kernel_configs(dtype):
                names = kernel.arg_names
                src = ASTSource(
                    fn=kernel,
                    signature=_signature(names, dtype, constexprs),
                    constexprs={(names.index(k),): v for k, v in constexprs.items()},
                )
                row = {"kernel": label, "dtype": dtype, "arch": f"sm_{arch}"}
                if dry_run:
                    results.append(row | {"ok": True, "dry_run": True})
                    continue
                try:
                    compiled = triton_compile(src, target=GPUTarget("cuda", arch, 32))
                    row |= {"ok": True, "shared_bytes": compiled.metadata.shared}
                except Exception as exc:  # any compiler error is the finding
                    row |= {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
                results.append(row)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.benchmarks.gpu.compile_check")
    p.add_argument("--arch", default="80,90", help="compute capabilities, e.g. 80,90")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="cache dtypes: bf16,fp16,fp32")
    p.add_argument("--dry-run", action="store_true", help="typed sources only, no lowering")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("compile_check: unset TRITON_INTERPRET (interpreted kernels do not compile)",
              file=sys.stderr)  # fmt: skip
        return 1
    try:
        archs = [int(a) for a in args.arch.split(",")]
    except ValueError:
        p.error(f"--arch: expected integers like 80,90, got {args.arch!r}")
    dtypes = tuple(args.dtypes.split(","))
    if not set(dtypes) <= set(DTYPES):
        p.error(f"--dtypes: choose from {','.join(DTYPES)}, got {args.dtypes!r}")
    results = compile_all(archs, dtypes, args.dry_run)
    for r in results:
        if r.get("dry_run"):
            status = "typed source built (dry run: not compiled)"
        elif r["ok"]:
            status = f"ok, {r['shared_bytes']} B shared"
        else:
            status = f"FAILED\n{r['error']}"
        print(f"{r['arch']} {r['kernel']:<18} {r['dtype']}: {status}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
