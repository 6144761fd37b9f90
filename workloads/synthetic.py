"""Synthetic workloads from a spec table: request classes with length distributions.

Each field (class choice, prompt, output, priority, prefix group) draws from its own stream,
numpy PCG64 seeded with [seed, stream id, class], and every stream draws its n values in order:
the same spec and seed give the same requests, and N requests are the first N of any larger N.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from cbbench.workloads.distributions import Dist, parse_dist
from cbbench.workloads.errors import WorkloadError
from cbbench.workloads.spec import RequestSpec, Workload

PROMPT_STREAM, OUTPUT_STREAM, PRIORITY_STREAM, CLASS_STREAM, PREFIX_STREAM = 1, 2, 3, 4, 5
TURNS_STREAM, THINK_STREAM, MESSAGE_STREAM = 7, 8, 9  # 6 is the arrival process's
SESSION_KEYS = ("turns", "think_ms", "message")
CLASS_KEYS = ("weight", "prompt", "output", "priority")
PREFIX_KEYS = ("shared_blocks", "groups", "block_size")
DEFAULT_NUM_REQUESTS = 200


@dataclass(frozen=True)
class RequestClass:
    weight: float
    prompt: Dist
    output: Dist
    priority: Dist | None


def _rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, *stream])


def parse_classes(spec: dict, where: str) -> list[RequestClass]:
    """Top-level prompt/output/priority, or a `mixture` list whose items may override them."""
    items = spec.get("mixture")
    if items is None:
        items = [{}]
    elif not isinstance(items, list) or not items:
        raise WorkloadError(f"{where}: 'mixture' must be a non-empty list of tables")
    classes = []
    for i, item in enumerate(items):
        cwhere = f"{where}: mixture[{i}]" if "mixture" in spec else where
        if not isinstance(item, dict):
            raise WorkloadError(f"{cwhere}: must be a table, got {item!r}")
        for key in item:
            if key not in CLASS_KEYS:
                raise WorkloadError(
                    f"{cwhere}: unknown key '{key}' (keys: {', '.join(CLASS_KEYS)})"
                )
        merged = {k: spec[k] for k in ("prompt", "output", "priority") if k in spec} | item
        for key in ("prompt", "output"):
            if key not in merged:
                raise WorkloadError(f"{cwhere}: missing '{key}' distribution")
        weight = merged.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight > 0:
            raise WorkloadError(f"{cwhere}: 'weight' must be a number > 0, got {weight!r}")
        classes.append(
            RequestClass(
                weight=float(weight),
                prompt=parse_dist(merged["prompt"], f"{cwhere}: prompt"),
                output=parse_dist(merged["output"], f"{cwhere}: output"),
                priority=(
                    parse_dist(merged["priority"], f"{cwhere}: priority", default_min=None)
                    if "priority" in merged
                    else None
                ),
            )
        )
    return classes


def _pick(values: list[np.ndarray], cls: np.ndarray) -> np.ndarray:
    return np.stack(values)[cls, np.arange(len(cls))]


def _prefix_ids(spec: dict, prompt: np.ndarray, seed: int, where: str) -> tuple[list, int]:
    """Group g's requests share leading block ids g*S .. g*S+S-1; later blocks get fresh ids."""
    for key in spec:
        if key not in PREFIX_KEYS:
            raise WorkloadError(
                f"{where}: prefix: unknown key '{key}' (keys: {', '.join(PREFIX_KEYS)})"
            )
    vals = {}
    for key, default in (("shared_blocks", None), ("groups", 1), ("block_size", 512)):
        v = spec.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise WorkloadError(f"{where}: prefix: '{key}' must be an integer >= 1, got {v!r}")
        vals[key] = v
    shared, groups, bs = vals["shared_blocks"], vals["groups"], vals["block_size"]
    group = _rng(seed, PREFIX_STREAM).integers(0, groups, size=len(prompt))
    next_id, out = groups * shared, []
    for g, p in zip(group.tolist(), prompt.tolist(), strict=True):
        blocks = math.ceil(p / bs)
        ids = [g * shared + b for b in range(min(shared, blocks))]
        fresh = blocks - len(ids)
        ids.extend(range(next_id, next_id + fresh))
        next_id += fresh
        out.append(tuple(ids))
    return out, bs


