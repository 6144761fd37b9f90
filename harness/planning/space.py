"""`cbbench plan`'s inputs: the SLOs (`--slo`) and the declared space of configurations
(`--space`), parsed into typed values; bad input is one CbbenchError naming what to fix."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from cbbench.harness.errors import CbbenchError
from cbbench.harness.results.slo import SLO_GRAMMAR, parse_duration, slo_key
from cbbench.reference_engine.router.registry import POLICY_NAMES

METRICS = ("ttft", "ttfo", "tpot", "e2e")  # ttfo = ttft in the simulator (no reasoning)
STATS = ("mean", "p50", "p90", "p95", "p99", "max")


@dataclass(frozen=True)
class Slo:
    metric: str  # ttft | ttfo | tpot | e2e
    stat: str  # p99, p50, mean, ...
    target_s: float

    @property
    def name(self) -> str:
        return f"{self.metric}_{self.stat}"


def parse_slos(text: str) -> list[Slo]:
    """'ttft_p99=2s,tpot_p99=100ms' -> [Slo('ttft', 'p99', 2.0), Slo('tpot', 'p99', 0.1)];
    bench's grammar (results/summary.py): a bare metric (`ttft=2s`) is a per-request target,
    every request within it, i.e. the maximum."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, value = part.partition("=")
        if not sep:
            raise CbbenchError(f"--slo: {part!r}: expected {SLO_GRAMMAR}")
        metric, stat = slo_key(key, part)
        slo = Slo(metric, stat or "max", parse_duration(value, f"--slo {key.strip()}"))
        if any(o.name == slo.name for o in out):  # as bench's: which one was meant?
            raise CbbenchError(f"--slo: {slo.name} is given twice in {text!r}: give it once")
        out.append(slo)
    if not out:
        raise CbbenchError("--slo: give at least one, e.g. ttft_p99=2s,tpot_p99=100ms")
    return out


@dataclass
class PlanSpace:
    """The declared space; replicas by bisection over [min_replicas, max_replicas]."""

    min_replicas: int = 1
    max_replicas: int = 32
    schedulers: list[str] = field(default_factory=lambda: ["continuous"])
    max_num_seqs: list[int] = field(default_factory=lambda: [16, 32, 64, 128, 256])
    max_num_batched_tokens: list[int] = field(default_factory=lambda: [2048, 8192])
    chunked_prefill: list[bool] = field(default_factory=lambda: [True])
    kv_cache_dtype: list[str] = field(default_factory=lambda: ["auto"])
    routers: list[str] = field(default_factory=lambda: ["least-outstanding"])
    # "off", "ngram:K" (prompt lookup, K drafts a step), "draft:MODEL:K" (a draft model)
    speculative: list[str] = field(default_factory=lambda: ["off"])
    # prefill/decode disaggregation (router/pd_sim.py): "aggregated", "disaggregated"; a
    # disaggregated point is P prefill workers (each value searched) and D decode workers
    # (bisection over decode_min..decode_max, like replicas); None: up to max_replicas
    modes: list[str] = field(default_factory=lambda: ["aggregated"])
    prefill: list[int] | None = None
    decode_min: int = 1
    decode_max: int | None = None
    # None: the hardware fit's measured hand-off (fit.kv_link) if any, else same-node
    kv_link: list[str] | None = None

    def prefill_counts(self) -> list[int]:
        return self.prefill or list(range(1, self.max_replicas))

    def decode_range(self) -> tuple[int, int]:
        return self.decode_min, self.decode_max or self.max_replicas
    # GPUs per replica: integers, or "auto" (the fewest of 1, 2, 4, 8 the model fits)
    tensor_parallel: list[int | str] = field(default_factory=lambda: ["auto"])

    def configs(self) -> list[dict[str, Any]]:
        dims = itertools.product(self.schedulers, self.max_num_seqs,
                                 self.max_num_batched_tokens, self.chunked_prefill,
                                 self.kv_cache_dtype, self.routers, self.speculative,
                                 self.tensor_parallel)  # fmt: skip
        out = []
        for sched, mns, mnbt, chunked, kv, router, spec, tp in dims:
            if sched != "continuous" and (mnbt, chunked, spec) != (
                self.max_num_batched_tokens[0],
                self.chunked_prefill[0],
                self.speculative[0],
            ):
                continue  # token budget, chunking, speculation: continuous batching's only
            out.append({"scheduler": sched, "max_num_seqs": mns, "max_num_batched_tokens": mnbt,
                        "chunked_prefill": chunked, "kv_cache_dtype": kv, "router": router,
                        "speculative": spec if sched == "continuous" else "off",
                        "tp": tp})  # fmt: skip
        if "aggregated" not in self.modes:
            out_agg: list[dict[str, Any]] = []
        else:
            out_agg = out
        if "disaggregated" not in self.modes:
            return out_agg
        pd = [{**c, "mode": "disaggregated", "prefill": p, "kv_link": link}
              for c in out if c["scheduler"] == "continuous" and c["router"] == self.routers[0]
              for link in (self.kv_link or [None]) for p in self.prefill_counts()]  # fmt: skip
        return out_agg + pd


def parse_speculative(value: str) -> tuple[str, str | None, int] | None:
    """'off' -> None; 'ngram:4' -> ('ngram', None, 4); 'draft:MODEL:4' -> ('draft', MODEL, 4).
    ValueError when it is none of these."""
    if value == "off":
        return None
    parts = value.split(":")
    if parts[0] == "ngram" and len(parts) == 2 and int(parts[1]) >= 1:
        return "ngram", None, int(parts[1])
    if parts[0] == "draft" and len(parts) == 3 and parts[1] and int(parts[2]) >= 1:
        return "draft", parts[1], int(parts[2])
    raise ValueError(value)


