"""Mixture-of-experts measurements behind docs/moe.md, each printed side by side:

    python -m tests.benchmarks.studies.moe_study served --model small-moe
    python -m tests.benchmarks.studies.moe_study balance-cpu --model small-moe
    python -m tests.benchmarks.studies.moe_study balance-sim
    python -m tests.benchmarks.studies.moe_study step-table

served: one `cbbench serve` per workload (balanced prompts over the whole id range, or
prompts whose ids come from 1 or 4 narrow "topics" of the vocabulary), N completions from
`--concurrency` threads through the openai client, then the expert series of /metrics: the
cumulative max/mean load per layer. balance-cpu: the engine in process on the CPU, topic-
bursty arrivals (runs of one topic), --expert-balance off and on: mean wall step time of full
decode steps, their mean expert imbalance, total time. balance-sim: the same in the
simulator (mixtral-8x7b, h200, routing topics). step-table: the cost model's decode step
time of mixtral-8x7b at batch 1/64/256 by routing skew, h100/h200, expert parallel 1/2/8.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
from cbbench.harness.servers.launcher import launch_reference_server
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.cost_model import CostModel, get_hardware
from cbbench.reference_engine.execution.moe_cost import ExpertRouting, MoeSimSettings
from cbbench.reference_engine.model.config import preset_config
from cbbench.reference_engine.sampling_params import SamplingParams
from cbbench.reference_engine.scheduler.expert_balance import imbalance
from prometheus_client.parser import text_string_to_metric_families

ID_RANGE = (10, 500)  # valid for every preset's vocabulary


def topic_prompts(n: int, length: int, topics: int, seed: int = 0, width: int = 16):
    """n prompts of `length` ids: topics 0 = uniform over ID_RANGE; else request i uses the
    `width` ids of topic i % topics (disjoint slices of ID_RANGE)."""
    rng = np.random.default_rng(seed)
    lo, hi = ID_RANGE
    out = []
    for i in range(n):
        if topics:
            start = lo + (i % topics) * width
            out.append(rng.integers(start, start + width, length).tolist())
        else:
            out.append(rng.integers(lo, hi, length).tolist())
    return out


def _expert_scrape(url: str) -> tuple[dict[int, float], np.ndarray]:
    """(cumulative imbalance per layer, tokens routed [layer, expert])."""
    text = httpx.get(url + "/metrics", timeout=10).text
    gauges: dict[int, float] = {}
    tokens: dict[tuple[int, int], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "cbbench:expert_load_imbalance_cumulative":
                gauges[int(s.labels["layer"])] = s.value
            elif s.name == "cbbench:expert_tokens_total":
                tokens[int(s.labels["layer"]), int(s.labels["expert"])] = s.value
    layers = 1 + max(k[0] for k in tokens)
    experts = 1 + max(k[1] for k in tokens)
    grid = np.zeros((layers, experts))
    for (layer, e), v in tokens.items():
        grid[layer, e] = v
    return gauges, grid


def served(args) -> None:
    import threading

    import openai

    print(f"| prompts ({args.model}) | requests | imbalance per layer (max/mean, cumulative) |")
    print("| --- | ---: | --- |")
    panels = []
    for topics in (0, 4, 1):
        prompts = topic_prompts(args.requests, args.prompt_len, topics, args.seed)
        with launch_reference_server(model=args.model) as server:
            client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)

            def one(p: list[int], client=client) -> None:
                client.completions.create(
                    model=args.model, prompt=p, max_tokens=args.max_tokens, temperature=0.0
                )

            samples: list[np.ndarray] = []
            done = threading.Event()

            def sample(url=server.base_url, samples=samples, done=done) -> None:
                while not done.wait(args.interval):  # bounded by the load below
                    samples.append(_expert_scrape(url)[1])

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            with ThreadPoolExecutor(args.concurrency) as pool:
                list(pool.map(one, prompts))
            time.sleep(0.3)  # the last step's stats reach the API process
            done.set()
            sampler.join()
            gauges, total = _expert_scrape(server.base_url)
        name = "balanced (uniform ids)" if topics == 0 else f"{topics} topic(s) of 16 ids"
        row = ", ".join(f"{gauges[k]:.2f}" for k in sorted(gauges))
        print(f"| {name} | {len(prompts)} | {row} |")
        series = [np.zeros_like(total), *samples, total]
        panels.append((name, np.diff(np.array(series), axis=0)))
    if args.heatmap:
        write_heatmap(args.heatmap, panels, args.model, args.interval)
        print(f"heatmap: {args.heatmap}")


def write_heatmap(path: str, panels, model: str, interval: float) -> None:
    """An SVG: per workload, one row per (layer, expert) and one column per scrape interval,
    shaded by the expert's share of its layer's tokens in that interval relative to an even
    share (white: none, light: even, darkest: 3x even or more)."""
    cell, gap, left, top = 8, 30, 60, 36
    width = left + max(len(d) for _, d in panels) * cell + 20
    parts, y = [], top
    for name, deltas in panels:  # deltas [interval, layer, expert]
        _, layers, experts = deltas.shape
        parts.append(f'<text x="4" y="{y - 8}">{name}</text>')
        for t, grid in enumerate(deltas):
            for layer in range(layers):
                total = grid[layer].sum()
                for e in range(experts):
                    rel = grid[layer, e] * experts / total if total else 0.0
                    shade = int(255 - min(1.0, rel / 3) * 235)
                    row = layer * (experts + 1) + e
                    parts.append(
                        f'<rect x="{left + t * cell}" y="{y + row * cell}" width="{cell}" '
                        f'height="{cell}" fill="rgb({shade},{shade},255)"/>'
                    )
        for layer in range(layers):
            ty = y + (layer * (experts + 1) + experts / 2) * cell
            parts.append(f'<text x="4" y="{ty}">layer {layer}</text>')
        y += layers * (experts + 1) * cell + gap
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y}" '
        f'font-family="sans-serif" font-size="11"><title>expert load over time</title>'
        f'<text x="4" y="14">{model}: experts (rows) per layer over time (columns of '
        f"{interval} s); darker = more than an even share</text>"
    )
    with open(path, "w", encoding="utf-8") as f:
        f.write(head + "".join(parts) + "</svg>\n")


def _engine_run(cfg: EngineConfig, prompts: list[list[int]], order, max_tokens: int):
    engine = LLMEngine.from_config(cfg)
    for i in order:
        engine.add_request(f"req-{i}", prompts[i], SamplingParams(max_tokens=max_tokens))
    return engine


def _decode_steps(engine, seqs: int, load_of, wall: bool):
    """Run to the end; (mean step time of full decode steps, their mean imbalance, total)."""
    times, imbs = [], []
    start = time.perf_counter() if wall else engine.now()
    prev = load_of(engine)
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        engine.step()
        dt = time.perf_counter() - t0
        st = engine.get_stats()
        now = load_of(engine)
        if st.num_batched_tokens == engine.scheduler.num_running == seqs:
            times.append(dt if wall else st.step_time_s)
            imbs.append(float(np.mean([imbalance(list(r)) for r in now - prev])))
        prev = now
    total = (time.perf_counter() if wall else engine.now()) - start
    reordered = engine.scheduler.balancer.num_reordered if engine.scheduler.balancer else 0
    return np.mean(times) * 1e3, np.mean(imbs), total, len(times), reordered


def _print_balance(rows) -> None:
    print("| expert balance | full decode steps | step (ms, mean) | imbalance (mean) | "
          "total (s) | reordered |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, (step, imb, total, n, reordered) in rows:
        print(f"| {name} | {n} | {step:.2f} | {imb:.2f} | {total:.3f} | {reordered} |")


def balance_cpu(args) -> None:
    prompts = topic_prompts(args.requests, args.prompt_len, args.topics, args.seed)
    # bursty: runs of one topic (request i has topic i % topics)
    order = sorted(range(len(prompts)), key=lambda i: (i % args.topics, i))

    def load_of(engine):
        return np.array([r for r in engine.executor.expert_load() if r], dtype=np.float64)

    rows = []
    for rep in range(args.repeats):
        for on in (False, True):
            cfg = EngineConfig(model=args.model, num_kv_blocks=2048, seed=args.seed)
            cfg.continuous.max_num_seqs = args.batch
            cfg.continuous.expert_balance = on
            cfg.continuous.expert_balance_window = args.window
            engine = _engine_run(cfg, prompts, order, args.max_tokens)
            rows.append((f"{'on' if on else 'off'} (run {rep + 1})",
                         _decode_steps(engine, args.batch, load_of, wall=True)))  # fmt: skip
    print(f"CPU, {args.model}, B = {args.batch}, {args.requests} requests in runs of "
          f"{args.topics} topics, window {args.window}, wall clock:")  # fmt: skip
    _print_balance(rows)


def balance_sim(args) -> None:
    for batch, ep in ((8, 8), (256, 8), (256, 1)):
        rows = []
        for on in (False, True):
            cfg = EngineConfig(
                model="mixtral-8x7b", dtype="bfloat16", executor="sim", hardware="h200",
                sim_expert_skew=args.skew, sim_expert_topics=args.topics, expert_parallel=ep,
                seed=args.seed, max_model_len=4096,
            )  # fmt: skip
            cfg.continuous.max_num_seqs = batch
            cfg.continuous.max_num_batched_tokens = 8192
            cfg.continuous.expert_balance = on
            cfg.continuous.expert_balance_window = args.window
            n = max(args.requests, 12 * batch)
            probe = ExpertRouting(preset_config("mixtral-8x7b"), MoeSimSettings(
                args.skew, args.topics, ep, args.seed))  # fmt: skip
            order = sorted(range(n), key=lambda i: probe.topic(f"req-{i}"))  # topic runs
            prompts = [list(range(1, 65))] * n
            engine = _engine_run(cfg, prompts, order, args.max_tokens)
            routing = engine.executor.routing
            acc = np.zeros(routing.num_experts)

            def load_of(engine, acc=acc, routing=routing):
                acc += sum(routing.last_histograms.values())
                return acc[None, :].copy()

            rows.append(("on" if on else "off", _decode_steps(engine, batch, load_of, False)))
        print(f"sim, mixtral-8x7b on h200, B = {batch}, expert parallel {ep}, skew "
              f"{args.skew}, {args.topics} topics in runs, window {args.window}:")  # fmt: skip
        _print_balance(rows)


def step_table(args) -> None:
    mc = preset_config("mixtral-8x7b")
    print("| hardware | EP | skew | B = 1 (ms) | B = 64 (ms) | B = 256 (ms) | busiest expert "
          "share at 256 |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for hw in ("h100", "h200"):
        for ep in (1, 2, 8):
            for skew in (0.0, 1.0, 2.0, 3.0):
                s = MoeSimSettings(skew, 1, ep, args.seed)
                cm = CostModel(mc, get_hardware(hw), "bfloat16", 16, s)
                try:
                    cm.kv_pool_blocks(16)
                except EngineError:
                    print(f"| {hw} | {ep} | {skew} | does not fit | | | |")
                    break
                routing = ExpertRouting(mc, s)
                cells, share = [], 0.0
                for b in (1, 64, 256):
                    ts, shares = [], []
                    for _ in range(args.draws):
                        load = routing.step_load([(f"r{i}", 1) for i in range(b)])
                        ts.append(cm.time_of(cm.work([(args.context, 1, True)] * b, load)))
                        shares.append(load[0].max() / load[0].sum())
                    cells.append(f"{np.mean(ts) * 1e3:.2f}")
                    share = float(np.mean(shares))
                print(f"| {hw} | {ep} | {skew} | {' | '.join(cells)} | {share:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("served", "balance-cpu", "balance-sim", "step-table"))
    p.add_argument("--model", default="small-moe")
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--topics", type=int, default=4)
    p.add_argument("--window", type=int, default=32)
    p.add_argument("--skew", type=float, default=3.0)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--draws", type=int, default=20)
    p.add_argument("--context", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--interval", type=float, default=0.25, help="served: scrape period (s)")
    p.add_argument("--heatmap", help="served: write an SVG heatmap of expert load over time")
    args = p.parse_args()
    {"served": served, "balance-cpu": balance_cpu, "balance-sim": balance_sim,
     "step-table": step_table}[args.what](args)  # fmt: skip


if __name__ == "__main__":
    main()
