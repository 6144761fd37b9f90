"""What `cbbench locust` hands to the Locust processes: one JSON environment variable.

Locust runs our locustfile in its own processes (master, workers, `--processes` forks), so
the settings travel as `CBBENCH_LOCUST_SETTINGS` (JSON of `LocustSettings`). Every process
loads the same workload from the spec and seed; `workload_digest` lets the master check that
a worker on another machine loaded the very same requests.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields

from cbbench.harness.errors import CbbenchError
from cbbench.workloads.spec import Workload

ENV_VAR = "CBBENCH_LOCUST_SETTINGS"


@dataclass
class LocustSettings:
    base_url: str
    workload: str = "mixed"
    model: str | None = None
    endpoint: str = "completions"
    seed: int = 0
    num_requests: int | None = None
    rate: float | None = None  # open loop (Poisson / gamma) over the workload's requests
    burstiness: float = 1.0
    arrival: str | None = None
    schedule: bool | None = None  # None: follow the workload (arrival times -> schedule)
    cycle: bool = False  # repeat the workload until Locust stops the test
    pacing_s: float | None = None  # Locust constant_pacing: at most one request per user per S
    out_dir: str | None = None
    name: str | None = None
    slo: dict = field(default_factory=dict)
    tokenizer: str | None = None
    text_prompts: bool = False
    api_key: str | None = None
    timeout_s: float = 600.0
    stream: bool = True
    embeddings_batch: int = 1  # --endpoint embeddings: inputs per request
    extensions: bool = True
    extra_body: dict = field(default_factory=dict)
    reasoning_parser: str = "auto"  # where a stream's reasoning is (client/stream_kinds.py)
    itl_events: bool = True  # one Locust "ITL" sample per token gap
    telemetry: dict = field(default_factory=dict)  # TelemetryOptions.to_dict()
    command: list[str] = field(default_factory=list)

    def to_env(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_env(cls, environ: dict | None = None) -> LocustSettings:
        text = (environ if environ is not None else os.environ).get(ENV_VAR)
        if not text:
            raise CbbenchError(
                f"{ENV_VAR} is not set: start Locust through `cbbench locust`, or set it to the "
                'JSON of LocustSettings (at least {"base_url": ..., "workload": ...})'
            )
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise CbbenchError(f"{ENV_VAR}: not JSON ({exc})") from None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known) if isinstance(data, dict) else []
        if not isinstance(data, dict) or unknown or "base_url" not in data:
            raise CbbenchError(
                f"{ENV_VAR}: expected a JSON object with base_url; bad keys {unknown}"
            )
        return cls(**data)

    def load_options(self):
        """The load options `cbbench bench` would use for the same flags."""
        from cbbench.harness.load.options import LoadOptions

        return LoadOptions(
            workload=self.workload,
            seed=self.seed,
            num_requests=self.num_requests,
            rate=self.rate,
            burstiness=self.burstiness,
            arrival=self.arrival,
        )


def load_workload_for(settings: LocustSettings) -> Workload:
    """The workload exactly as `cbbench bench` would load it from the same flags."""
    wl = settings.load_options().build_workload()
    if any(r.graph is not None for r in wl.requests):
        raise CbbenchError(
            f"{wl.name}: agent graphs (calls that fan out and join) run with cbbench bench; "
            "a Locust user sends one call at a time"
        )
    return wl


def workload_digest(wl: Workload) -> str:
    """Short hash of every request's lengths, arrival, priority, prefix ids and session
    fields (id, turn, think time, text)."""
    h = hashlib.sha256()
    for r in wl.requests:
        fields = (r.prompt_len, r.output_len, r.arrival_s, r.priority, r.prefix_ids)
        if r.session_id is not None or r.text is not None:
            fields += (r.session_id, r.turn, r.think_s, r.text)
        h.update(repr(fields).encode())
    return h.hexdigest()[:16]