SPACE_KEYS = {
    "replicas": "min-max, e.g. 1-32",
    "scheduler": "continuous,static,dynamic",
    "max_num_seqs": "integers",
    "max_num_batched_tokens": "integers",
    "chunked_prefill": "on,off",
    "kv_cache_dtype": "auto,bf16,fp8,int8",
    "router": ",".join(POLICY_NAMES),
    "speculative": "off,ngram:K,draft:MODEL:K",
    "mode": "aggregated,disaggregated",
    "prefill": "prefill workers: 1..4, 1.., or 1,2",
    "decode": "decode workers, by bisection: 1..16, 1..",
    "kv_link": "same-node,cross-node,loopback,fit (the --hardware JSON's measured fit.kv_link) "
    "or bandwidth_gbps=B,latency_ms=L",
    "tp": "auto or GPUs per replica, e.g. 1,2,4,8",
}


def _counts(value: str) -> tuple[int, int | None]:
    """'1..4' / '1-4' -> (1, 4); '1..' -> (1, None); '3' -> (3, 3)."""
    v = value.strip().replace("..", "-")
    lo, sep, hi = v.partition("-")
    a = int(lo)
    b = (int(hi) if hi else None) if sep else a
    if a < 1 or (b is not None and b < a):
        raise ValueError(value)
    return a, b


def _kv_links(vals: list[str]) -> list[str]:
    """'same-node,bandwidth_gbps=50,latency_ms=0.1,fit' -> the presets and each custom link
    (its KEY=V parts joined back; a repeated key starts the next one), each checked."""
    from cbbench.reference_engine.errors import EngineError
    from cbbench.reference_engine.execution.kv_link import get_link

    links: list[str] = []
    custom: dict[str, str] = {}
    for v in vals + [""]:
        k, sep, _ = v.partition("=")
        if custom and (not sep or k in custom):
            links.append(",".join(f"{a}={b}" for a, b in custom.items()))
            custom = {}
        if sep:
            custom[k.strip()] = v.partition("=")[2].strip()
        elif v:
            links.append(v)
    for link in links:
        if link == "fit":
            continue
        try:
            get_link(link)
        except EngineError:
            raise ValueError from None
    return links


def parse_space(text: str | None, base: PlanSpace | None = None) -> PlanSpace:
    """'max_num_seqs=16,32;replicas=1-8;router=round-robin' over the default space."""
    sp = replace(base or PlanSpace())
    for part in (p.strip() for p in (text or "").split(";") if p.strip()):
        key, sep, value = part.partition("=")
        key = key.strip().replace("-", "_")
        vals = [v.strip() for v in value.split(",") if v.strip()]
        if not sep or key not in SPACE_KEYS:
            raise CbbenchError(f"--space: {part!r}: expected KEY=VALUES, KEY one of "
                               f"{', '.join(SPACE_KEYS)}")  # fmt: skip
        try:
            if key == "replicas":
                lo, _, hi = value.partition("-")
                sp.min_replicas, sp.max_replicas = int(lo), int(hi or lo)
            elif key == "tp":
                sp.tensor_parallel = ["auto" if v == "auto" else int(v) for v in vals]
                if any(v != "auto" and v < 1 for v in sp.tensor_parallel):
                    raise ValueError
            elif key in ("max_num_seqs", "max_num_batched_tokens"):
                setattr(sp, key, [int(v) for v in vals])
            elif key == "speculative":
                for v in vals:
                    parse_speculative(v)
                sp.speculative = vals
            elif key == "mode":
                if any(v not in ("aggregated", "disaggregated") for v in vals):
                    raise ValueError
                sp.modes = vals
            elif key == "prefill":
                if len(vals) > 1:
                    sp.prefill = sorted({int(v) for v in vals})
                    if sp.prefill[0] < 1:
                        raise ValueError
                else:
                    lo, hi = _counts(value)
                    sp.prefill = list(range(lo, hi + 1)) if hi is not None else None
                    if hi is None and lo > 1:
                        sp.prefill = list(range(lo, sp.max_replicas))
            elif key == "decode":
                sp.decode_min, sp.decode_max = _counts(value)
            elif key == "kv_link":
                sp.kv_link = _kv_links(vals)
            elif key == "chunked_prefill":
                if any(v not in ("on", "off") for v in vals):
                    raise ValueError
                sp.chunked_prefill = [v == "on" for v in vals]
            else:
                allowed = SPACE_KEYS[key].split(",")
                if any(v not in allowed for v in vals):
                    raise ValueError
                setattr(sp, {"scheduler": "schedulers", "router": "routers"}.get(key, key), vals)
        except ValueError:
            raise CbbenchError(f"--space {key}: {value!r}: expected {SPACE_KEYS[key]}") from None
    empty = [k for k, v in (("scheduler", sp.schedulers), ("max_num_seqs", sp.max_num_seqs),
             ("max_num_batched_tokens", sp.max_num_batched_tokens),
             ("chunked_prefill", sp.chunked_prefill), ("kv_cache_dtype", sp.kv_cache_dtype),
             ("router", sp.routers), ("speculative", sp.speculative),
             ("tp", sp.tensor_parallel)) if not v]  # fmt: skip
    if sp.min_replicas < 1 or sp.max_replicas < sp.min_replicas:
        empty.append(f"replicas ({sp.min_replicas}-{sp.max_replicas})")
    if any(v < 1 for v in sp.max_num_seqs + sp.max_num_batched_tokens):
        raise CbbenchError("--space: max_num_seqs and max_num_batched_tokens must be >= 1")
    if empty:
        raise CbbenchError(f"the search space is empty: no value for {', '.join(empty)}; "
                           f"widen --space (e.g. replicas=1-32)")  # fmt: skip
    return sp
