"""Telemetry during a run: the server's Prometheus `/metrics`, NVML GPU and powercap (RAPL)
samplers, and the price per hour of what serves the run (`--cost-per-hour`).

`TelemetryOptions.add_args(parser)` adds the flags and `TelemetryOptions.from_args(ns)` reads
them; `build_samplers(options, base_url)` turns them into samplers that follow the runner's
protocol: `name`, `start(t0_ns, sink)`, `stop()`, `summary()` and `latest()`.

Layer: telemetry (samplers beside the load; they read /metrics and NVML).
Imports: nothing.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from cbbench.harness.durations import duration_arg

if TYPE_CHECKING:
    from cbbench.harness.telemetry.gpu import GpuSampler
    from cbbench.harness.telemetry.server_sampler import ServerMetricsSampler

DEFAULT_INTERVAL_S = 0.25  # 4 Hz


def parse_gpus(text: str) -> list[int]:
    """`--gpus 0,1` -> [0, 1] (NVML device indices)."""
    try:
        gpus = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated NVML device indices such as 0,1, got {text!r}"
        ) from None
    if not gpus or any(g < 0 for g in gpus):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated NVML device indices such as 0,1, got {text!r}"
        )
    return sorted(set(gpus))


_interval = duration_arg(0.01, 60.0)  # harness/durations.py: 250ms, 0.5s, 1 (seconds)


def _url(text: str) -> str:
    if not text.startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL, got {text!r}")
    return text


def add_telemetry_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("telemetry")
    g.add_argument(
        "--metrics-url",
        type=_url,
        default=None,
        help="Prometheus endpoint of the server (default: the target's base URL + /metrics)",
    )
    g.add_argument(
        "--no-server-metrics", action="store_true", help="do not scrape the server's /metrics"
    )
    g.add_argument(
        "--server-metrics-url",
        type=_url,
        action="append",
        default=None,
        metavar="URL",
        help="one replica's /metrics behind a router, repeated per replica: per-replica "
        "timelines and imbalance (cbbench's router needs none: its /metrics has them)",
    )
    g.add_argument(
        "--metrics-interval",
        type=_interval,
        default=DEFAULT_INTERVAL_S,
        metavar="DURATION",
        help=f"sampling interval of the server and GPU samplers, 10ms to 60s (default "
        f"{DEFAULT_INTERVAL_S * 1e3:g}ms = 4 Hz)",
    )
    g.add_argument(
        "--gpus",
        type=parse_gpus,
        default=None,
        metavar="0,1",
        help="NVML indices of the GPUs to sample (default: every GPU NVML sees)",
    )
    g.add_argument(
        "--no-gpu-metrics",
        action="store_true",
        help="do not sample GPUs (NVML) nor CPU energy (powercap)",
    )
    g.add_argument(
        "--cost-per-hour",
        type=_cost_per_hour,
        default=None,
        metavar="USD",
        help="price per hour of what serves the run, or one per replica (2.5,2.5): the "
        "summary, report and gate get $ per 1M output tokens and per request",
    )


def _cost_per_hour(text: str) -> list[float]:
    from cbbench.harness.telemetry.price import parse_cost_per_hour

    return parse_cost_per_hour(text)


def metrics_url_for(base_url: str) -> str:
    """The default `/metrics` URL: at the server's root, even if `base_url` ends in /v1."""
    url = base_url.rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url + "/metrics"


@dataclass
class TelemetryOptions:
    """What to sample during a run (bench, sweep, locust, run)."""

    metrics_url: str | None = None  # None: the target's base URL + /metrics
    server_metrics: bool = True
    interval_s: float = DEFAULT_INTERVAL_S
    gpus: list[int] | None = None  # NVML indices; None: every GPU NVML sees
    gpu_metrics: bool = True
    cost_per_hour: list[float] | None = None  # $ per hour, one figure or one per replica
    replica_metrics_urls: list[str] | None = None  # one /metrics per replica (--server-metrics-url)

    add_args = staticmethod(add_telemetry_args)

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> TelemetryOptions:
        return cls(
            metrics_url=getattr(ns, "metrics_url", None),
            server_metrics=not getattr(ns, "no_server_metrics", False),
            interval_s=getattr(ns, "metrics_interval", DEFAULT_INTERVAL_S),
            gpus=getattr(ns, "gpus", None),
            gpu_metrics=not getattr(ns, "no_gpu_metrics", False),
            cost_per_hour=getattr(ns, "cost_per_hour", None),
            replica_metrics_urls=getattr(ns, "server_metrics_url", None),
        )

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TelemetryOptions:
        return cls(**d)


def build_samplers(options: TelemetryOptions, base_url: str | None) -> list:
    """Samplers for the run."""
    from cbbench.harness.telemetry.experts import ExpertLoadSampler
    from cbbench.harness.telemetry.gpu import GpuSampler
    from cbbench.harness.telemetry.powercap import PowercapSampler
    from cbbench.harness.telemetry.price import PriceSampler
    from cbbench.harness.telemetry.replicas import ReplicaSampler
    from cbbench.harness.telemetry.server_sampler import ServerMetricsSampler

    if not isinstance(options, TelemetryOptions):  # a namespace of the telemetry flags
        options = TelemetryOptions.from_args(options)
    samplers: list = []
    if options.server_metrics:
        url = options.metrics_url
        if url is None and base_url:
            url = metrics_url_for(base_url)
        if url:
            samplers.append(ServerMetricsSampler(url, interval_s=options.interval_s))
        if options.replica_metrics_urls:
            urls = options.replica_metrics_urls
            samplers.append(ReplicaSampler(None, urls, interval_s=options.interval_s))
        elif url:  # a router's labelled series, if the target is one
            samplers.append(ReplicaSampler(url, interval_s=options.interval_s))
        if url:  # per-expert load, if the target is an MoE server that exports it
            samplers.append(ExpertLoadSampler(url, interval_s=options.interval_s))
    if options.gpu_metrics:
        gpu = GpuSampler(interval_s=options.interval_s, gpus=options.gpus)
        gpu.validate()  # a wrong --gpus index fails now, before the run starts
        samplers.append(gpu)
        samplers.append(PowercapSampler(options.interval_s))  # energy where NVML is absent
    if options.cost_per_hour:
        samplers.append(PriceSampler(options.cost_per_hour))
    return samplers


def __getattr__(name: str) -> Any:  # the samplers import httpx/NVML: only when used
    if name == "GpuSampler":
        from cbbench.harness.telemetry.gpu import GpuSampler

        return GpuSampler
    if name == "ServerMetricsSampler":
        from cbbench.harness.telemetry.server_sampler import ServerMetricsSampler

        return ServerMetricsSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_INTERVAL_S",
    "GpuSampler",
    "ServerMetricsSampler",
    "TelemetryOptions",
    "add_telemetry_args",
    "build_samplers",
    "metrics_url_for",
    "parse_gpus",
]
