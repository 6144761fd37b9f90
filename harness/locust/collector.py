"""The run folder of a Locust run, kept by the process that owns it (local runner or master).

Same files as `cbbench bench`: `requests.jsonl` appended as records arrive (from this
process's users, or merged from workers' messages), `timeseries.jsonl` from the telemetry
samplers, `run.json` written at the start and rewritten with the summary
(`harness/results/summary.py`) whenever a test stops, so `cbbench report` and `cbbench gate` read
Locust runs like bench runs.
"""

from __future__ import annotations

import collections
import datetime as dt
import logging
from pathlib import Path

from cbbench.harness.client.endpoints import is_conversational
from cbbench.harness.errors import CbbenchError
from cbbench.harness.load.runner import default_out_dir
from cbbench.harness.results.agent_summary import agent_summary
from cbbench.harness.results.efficiency import add_telemetry_figures
from cbbench.harness.results.environment import environment
from cbbench.harness.results.records import RECORD_SCHEMA_VERSION, RequestRecord
from cbbench.harness.results.run_folder import RunWriter
from cbbench.harness.results.summary import summarize
from cbbench.workloads.spec import Workload

log = logging.getLogger("cbbench.locust")

SPARK_POINTS = 600  # server samples kept in memory for the web page's sparklines


def _now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


class RunCollector:
    def __init__(self, settings, workload: Workload, digest: str, meta_extra: dict) -> None:
        name = settings.name or workload.short_name.replace("/", "_")
        self.run_dir = (
            Path(settings.out_dir) if settings.out_dir else default_out_dir(Path(name).name)
        )
        if (self.run_dir / "requests.jsonl").exists():
            raise CbbenchError(f"{self.run_dir}: already holds a run; choose another --out")
        self.settings = settings
        self.writer = RunWriter(self.run_dir, secrets=(settings.api_key,))
        self.records: list[RequestRecord] = []
        self.keys: set[tuple[int, int]] = set()  # (worker, index): a duplicate is a bug
        self.duplicates = 0
        self.cancelled = 0  # in flight when a test stopped: not recorded
        self.samplers: list = []
        self.closed = False
        self.late = 0
        self.server_points: collections.deque = collections.deque(maxlen=SPARK_POINTS)
        self.meta: dict = {
            "name": name,
            "status": "running",
            "command": settings.command,
            "record_schema_version": RECORD_SCHEMA_VERSION,
            "timestamp_source": "user",  # gevent + http.client reads: docs/timing.md
            "workload": {
                "name": workload.name,
                "seed": workload.seed,
                "num_requests": len(workload),
                "prefix_block_size": workload.prefix_block_size,
                "source": workload.source,
                "digest": digest,
            },
            "target": {
                "base_url": settings.base_url,
                "model": settings.model,
                "endpoint": settings.endpoint,
            },
            "load": {
                "tool": "locust",
                "mode": "open" if workload.open_loop else "closed",
                "stream": settings.stream,
                "timeout_s": settings.timeout_s,
                "extensions": settings.extensions,
                "text_prompts": settings.text_prompts or is_conversational(settings.endpoint),
                "tokenizer": settings.tokenizer,
                "slo_s": settings.slo,
                "rate": settings.rate,
                "burstiness": settings.burstiness,
                "arrival": settings.arrival,
                "cycle": settings.cycle,
                "pacing_s": settings.pacing_s,
                "cap_unit": "sessions",  # a user runs a whole session (docs/sessions.md)
                **meta_extra,
            },
            "environment": environment(),
            "started_at": _now_iso(),
            "ended_at": None,
            "interrupted": False,
        }
        self.writer.write_run(self.meta)

    # -- telemetry ----------------------------------------------------------------------
    def start_samplers(self, t0_ns: int) -> None:
        from cbbench.harness.telemetry import TelemetryOptions, build_samplers

        options = TelemetryOptions.from_dict(self.settings.telemetry)
        for s in build_samplers(options, self.settings.base_url):
            s.start(t0_ns, self._on_sample)
            self.samplers.append(s)

    def _on_sample(self, sample: dict) -> None:
        self.writer.add_sample(sample)
        if sample.get("source") == "server":
            self.server_points.append(sample)

    def latest_telemetry(self) -> dict:
        return {getattr(s, "name", type(s).__name__): s.latest() for s in self.samplers}

    # -- records ------------------------------------------------------------------------
    def add(self, rec: RequestRecord) -> None:
        if self.closed:  # a worker's batch after the final run.json: cannot be written
            self.late += 1
            if self.late == 1:
                log.warning("cbbench: records arrived after %s was closed", self.run_dir)
            return
        key = (rec.worker, rec.index)
        if key in self.keys:
            self.duplicates += 1
        self.keys.add(key)
        self.writer.add_record(rec)
        self.records.append(rec)

    def add_dicts(self, rows: list[dict]) -> None:
        for row in rows:
            self.add(RequestRecord.from_dict(row))

    # -- summary ------------------------------------------------------------------------
    def summary(self) -> dict:
        summary = summarize(self.records, None, self.settings.slo)
        agent = agent_summary(self.records)  # agent sessions: makespan, tool waits, per step
        if agent is not None:
            summary["agent"] = agent
        summary["cancelled_in_flight"] = self.cancelled
        summary["duplicate_records"] = self.duplicates
        if self.samplers:
            summary["telemetry"] = {
                getattr(s, "name", type(s).__name__): s.summary() for s in self.samplers
            }
            add_telemetry_figures(summary)
        return summary

    def write(self, status: str, **load: object) -> dict:
        summary = self.summary()
        scheduler = next(
            (r.extra["scheduler"] for r in self.records if "scheduler" in r.extra), None
        )
        if scheduler:
            self.meta["target"]["scheduler"] = scheduler
        self.meta["load"].update(load)
        self.meta.update(
            status=status,
            ended_at=_now_iso(),
            interrupted=status == "interrupted",
            summary=summary,
        )
        self.writer.write_run(self.meta)
        return summary

    def close(self, status: str = "complete", **load: object) -> dict:
        """Stop the samplers, write the final run.json, close the files (once)."""
        if self.closed:
            return self.meta.get("summary", {})
        for s in self.samplers:
            s.stop()
        if status == "complete" and not any(not r.warmup for r in self.records):
            status = "empty"  # stopped before any test ran: never "complete" with 0 records
        summary = self.write(status, **load)
        self.closed = True
        self.writer.close()
        return summary
