"""oneDNN vs the "panels" kernel on the `small` model's projections, side by side.

    python -m tests.benchmarks.studies.cpu_gemm_bench --threads 1 2

Decode: 8 rows through all 37 distinct weights of a step (9 layers x qkv/o/gate_up/down + the
LM head), so every weight comes from memory as in a real step; ms per step and GB/s of
weights. Prefill: M rows through one layer's four projections (weights cached), ms and
GFLOP/s. Prints a table; asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from cbbench.kernels import cpu_gemm

LAYER = [(1536, 512), (512, 512), (4096, 512), (512, 2048)]  # small: qkv, o, gate_up, down
STEP = LAYER * 9 + [(32000, 512)]


def _time(fn: Callable[[], object], repeat: int) -> float:
    fn()
    fn()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        best = min(best, (time.perf_counter() - start) / repeat)
    return best * 1e3


def _impls(shapes: list[tuple[int, int]], m: int) -> dict[str, Callable[[], object]]:
    gen = torch.Generator().manual_seed(0)
    ws = [torch.randn(n, k, generator=gen) * 0.05 for n, k in shapes]
    xs = [torch.randn(m, k, generator=gen) for _, k in shapes]
    dnn = [torch.ops.mkldnn._reorder_linear_weight(w, 8) for w in ws]
    pan = [cpu_gemm.pack(w, None)[0] for w in ws]
    for w, x, d, p in zip(ws[:4], xs, dnn, pan, strict=False):
        want = x @ w.t()
        got_d = torch.ops.mkldnn._linear_pointwise(x, d, None, "none", [], "")
        torch.testing.assert_close(got_d, want, rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(
            cpu_gemm.linear(x, p, None, w.shape[0]), want, rtol=1e-4, atol=1e-3
        )

    def run_dnn() -> None:
        for x, d in zip(xs, dnn, strict=True):
            torch.ops.mkldnn._linear_pointwise(x, d, None, "none", [], "")

    def run_pan() -> None:
        for (n, _), x, p in zip(shapes, xs, pan, strict=True):
            cpu_gemm.linear(x, p, None, n)

    return {"onednn": run_dnn, "panels": run_pan}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--decode-rows", type=int, nargs="+", default=[8])
    p.add_argument("--prefill-rows", type=int, nargs="+", default=[64, 512, 2048])
    args = p.parse_args(argv)
    if cpu_gemm.load() is None:
        raise SystemExit(f"panels kernel unavailable: {cpu_gemm.unavailable_reason()}")
    step_gb = sum(n * k * 4 for n, k in STEP) / 1e9
    print(f"{'case':<24}{'threads':>8}{'onednn':>16}{'panels':>16}{'speedup':>9}")
    with torch.inference_mode():
        for threads in args.threads:
            torch.set_num_threads(threads)
            for m in args.decode_rows:
                ms = {k: _time(f, 10) for k, f in _impls(STEP, m).items()}
                cells = "".join(f"{v:7.2f} ms {step_gb / v * 1e3:4.1f}GB/s" for v in ms.values())
                print(
                    f"{f'decode step M={m}':<24}{threads:>8} {cells} {ms['onednn'] / ms['panels']:6.2f}x"
                )
            for m in args.prefill_rows:
                flop = sum(2 * m * n * k for n, k in LAYER) / 1e9
                ms = {k: _time(f, 3) for k, f in _impls(LAYER, m).items()}
                cells = "".join(f"{v:7.2f} ms {flop / v * 1e3:3.0f}GF/s" for v in ms.values())
                print(
                    f"{f'prefill layer M={m}':<24}{threads:>8} {cells} {ms['onednn'] / ms['panels']:6.2f}x"
                )


if __name__ == "__main__":
    main()
