"""An MoE server's experts carry unequal load: the busiest expert of a layer bounds its step.

Reads the run's per-expert telemetry (`telemetry.experts`: tokens routed to each expert of
each layer over the run, from `cbbench:expert_tokens_total`; cbbench's reference engine
exports it, vLLM and SGLang do not on `/metrics`). Fires when some layer's busiest expert
got IMBALANCED x the mean tokens per expert, over at least MIN_TOKENS_PER_EXPERT tokens per
expert. Silent without per-expert telemetry (a rule never guesses)."""

from __future__ import annotations

from cbbench.harness.diagnose.base import Finding, Rule, RunView

IMBALANCED = 1.5  # max / mean tokens per expert in a layer
MIN_TOKENS_PER_EXPERT = 20  # fewer: too few tokens to call it a skew

# Each engine's lever (names as each project documents them at the time of writing).
FIXES = {
    "vllm": "expert parallelism with load balancing: --enable-expert-parallel --enable-eplb "
    "(redundant copies of hot experts: --eplb-config num_redundant_experts; older versions "
    "--num-redundant-experts)",
    "sglang": "--enable-eplb with --ep-num-redundant-experts (expert parallel, --ep-size); "
    "record the distribution with --expert-distribution-recorder-mode",
    "tgi": "no expert load balancing of its own: more tensor parallelism spreads each expert "
    "over more GPUs",
    "triton": "TensorRT-LLM backend: expert parallelism (moe_expert_parallel_size) with its "
    "expert load balancer where the version has one",
    "cbbench": "cbbench serve --expert-balance (admits waiting requests whose predicted routing "
    "evens the running batch; --expert-balance-window); in the simulator, --expert-parallel N "
    "shows what the skew costs per device",
}


def check(v: RunView) -> Finding | None:
    exp = ((v.meta.get("summary") or {}).get("telemetry") or {}).get("experts") or {}
    layers = exp.get("layers") or {}
    if not exp.get("available") or not layers:
        return None
    hot = {
        layer: d
        for layer, d in layers.items()
        if d.get("max_over_mean", 0.0) >= IMBALANCED
        and sum(d.get("tokens") or []) >= MIN_TOKENS_PER_EXPERT * len(d.get("tokens") or [1])
    }
    if not hot:
        return None
    worst_layer = max(hot, key=lambda k: hot[k]["max_over_mean"])
    w = hot[worst_layer]
    busiest = max(range(len(w["tokens"])), key=lambda e: w["tokens"][e])
    evidence = [
        f"layer {worst_layer}: expert {busiest} got {w['tokens'][busiest]:,.0f} of "
        f"{sum(w['tokens']):,.0f} tokens routed, {w['max_over_mean']:.2f}x an even share "
        f"(CV {w['cv']:.2f})",
        "max / mean tokens per expert by layer: "
        + ", ".join(
            f"{k} {d['max_over_mean']:.2f}" for k, d in layers.items() if "max_over_mean" in d
        ),
    ]
    return Finding(
        rule=RULE.id,
        title=f"experts are unevenly loaded ({len(hot)} of {len(layers)} layers)",
        cause="the prompts route most tokens to a few experts (a narrow topic, a router "
        "trained without enough load-balancing loss): the busiest expert bounds each MoE "
        "layer's step, and under expert parallelism its device waits for it",
        evidence=evidence,
        fixes=dict(FIXES),
        values={
            "worst_layer": worst_layer,
            "max_over_mean": w["max_over_mean"],
            "hot_layers": sorted(hot),
        },
    )


RULE = Rule("expert-imbalance", "an MoE server's experts carry unequal load", check)
