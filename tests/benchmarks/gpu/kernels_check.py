"""GPU check for the paged-attention kernels: correctness on CUDA, decode bandwidth and
prefill throughput. Under 5 minutes on one GPU.

    python -m tests.benchmarks.gpu.kernels_check --out results/gpu-check          # kernels only
    python -m tests.benchmarks.gpu.engine_check --out results/gpu-check # + the engine on them

Writes DIR/bench_gpu.json and DIR/summary.txt. Exits 2 without CUDA or Triton (one line), and 3 when a
correctness case fails. The engine end to end on the Triton path lives with the engine
(tests/benchmarks/gpu/engine_check.py): kernels/ imports nothing from the engine.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from cbbench.kernels import get_attention_backend
from cbbench.kernels.reference import make_paged_case, ref_paged_attention
from cbbench.kernels.torch_backend import TorchAttentionBackend

from tests.benchmarks.gpu.kernels_report import decode_bytes, peak_bandwidth, write_results

GOAL = {"batch": 64, "context": 4096, "fraction": 0.80}
HEADS = {"num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "block_size": 16}  # llama-3-8b
PREFILL_CASES = [(1, 2048, 0), (4, 2048, 0), (1, 8192, 0), (4, 1024, 3072)]  # seqs, new, cached
KEYS = ("q", "k_cache", "v_cache", "block_tables", "seq_lens", "query_start_loc")
TOL = {torch.float32: 2e-3, torch.float16: 5e-3, torch.bfloat16: 2e-2}
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int8": torch.int8}  # int8: quantized KV caches (int8_checks)  # fmt: skip


@dataclass
class CheckResult:
    name: str
    dtype: str
    max_abs_err: float
    tol: float
    passed: bool


def correctness_grid(device: torch.device, dtypes: list[torch.dtype], quick: bool) -> list:
    """Both attention kernels on every case: the prefill kernel on all queries, the decode
    kernel on each sequence's last query. References: the oracle (small cases, run on CPU),
    the torch backend on the same device (long contexts). Plus reshape_and_cache, exactly.
    Runs on CPU tensors too, under TRITON_INTERPRET=1."""
    from cbbench.kernels import triton_attention

    triton_be = get_attention_backend("triton", device)
    torch_be = TorchAttentionBackend(device)
    small = [  # seq_lens, query_lens, block_size, Hkv, group
        ([7], [7], 1, 2, 1),
        ([40, 23], [8, 23], 16, 2, 8),
        ([70, 9, 33, 1], [1, 3, 1, 1], 32, 2, 4),
        ([130, 5, 64], [1, 1, 1], 16, 2, 4),
    ]
    large = [
        ([4096, 1000, 17], [1, 1, 1], 16, 8, 4),
        ([32768, 5000], [1, 1], 16, 8, 4),
        ([3000, 2048], [1000, 2048], 16, 8, 4),  # chunked prefill on a 2000-token prefix
        ([8192], [8192], 64, 8, 1),
    ]
    cases = [(case, 16, None) for case in small]
    if not quick:
        cases += [(case, 128, None) for case in large]
        cases.append((([45, 20], [5, 20], 16, 1, 4), 16, 2**23 + 64))  # pool past 2**31 elements
    results = []
    for dtype in dtypes:
        if dtype == torch.int8:
            results += int8_checks(device, small if quick else small + large)
            continue
        name = str(dtype).removeprefix("torch.")
        for case, head_dim, pool in cases:
            c = make_paged_case(
                *case, head_dim=head_dim, dtype=dtype, device=device, num_blocks=pool
            )
            args = [c[k] for k in KEYS]
            scale = head_dim**-0.5
            if case in small or pool:
                ref = ref_paged_attention(*[a.cpu() for a in args], scale).to(device)
            else:
                ref = torch_be.paged_attention(*args, scale).float()
            tol = TOL[dtype] * max(1.0, float(ref.abs().max()))
            label = f"seq_lens={case[0]} qlens={case[1]} bs={case[2]} g={case[4]}"
            if pool:
                label += f" pool={pool} blocks"
            out = triton_attention.paged_prefill_attention(*args, scale, max_query_len=max(case[1]))
            err = float((out.float() - ref).abs().max())
            results.append(CheckResult("prefill " + label, name, err, tol, err <= tol))
            last = (c["query_start_loc"][1:] - 1).long()
            dec = triton_be.paged_decode_attention(c["q"][last], *args[1:5], scale)
            err = float((dec.float() - ref[last]).abs().max())
            results.append(CheckResult("decode " + label, name, err, tol, err <= tol))
            del c, args, ref, out, dec
        kc = torch.zeros(64, 16, 8, 128, dtype=dtype, device=device)
        vc = torch.zeros_like(kc)
        key = torch.randn(50, 8, 128, device=device).to(dtype)
        slots = torch.randperm(64 * 16, device=device)[:50]
        slots[::7] = -1
        triton_be.reshape_and_cache(key, -key, kc, vc, slots)
        rk, rv = torch.zeros_like(kc), torch.zeros_like(vc)
        torch_be.reshape_and_cache(key, -key, rk, rv, slots)
        err = float(((kc - rk).abs().max() + (vc - rv).abs().max()).float())
        results.append(CheckResult("reshape_and_cache", name, err, 0.0, err == 0.0))
    return results


def int8_checks(device: torch.device, cases: list) -> list[CheckResult]:
    """int8 KV caches (kernels/kv_quant.py): both Triton kernels against the torch backend
    on the same quantized cache (it dequantizes, then attends in fp32) to 2e-3 x max |ref|,
    and the quantizing write byte for byte."""
    from cbbench.kernels import kv_quant, triton_attention

    triton_be = get_attention_backend("triton", device)
    torch_be = TorchAttentionBackend(device)
    results = []
    for case in cases:
        c = make_paged_case(*case, head_dim=64, device=device)
        c["k_cache"] = kv_quant.quantize(c["k_cache"], torch.int8)
        c["v_cache"] = kv_quant.quantize(c["v_cache"], torch.int8)
        args = [c[k] for k in KEYS]
        scale = 64**-0.5
        ref = torch_be.paged_attention(*args, scale).float()
        tol = 2e-3 * max(1.0, float(ref.abs().max()))
        label = f"seq_lens={case[0]} qlens={case[1]} bs={case[2]} g={case[4]}"
        out = triton_attention.paged_prefill_attention(*args, scale, max_query_len=max(case[1]))
        err = float((out.float() - ref).abs().max())
        results.append(CheckResult("prefill " + label, "int8", err, tol, err <= tol))
        last = (c["query_start_loc"][1:] - 1).long()
        dec = triton_be.paged_decode_attention(c["q"][last], *args[1:5], scale)
        err = float((dec.float() - ref[last]).abs().max())
        results.append(CheckResult("decode " + label, "int8", err, tol, err <= tol))
        del c, args, ref, out, dec
    row = kv_quant.row_width(128, torch.int8)  # codes + the E8M0 byte
    kc = torch.zeros(64, 16, 8, row, dtype=torch.int8, device=device)
    key = torch.randn(50, 8, 128, device=device) * 4
    slots = torch.randperm(64 * 16, device=device)[:50]
    slots[::7] = -1
    caches = []
    for be in (triton_be, torch_be):
        k, v = torch.zeros_like(kc), torch.zeros_like(kc)
        be.reshape_and_cache(key, -key, k, v, slots)
        caches.append(torch.cat([k, v]))
    same = bool(torch.equal(caches[0], caches[1]))
    results.append(CheckResult("reshape_and_cache", "int8", 0.0 if same else 1.0, 0.0, same))
    return results


def time_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=40))


def decode_inputs(device: torch.device, batch: int, context: int) -> dict[str, torch.Tensor]:
    """bf16 llama-3-8b-shaped decode inputs, drawn on the device; shuffled block tables."""
    hq, hkv, hd, bs = (HEADS[k] for k in ("num_q_heads", "num_kv_heads", "head_dim", "block_size"))
    nb = -(-context // bs)
    k_cache = torch.randn(batch * nb, bs, hkv, hd, device=device, dtype=torch.bfloat16)
    return {
        "q": torch.randn(batch, hq, hd, device=device, dtype=torch.bfloat16),
        "k_cache": k_cache,
        "v_cache": torch.randn_like(k_cache),
        "block_tables": torch.randperm(batch * nb, device=device).to(torch.int32).view(batch, nb),
        "seq_lens": torch.full((batch,), context, dtype=torch.int32, device=device),
    }


def decode_benchmark(device, batches, contexts, peak: float, budget_bytes: int) -> list[dict]:
    """Triton decode vs dense SDPA on the same K/V, bytes moved per call / time."""
    triton_be = get_attention_backend("triton", device)
    hq, hkv, hd = (HEADS[k] for k in ("num_q_heads", "num_kv_heads", "head_dim"))
    rows = []
    for ctx in contexts:
        for b in batches:
            nbytes = decode_bytes(b, ctx, hq, hkv, hd, 2)
            if 2 * nbytes > budget_bytes:  # paged pool + its dense copy
                continue
            c = decode_inputs(device, b, ctx)
            args = [c[k] for k in KEYS[:5]]
            tri = time_ms(
                lambda a=args, n=ctx: triton_be.paged_decode_attention(*a, hd**-0.5, max_seq_len=n)
            )
            # dense baseline: the same K/V gathered to [B, Hkv, L, D]; GQA as G query rows
            ids = c["block_tables"].long()
            kd = c["k_cache"][ids].view(b, -1, hkv, hd)[:, :ctx].transpose(1, 2).contiguous()
            vd = c["v_cache"][ids].view(b, -1, hkv, hd)[:, :ctx].transpose(1, 2).contiguous()
            qd = c["q"].view(b, hkv, hq // hkv, hd)
            dense = F.scaled_dot_product_attention(qd, kd, vd, scale=hd**-0.5).view(b, hq, hd)
            paged = triton_be.paged_decode_attention(*args, hd**-0.5, max_seq_len=ctx)
            err = float((paged.float() - dense.float()).abs().max())
            values_ok = err <= TOL[torch.bfloat16] * max(1.0, float(dense.abs().max()))
            sdpa = time_ms(
                lambda q=qd, k=kd, v=vd: F.scaled_dot_product_attention(q, k, v, scale=hd**-0.5)
            )
            del c, args, kd, vd, dense, paged
            torch.cuda.empty_cache()
            rows.append(
                {
                    "batch": b,
                    "context": ctx,
                    "bytes": nbytes,
                    "max_abs_err_vs_sdpa": err,
                    "values_ok": values_ok,
                    "triton_ms": tri,
                    "triton_gbps": nbytes / tri / 1e6,
                    "triton_frac_peak": nbytes / tri / 1e-3 / peak,
                    "sdpa_dense_ms": sdpa,
                    "sdpa_dense_gbps": nbytes / sdpa / 1e6,
                    "sdpa_dense_frac_peak": nbytes / sdpa / 1e-3 / peak,
                }
            )
    return rows


def block_n_sweep(device, peak: float) -> list[dict]:
    """The goal point with other decode tile sizes: what to tune if the goal is missed."""
    from cbbench.kernels import triton_attention

    b, ctx = GOAL["batch"], GOAL["context"]
    c = decode_inputs(device, b, ctx)
    args = [c[k] for k in KEYS[:5]]
    nbytes = decode_bytes(b, ctx, HEADS["num_q_heads"], HEADS["num_kv_heads"], HEADS["head_dim"], 2)
    rows = []
    for block_n in (32, 64, 128):
        for warps in (4, 8):
            ms = time_ms(
                lambda n=block_n, w=warps: triton_attention.paged_decode_attention(
                    *args, 0.088, max_seq_len=ctx, block_n=n, num_warps=w
                )
            )
            rows.append(
                {
                    "block_n": block_n,
                    "num_warps": warps,
                    "ms": ms,
                    "frac_peak": nbytes / ms / 1e-3 / peak,
                }
            )
    return rows


def prefill_benchmark(device) -> list[dict]:
    triton_be = get_attention_backend("triton", device)
    hq, hkv, hd, bs = (HEADS[k] for k in ("num_q_heads", "num_kv_heads", "head_dim", "block_size"))
    rows = []
    for num_seqs, new, cached in PREFILL_CASES:
        lens = [new + cached] * num_seqs
        c = make_paged_case(
            lens,
            [new] * num_seqs,
            bs,
            hkv,
            hq // hkv,
            head_dim=hd,
            dtype=torch.bfloat16,
            device=device,
        )
        args = [c[k] for k in KEYS]
        tri = time_ms(
            lambda a=args, n=new: triton_be.paged_attention(*a, hd**-0.5, max_query_len=n)
        )
        visible = num_seqs * (new * cached + new * (new + 1) // 2)  # (query, key) pairs
        flops = 4 * visible * hq * hd
        row = {
            "num_seqs": num_seqs,
            "new_tokens": new,
            "cached_tokens": cached,
            "triton_ms": tri,
            "triton_tflops": flops / tri / 1e9,
        }
        if cached == 0:  # dense causal baseline on the same tokens
            qd = c["q"].view(num_seqs, new, hq, hd).transpose(1, 2)
            kd = torch.randn(num_seqs, hq, new, hd, device=device, dtype=torch.bfloat16)
            vd = torch.randn_like(kd)
            sd = time_ms(
                lambda q=qd, k=kd, v=vd: F.scaled_dot_product_attention(q, k, v, is_causal=True)
            )
            row |= {"sdpa_dense_ms": sd, "sdpa_dense_tflops": flops / sd / 1e9}
        rows.append(row)
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.gpu.kernels_check", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--out", type=Path, required=True, help="folder for bench_gpu.json + summary.txt"
    )
    p.add_argument(
        "--dtypes", default="bfloat16,float16,float32,int8", help="correctness dtypes (int8: KV)"
    )
    p.add_argument("--batches", default="1,8,32,64,128,256")
    p.add_argument("--contexts", default="512,1024,4096,8192,16384,32768")
    p.add_argument("--quick", action="store_true", help="small correctness grid, goal point only")
    p.add_argument(
        "--engine-model",
        default="",
        help="deprecated here: the engine check is python -m tests.benchmarks.gpu.engine_check",
    )
    args = p.parse_args(argv)
    try:
        args.dtypes = [DTYPES[d] for d in args.dtypes.split(",")]
        args.batches = [int(b) for b in args.batches.split(",")]
        args.contexts = [int(c) for c in args.contexts.split(",")]
    except (KeyError, ValueError) as exc:
        p.error(f"bad list value {exc}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.engine_model:
        print(
            "bench_gpu: --engine-model moved: python -m tests.benchmarks.gpu.engine_check "
            "runs these kernel checks and the engine check",
            file=sys.stderr,
        )
    report = kernel_report(args)
    if isinstance(report, int):
        return report
    return finish(args.out, report)


def finish(out: Path, report: dict) -> int:
    """Write bench_gpu.json + summary.txt; 3 when any check failed."""
    print(write_results(out, report), end="")
    failed = not all(c["passed"] for c in report["correctness"])
    failed |= not all(r["values_ok"] for r in report["decode"])
    if report.get("engine") and not report["engine"]["passed"]:
        failed = True
    return 3 if failed else 0


def kernel_report(args: argparse.Namespace) -> dict | int:
    """The kernel checks' report, or an exit code when CUDA or Triton is missing."""
    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA device visible to torch; this check needs a GPU", file=sys.stderr)
        return 2
    try:
        import triton
    except ImportError:
        print("bench_gpu: triton is not installed (pip install 'cbbench[gpu]')", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    src = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copy_bw = 2 * src.numel() / time_ms(lambda s=src, d=dst: d.copy_(s)) / 1e-3  # read + write
    del src, dst
    peak = peak_bandwidth(name)
    report: dict = {
        "device": name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "measured_copy_gbps": copy_bw / 1e9,
        "peak_gbps": (peak or copy_bw) / 1e9,
        "peak_source": "name table" if peak else "measured device-to-device copy",
    }
    peak = peak or copy_bw
    t0 = time.perf_counter()
    report["correctness"] = [asdict(r) for r in correctness_grid(device, args.dtypes, args.quick)]
    free, _ = torch.cuda.mem_get_info(device)
    batches = [GOAL["batch"]] if args.quick else args.batches
    contexts = [GOAL["context"]] if args.quick else args.contexts
    report["decode_shape"] = dict(HEADS)
    report["decode"] = decode_benchmark(device, batches, contexts, peak, int(0.6 * free))
    goal_row = next(
        (
            r
            for r in report["decode"]
            if (r["batch"], r["context"]) == (GOAL["batch"], GOAL["context"])
        ),
        None,
    )
    report["goal"] = dict(GOAL)
    if goal_row:
        report["goal"] |= {
            "measured": round(goal_row["triton_frac_peak"], 3),
            "met": goal_row["triton_frac_peak"] >= GOAL["fraction"],
        }
    report["decode_tile_sweep"] = block_n_sweep(device, peak)
    report["prefill"] = prefill_benchmark(device)
    report["wall_s"] = time.perf_counter() - t0
    return report


if __name__ == "__main__":
    sys.exit(main())
