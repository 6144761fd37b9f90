"""Typed load options shared by bench, sweep, locust and run: which requests, and when.

`LoadOptions.from_args(ns)` reads the flags `cli/bench.add_load_args` defines (sweep and
locust define a subset; what a command lacks keeps its default); `build_workload()` is the one
way a workload is loaded and given arrival times; `bench_config(...)` is the one way a
BenchConfig is built from them, so no library code fakes command-line input.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field, fields
from typing import Any

from cbbench.harness.durations import parse_seconds
from cbbench.harness.errors import CbbenchError
from cbbench.harness.load.runner import BenchConfig
from cbbench.harness.load.shards import parse_shard, parse_start_at
from cbbench.harness.load.vllm_compat import (
    check_burstiness,
    fixed_lengths_workload,
    parse_goodput,
)
from cbbench.harness.results.summary import parse_slo
from cbbench.workloads.spec import Workload


@dataclass
class LoadOptions:
    workload: str = "mixed"  # preset name, trace file or spec file
    seed: int | None = None  # None: the spec's own, else 0
    num_requests: int | None = None
    rate: float | None = None  # open loop, req/s (inf = all at once); None: the workload's own
    burstiness: float = 1.0  # gamma shape of the gaps: 1 = Poisson, < 1 burstier
    arrival: str | None = None  # poisson | constant (with rate)
    concurrency: int | None = None  # closed loop: in flight; open loop: a cap
    duration: str | None = None  # stop sending new requests after this long ("60s")
    warmup: int = 0
    shard: str | None = None  # "I/N" (0-based): this host's part of an N-host run
    start_at: str | None = None  # t0 at this wall-clock time (unix seconds or ISO with zone)

    @classmethod
    def from_args(cls, ns: argparse.Namespace, **overrides: Any) -> LoadOptions:
        """The flags as parsed; vLLM's spellings (vllm_compat) resolved, a flag left unset
        (None) keeps the default here."""
        values = {f.name: getattr(ns, f.name) for f in fields(cls) if hasattr(ns, f.name)}
        check_burstiness(values.get("burstiness"), values.get("rate"))
        values["workload"] = fixed_lengths_workload(
            values.get("workload"),
            getattr(ns, "random_input_len", None),
            getattr(ns, "random_output_len", None),
        )
        values = {k: v for k, v in values.items() if v is not None}
        return cls(**{**values, **overrides})

    def build_workload(self) -> Workload:
        from cbbench.workloads import load_workload, with_arrivals

        if self.num_requests is not None and self.num_requests < 1:  # the flag, not the preset
            raise CbbenchError(f"--num-requests must be >= 1, got {self.num_requests}")
        wl = load_workload(self.workload, seed=self.seed, num_requests=self.num_requests)
        if len(wl) == 0:
            raise CbbenchError(f"--workload {self.workload}: no requests")
        if self.rate is None:
            return wl
        if self.rate <= 0:
            raise CbbenchError(f"--rate must be > 0, got {self.rate}")
        if math.isinf(self.rate):
            return with_arrivals(wl, "all-at-once")
        if self.burstiness <= 0:
            raise CbbenchError(f"--burstiness must be > 0, got {self.burstiness}")
        kind = self.arrival or ("poisson" if self.burstiness == 1.0 else "gamma")
        cv = 1.0 / math.sqrt(self.burstiness)  # gamma shape k has CV 1/sqrt(k)
        return with_arrivals(wl, kind, rate=self.rate, cv=cv, seed=self.seed)

    def describe(self) -> dict:
        """The load as given, for run.json."""
        return {"rate": self.rate, "burstiness": self.burstiness, "arrival": self.arrival}


def parse_extra_body(text: str | None) -> dict:
    if not text:
        return {}
    try:
        extra = json.loads(text)
    except ValueError as exc:
        raise CbbenchError(f"--extra-body: not JSON ({exc})") from None
    if not isinstance(extra, dict):
        raise CbbenchError("--extra-body: expected a JSON object")
    return extra


def reasoning_body(endpoint: str, effort: str | None, template_kwargs: str | None) -> dict:
    """--reasoning-effort and --chat-template-kwargs as request body fields (chat only)."""
    body: dict = {}
    if effort:
        body["reasoning_effort"] = effort
    if template_kwargs:
        try:
            kwargs = json.loads(template_kwargs)
        except ValueError as exc:
            raise CbbenchError(f"--chat-template-kwargs: not JSON ({exc})") from None
        if not isinstance(kwargs, dict):
            raise CbbenchError("--chat-template-kwargs: expected a JSON object")
        body["chat_template_kwargs"] = kwargs
    if body and endpoint != "chat":
        flag = "--reasoning-effort" if effort else "--chat-template-kwargs"
        raise CbbenchError(f"{flag} needs --endpoint chat")
    return body


def server_root(base_url: str) -> str:
    """The server root: no trailing slash, no /v1 (the OpenAI client's habit)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass
class ClientOptions:
    """How requests are sent (bench and sweep; locust has its own settings)."""

    endpoint: str = "completions"
    model: str | None = None
    slo: str | None = None
    goodput: list[str] | None = None  # vLLM's --goodput ttft:200 (ms), instead of --slo
    tokenizer: str | None = None
    text_prompts: bool = False
    api_key: str | None = None
    workers: int = 1
    timeout_s: float = 600.0
    stream: bool = True
    extensions: bool = True
    extra_body: dict = field(default_factory=dict)
    http_client: str = "raw"
    cap_unit: str = "sessions"
    prewarm: bool = True  # open the connections (up to the concurrency) before t0
    kernel_timestamps: bool = True  # raw client: the kernel's receive times where available
    reasoning_parser: str = "auto"  # where a stream's reasoning is (client/stream_kinds.py)
    embeddings_batch: int = 1  # --endpoint embeddings: inputs per request

    def slo_s(self) -> dict[str, float]:
        """The SLOs in seconds, from --slo (units required) or vLLM's --goodput (ms)."""
        if self.slo and self.goodput:
            raise CbbenchError("--slo and --goodput both set SLOs: give one of them")
        return parse_goodput(self.goodput) if self.goodput else parse_slo(self.slo)

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> ClientOptions:
        extra_body = parse_extra_body(getattr(ns, "extra_body", None))
        if getattr(ns, "ignore_eos", False) and getattr(ns, "no_extensions", False):
            extra_body.setdefault("ignore_eos", True)  # with extensions on it is sent anyway
        return cls(
            endpoint=getattr(ns, "endpoint", "completions"),
            model=getattr(ns, "model", None),
            slo=getattr(ns, "slo", None),
            goodput=getattr(ns, "goodput", None),
            tokenizer=getattr(ns, "tokenizer", None),
            text_prompts=getattr(ns, "text_prompts", False),
            api_key=getattr(ns, "api_key", None),
            workers=getattr(ns, "workers", 1),
            timeout_s=getattr(ns, "timeout", 600.0),
            stream=not getattr(ns, "no_stream", False),
            extensions=not getattr(ns, "no_extensions", False),
            extra_body={
                **reasoning_body(
                    getattr(ns, "endpoint", "completions"),
                    getattr(ns, "reasoning_effort", None),
                    getattr(ns, "chat_template_kwargs", None),
                ),
                **extra_body,
            },
            http_client=getattr(ns, "http_client", "raw"),
            cap_unit=getattr(ns, "cap_unit", "sessions"),
            prewarm=not getattr(ns, "no_prewarm", False),
            kernel_timestamps=not getattr(ns, "user_timestamps", False),
            reasoning_parser=getattr(ns, "reasoning_parser", "auto"),
            embeddings_batch=getattr(ns, "embeddings_batch", 1),
        )


def bench_config(
    base_url: str,
    load: LoadOptions,
    client: ClientOptions,
    *,
    out_dir: str | None = None,
    name: str | None = None,
    live: bool = True,
    command: list[str] | None = None,
) -> BenchConfig:
    """The BenchConfig of one benchmark run (CbbenchError naming the bad option)."""
    if load.concurrency is not None and load.concurrency < 1:
        raise CbbenchError(f"--concurrency must be >= 1, got {load.concurrency}")
    if client.embeddings_batch < 1:
        raise CbbenchError(f"--embeddings-batch must be >= 1, got {client.embeddings_batch}")
    if client.timeout_s <= 0:
        raise CbbenchError(f"--timeout must be > 0, got {client.timeout_s}")
    shard = parse_shard(load.shard) if load.shard is not None else None
    start_at = parse_start_at(load.start_at) if load.start_at is not None else None
    wl = load.build_workload()
    duration = parse_seconds(load.duration, "--duration") if load.duration else None
    if duration is not None and duration <= 0:
        raise CbbenchError(f"--duration must be longer than 0, got {load.duration!r}")
    described = load.describe()
    if load.num_requests is not None and len(wl) < load.num_requests:  # said, not silent
        described["num_requests_asked"] = load.num_requests
    concurrency = load.concurrency
    if not wl.open_loop and concurrency is None:
        concurrency = len(wl)  # no rate, no cap, no timestamps: all at once, as vLLM does
    return BenchConfig(
        base_url=server_root(base_url),
        workload=wl,
        endpoint=client.endpoint,
        model=client.model,
        concurrency=concurrency,
        duration_s=duration,
        warmup=load.warmup,
        slo=client.slo_s(),
        tokenizer=client.tokenizer,
        api_key=client.api_key,
        workers=client.workers,
        out_dir=out_dir,
        name=name,
        timeout_s=client.timeout_s,
        stream=client.stream,
        extensions=client.extensions,
        extra_body=client.extra_body,
        text_prompts=client.text_prompts,
        load=described,
        command=list(command or []),
        live=live,
        http_client=client.http_client,
        cap_unit=client.cap_unit,
        prewarm=client.prewarm,
        kernel_timestamps=client.kernel_timestamps,
        reasoning_parser=client.reasoning_parser,
        embeddings_batch=client.embeddings_batch,
        shard=shard,
        start_at=start_at,
    )
