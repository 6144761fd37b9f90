"""Measure the ModelRunner's raw generation speed, without scheduler or server.

Keeps `--num-seqs` sequences in flight: each new sequence's prompt is prefilled in one step of
its own, then all running sequences decode together one token per step; a finished sequence
is replaced at once (continuous batching at its simplest). Prints output tokens/s.

    python -m tests.benchmarks.studies.runner_bench --model small --num-seqs 8 --requests 32

`--block-layout engine` hands blocks out as the block manager does (the torch backend then
reads each prompt's run of blocks in place and gathers the rest); `--no-split-kv` turns that
off for a side-by-side comparison. $CBBENCH_CPU_LINEAR picks the CPU projection kernel
(reference_engine/execution/cpu_linear.py) for an A/B run.
"""

from __future__ import annotations

import argparse
import random
import time
from collections import deque

import torch
from cbbench.reference_engine.core.executor import ScheduledChunk
from cbbench.reference_engine.core.outputs import RequestMetrics
from cbbench.reference_engine.core.sequence import Sequence
from cbbench.reference_engine.execution.model_runner import ModelRunner
from cbbench.reference_engine.sampling_params import SamplingParams


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="small", help="preset name or HF folder")
    p.add_argument("--num-seqs", type=int, default=8, help="sequences in flight")
    p.add_argument("--requests", type=int, default=32, help="sequences to run in all")
    p.add_argument("--prompt-len", default="64-256", help="uniform range MIN-MAX")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all CPUs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--block-layout",
        choices=("slot", "engine"),
        default="slot",
        help="slot: each sequence's blocks consecutive; engine: as the block manager hands "
        "them out (a prompt's blocks together, decode blocks one at a time, interleaved)",
    )
    p.add_argument(
        "--no-split-kv",
        action="store_true",
        help="torch backend: always gather KV blocks (never read runs of blocks in place)",
    )
    return p


def run(args: argparse.Namespace) -> dict[str, float]:
    lo, hi = (int(x) for x in args.prompt_len.split("-"))
    blocks_per_seq = -(-(hi + args.output_len) // args.block_size)
    runner = ModelRunner(
        args.model,
        num_kv_blocks=blocks_per_seq * args.num_seqs,
        block_size=args.block_size,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        num_threads=args.threads,
    )
    if args.no_split_kv and hasattr(runner.backend, "split_kv"):
        runner.backend.split_kv = False
    engine_layout = args.block_layout == "engine"
    free_blocks = deque(range(blocks_per_seq * args.num_seqs))  # engine layout: FIFO reuse
    bs = args.block_size
    rng = random.Random(args.seed)
    vocab = runner.model_config.vocab_size
    free_slots = list(range(args.num_seqs))
    running: dict[int, Sequence] = {}
    started = finished = out_tokens = steps = 0
    prefill_s = decode_s = 0.0
    params = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    while finished < args.requests:
        while free_slots and started < args.requests:
            slot = free_slots.pop()
            prompt = [rng.randrange(vocab) for _ in range(rng.randint(lo, hi))]
            seq = Sequence(str(started), prompt, params, RequestMetrics(arrival_time=0.0))
            if engine_layout:
                seq.block_table = [free_blocks.popleft() for _ in range(-(-len(prompt) // bs))]
            else:
                seq.block_table = list(range(slot * blocks_per_seq, (slot + 1) * blocks_per_seq))
            t = time.perf_counter()
            ((tok,),) = runner.execute([ScheduledChunk(seq, seq.num_tokens)])
            prefill_s += time.perf_counter() - t
            seq.num_computed_tokens = seq.num_tokens
            seq.token_ids.append(tok)
            running[slot] = seq
            started += 1
            out_tokens += 1
        for seq in running.values():
            if len(seq.block_table) * bs < seq.num_tokens:  # engine layout: one more block
                seq.block_table.append(free_blocks.popleft())
        t = time.perf_counter()
        toks = runner.execute([ScheduledChunk(s, 1) for s in running.values()])
        decode_s += time.perf_counter() - t
        steps += 1
        for (slot, seq), (tok,) in zip(list(running.items()), toks, strict=True):
            seq.num_computed_tokens += 1
            seq.token_ids.append(tok)
            out_tokens += 1
            if seq.num_output_tokens >= args.output_len:
                if engine_layout:
                    free_blocks.extend(seq.block_table)
                del running[slot]
                free_slots.append(slot)
                finished += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "output_tokens": out_tokens,
        "wall_s": wall,
        "tok_per_s": out_tokens / wall,
        "cpu_s": cpu,
        "decode_steps": steps,
        "decode_ms_per_step": 1000 * decode_s / steps,
        "prefill_s": prefill_s,
        "threads": torch.get_num_threads(),
        "linear": runner.linear_impl,
    }


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    r = run(args)
    print(
        f"{args.model} {args.dtype} {args.device} threads={r['threads']} in-flight={args.num_seqs} "
        f"layout={args.block_layout} split-kv={'off' if args.no_split_kv else 'on'} "
        f"linear={r['linear']}: "
        f"{r['output_tokens']} output tokens in {r['wall_s']:.2f} s = {r['tok_per_s']:.1f} tok/s "
        f"(decode {r['decode_ms_per_step']:.1f} ms/step over {r['decode_steps']} steps, "
        f"prefill {r['prefill_s']:.2f} s); process CPU time {r['cpu_s']:.2f} s "
        f"(with other load on the machine, wall >> CPU / threads: the numbers are not clean)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