def build_synthetic(spec: dict, name: str, seed: int, n: int, where: str) -> Workload:
    classes = parse_classes(spec, where)
    if len(classes) > 1:
        weights = np.asarray([c.weight for c in classes])
        cls = _rng(seed, CLASS_STREAM).choice(len(classes), size=n, p=weights / weights.sum())
    else:
        cls = np.zeros(n, dtype=np.int64)
    prompt = _pick(
        [c.prompt.sample(_rng(seed, PROMPT_STREAM, i), n) for i, c in enumerate(classes)], cls
    )
    output = _pick(
        [c.output.sample(_rng(seed, OUTPUT_STREAM, i), n) for i, c in enumerate(classes)], cls
    )
    priority = _pick(
        [
            c.priority.sample(_rng(seed, PRIORITY_STREAM, i), n)
            if c.priority
            else np.zeros(n, np.int64)
            for i, c in enumerate(classes)
        ],
        cls,
    )
    prefix: list = [()] * n
    block_size = 512
    if "session" in spec:
        if "prefix" in spec:
            raise WorkloadError(f"{where}: 'prefix' cannot be combined with 'session'")
        return _sessions(spec["session"], name, seed, n, where, prompt, output, priority)
    if "prefix" in spec:
        if not isinstance(spec["prefix"], dict):
            raise WorkloadError(f"{where}: 'prefix' must be a table")
        prefix, block_size = _prefix_ids(spec["prefix"], prompt, seed, where)
    requests = tuple(
        RequestSpec(index=i, prompt_len=p, output_len=o, priority=q, prefix_ids=x)
        for i, (p, o, q, x) in enumerate(
            zip(prompt.tolist(), output.tolist(), priority.tolist(), prefix, strict=True)
        )
    )
    return Workload(
        name=name,
        seed=seed,
        requests=requests,
        prefix_block_size=block_size,
        source={"format": "synthetic"},
    )


def _sessions(
    spec: object,
    name: str,
    seed: int,
    n: int,
    where: str,
    prompt: np.ndarray,
    output: np.ndarray,
    priority: np.ndarray,
) -> Workload:
    """n requests grouped into sessions: `turns` per session; turn 1's message is `prompt`
    long, later ones `message` long (default `prompt`); `think_ms` between a reply and the
    next turn. Every draw is a sequential stream, so N requests are the first N of more."""
    if not isinstance(spec, dict):
        raise WorkloadError(f"{where}: 'session' must be a table")
    for key in spec:
        if key not in SESSION_KEYS:
            raise WorkloadError(
                f"{where}: session: unknown key '{key}' (keys: {', '.join(SESSION_KEYS)})"
            )
    if "turns" not in spec:
        raise WorkloadError(f"{where}: session: missing 'turns' distribution")
    turns = parse_dist(spec["turns"], f"{where}: session: turns").sample(
        _rng(seed, TURNS_STREAM), n
    )
    think_spec = spec.get("think_ms", 0)
    think = parse_dist(think_spec, f"{where}: session: think_ms", default_min=0)
    think_ms = think.sample(_rng(seed, THINK_STREAM), n)
    message = prompt
    if "message" in spec:
        msg = parse_dist(spec["message"], f"{where}: session: message")
        message = msg.sample(_rng(seed, MESSAGE_STREAM), n)
    requests, session = [], 0
    while len(requests) < n:
        for k in range(1, max(1, int(turns[session])) + 1):
            i = len(requests)
            if i >= n:
                break
            requests.append(
                RequestSpec(
                    index=i,
                    prompt_len=int(prompt[i] if k == 1 else message[i]),
                    output_len=int(output[i]),
                    priority=int(priority[i]),
                    session_id=f"s{session}",
                    turn=k,
                    think_s=None if k == 1 else max(0, int(think_ms[i])) / 1000.0,
                )
            )
        session += 1
    return Workload(
        name=name,
        seed=seed,
        requests=tuple(requests),
        source={"format": "synthetic", "sessions": session},
    )
