"""Replicas behind a router carry unequal load: one queues while another idles.

Reads the run's per-replica telemetry (`telemetry.replicas`, from a router's `replica=`
series or `--server-metrics-url` per replica). Fires when the time-averaged load (running +
waiting, else the router's in-flight count) of the busiest replica is IMBALANCED x the mean
over replicas while the mean is at least MIN_LOAD requests, or when the requests routed are
that uneven. Silent without per-replica telemetry (a rule never guesses)."""

from __future__ import annotations

from cbbench.harness.diagnose.base import Finding, Rule, RunView

IMBALANCED = 1.4  # max / mean over replicas
MIN_LOAD = 0.5  # mean requests per replica: below it, an idle cluster, not an imbalance
MIN_ROUTED = 20  # requests routed in all, for the routed figure

# Each router's lever (names as each project documents them at the time of writing).
FIXES = {
    "vllm": "vLLM production-stack router: --routing-logic with a load-aware choice instead "
    "of roundrobin/session stickiness; vLLM has no router of its own: a least-connections "
    "load balancer in front of the replicas; llm-d: the inference scheduler's "
    "queue/KV-cache-utilization scorers",
    "sglang": "sglang_router: --policy cache_aware with tighter --balance-abs-threshold / "
    "--balance-rel-threshold (load wins over cache affinity sooner), or --policy "
    "power_of_two",
    "tgi": "no router of its own: a least-connections load balancer in front of the replicas",
    "triton": "no router of its own: a least-connections load balancer; equal instance "
    "counts per model on each server",
    "cbbench": "cbbench route / serve --replicas: --router least-outstanding or kv-aware "
    "(round-robin is blind to load; prefix-affinity trades balance for cache hits); "
    "a replica that answers badly leaves rotation (--breaker-failures)",
}


def check(v: RunView) -> Finding | None:
    tel = (v.meta.get("summary") or {}).get("telemetry") or {}
    rep = tel.get("replicas") or {}
    per = rep.get("per_replica") or {}
    imb = rep.get("imbalance") or {}
    if not rep.get("available") or len(per) < 2:
        return None
    load, routed = imb.get("load"), imb.get("routed")
    total_routed = sum(d.get("routed") or 0 for d in per.values())
    hot_load = load is not None and load["mean"] >= MIN_LOAD and load["max_over_mean"] >= IMBALANCED
    hot_routed = (
        routed is not None and total_routed >= MIN_ROUTED and routed["max_over_mean"] >= IMBALANCED
    )
    if not (hot_load or hot_routed):
        return None
    means = {n: (d.get("load") or {}).get("mean") for n, d in per.items()}
    busiest = max((n for n in means if means[n] is not None), key=lambda n: means[n], default=None)
    evidence = []
    if load is not None:
        per_load = ", ".join(f"{n} {m:.2f}" for n, m in sorted(means.items()) if m is not None)
        evidence.append(
            f"time-averaged load per replica (requests): {per_load}; max / mean "
            f"{load['max_over_mean']:.2f}, CV {load['cv']:.2f}"
        )
    if routed is not None:
        counts = ", ".join(
            f"{n} {int(d['routed'])}" for n, d in sorted(per.items()) if "routed" in d
        )
        evidence.append(
            f"requests routed: {counts}; max / mean {routed['max_over_mean']:.2f}, "
            f"CV {routed['cv']:.2f}"
        )
    return Finding(
        rule=RULE.id,
        title=f"replicas are unevenly loaded (busiest: {busiest})",
        cause="the router's policy does not follow load (round-robin or cache affinity over a "
        "replica that is slower or busier), or one replica is slower than the others",
        evidence=evidence,
        fixes=dict(FIXES),
        values={
            "load_max_over_mean": load["max_over_mean"] if load else None,
            "load_cv": load["cv"] if load else None,
            "routed_max_over_mean": routed["max_over_mean"] if routed else None,
            "busiest": busiest,
        },
    )


RULE = Rule("replica-imbalance", "replicas behind a router carry unequal load", check)
