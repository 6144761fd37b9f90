"""`cbbench quality`: the accuracy cost of lower-precision weights or a quantized KV cache.

The same random prompts run teacher-forced through the reference configuration (fp32 weights,
KV cache in the model dtype) and through each variant named: `--kv-cache-dtype bf16,int8,fp8`
(fp32 weights), `--dtype bfloat16,float16` (KV in that dtype) and `--quantization int8` (int8
weight-only linears, fp32 activations); one row per variant with
greedy agreement, |logprob diff| mean/max, KL mean/max and the reference's top-1 probability.
The library is reference_engine/execution/kv_quality.py (`quality`); docs/quantization.md.

`--logit-scale` (default 32) multiplies the logits: random weights give near-flat next-token
distributions (tiny: top-1 0.3 % at scale 1) on which every variant agrees; at 32 the top
token takes about half the mass, as in a trained model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cbbench.harness.errors import CbbenchError
from cbbench.reference_engine.config.engine_config import QUANTIZATIONS

WEIGHT_DTYPES = ("float32", "float16", "bfloat16")
KV_DTYPES = ("bf16", "fp8", "int8")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "quality", help="accuracy of bf16/fp16 weights and quantized KV caches vs fp32"
    )
    p.add_argument("--model", default="tiny", help="preset name or HF checkpoint folder (tiny)")
    p.add_argument("--kv-cache-dtype", default=None,
                   help=f"comma list of KV variants ({', '.join(KV_DTYPES)}); default bf16,int8,fp8"
                   " when --dtype is not given")  # fmt: skip
    p.add_argument("--dtype", default=None,
                   help=f"comma list of weight-dtype variants ({', '.join(WEIGHT_DTYPES[1:])})")
    p.add_argument("--quantization", default=None, choices=QUANTIZATIONS,
                   help="also a row with weight-only quantized linears (int8), fp32 activations")
    p.add_argument("--num-seqs", type=int, default=4, help="sequences (4)")
    p.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per sequence (32)")
    p.add_argument("--gen-len", type=int, default=32, help="teacher-forced decode steps (32)")
    p.add_argument("--logit-scale", type=float, default=32.0,
                   help="multiply the logits so random weights give peaked distributions (32)")
    p.add_argument("--seed", type=int, default=0, help="weights and prompts seed (0)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--out", default=None, help="also write the rows as JSON to FILE")
    p.set_defaults(func=run)


def _split(value: str | None, flag: str, allowed: tuple[str, ...]) -> list[str]:
    names = [v.strip() for v in (value or "").split(",") if v.strip()]
    for n in names:
        if n not in allowed:
            raise CbbenchError(f"{flag}: unknown dtype {n!r} (one of {', '.join(allowed)})")
    return names


def variants_from_args(args: argparse.Namespace) -> list:
    """The typed options: one Variant per name given (errors name the flag)."""
    import torch
    from cbbench.reference_engine.execution.kv_quality import Variant

    kv = _split(args.kv_cache_dtype, "--kv-cache-dtype", KV_DTYPES)
    wd = _split(args.dtype, "--dtype", WEIGHT_DTYPES)
    if not kv and not wd and not args.quantization:
        kv = list(KV_DTYPES)
    if "fp8" in kv and not hasattr(torch, "float8_e4m3fn"):
        raise CbbenchError(f"--kv-cache-dtype fp8: torch {torch.__version__} has no float8_e4m3fn")
    for name, flag, low in (("--num-seqs", args.num_seqs, 1), ("--prompt-len", args.prompt_len, 1),
                            ("--gen-len", args.gen_len, 0)):  # fmt: skip
        if flag < low:
            raise CbbenchError(f"{name}: must be >= {low}, got {flag}")
    if args.logit_scale <= 0:
        raise CbbenchError(f"--logit-scale: must be > 0, got {args.logit_scale}")
    quant = [Variant("float32", "auto", args.quantization)] if args.quantization else []
    return [Variant("float32", k) for k in kv] + [Variant(d, "auto") for d in wd] + quant


def run(args: argparse.Namespace) -> int:
    from cbbench.reference_engine.execution.kv_quality import quality

    variants = variants_from_args(args)
    rows = quality(args.model, variants, num_seqs=args.num_seqs, prompt_len=args.prompt_len,
                   gen_len=args.gen_len, logit_scale=args.logit_scale, seed=args.seed)  # fmt: skip
    data = [r.to_dict() for r in rows]
    if args.out:
        out = Path(args.out)
        if not out.parent.exists():
            raise CbbenchError(f"--out {out}: folder {out.parent} does not exist")
        out.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    _print_table(args, data)
    return 0


def _print_table(args: argparse.Namespace, data: list[dict]) -> None:
    from cbbench.harness.results.compare import emit_table
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"quality vs fp32 weights + fp32 KV: {args.model}, {data[0]['positions']}"
                  f" positions, logit scale {args.logit_scale:g}")  # fmt: skip
    for col in ("weights", "kv cache", "greedy agree", "|dlogprob| mean", "|dlogprob| max",
                "KL mean", "KL max", "ref top-1 p"):  # fmt: skip
        table.add_column(col, justify="left" if col in ("weights", "kv cache") else "right")
    for r in data:
        weights = f"{r['quantization']} (weight-only)" if r.get("quantization") else r["dtype"]
        table.add_row(weights, r["kv_cache_dtype"], f"{r['greedy_agreement']:.4f}",
                      f"{r['logprob_diff_mean']:.3e}", f"{r['logprob_diff_max']:.3e}",
                      f"{r['kl_mean']:.3e}", f"{r['kl_max']:.3e}", f"{r['top1_prob_mean']:.3f}")  # fmt: skip
    emit_table(Console(soft_wrap=True), table)
