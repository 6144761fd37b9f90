"""Per-process state of a cbbench Locust run, for each Locust role.

- local (one process): hands out requests, sends them, keeps the run folder.
- master: keeps the run folder and the telemetry; at each test start it gives every worker a
  slot (`Plan`) and the shared t0 (wall clock). When a test stops, each process hands out
  no more requests (test_stopping), lets Locust stop its users (at once, or within
  `--stop-timeout`), then *drains* (test_stop): a worker answers the master with its last
  records and its count of requests that did not finish (cancelled, never recorded), so
  every finished request reaches the run folder exactly once. A quitting master stops no
  workers itself, so it asks them to (`cbbench_drain`) and waits for their answers.
- worker: hands out its slot's requests to its users and ships records to the master in
  batches (`cbbench_records`, every FLUSH_PERIOD_S) and in the drain answer.

Times in records are seconds from the master's t0: a worker maps the master's wall-clock t0
onto its own monotonic clock (exact on one machine; across machines, as good as NTP).

Over 400 lines because the three roles share one request hand-out and drain protocol, and
agent sessions and exact text prompts ride on it in every role.
"""

from __future__ import annotations

import logging
import time

import gevent
from cbbench.harness.client.api import ClientConfig, probe_server
from cbbench.harness.client.endpoints import is_conversational
from cbbench.harness.load.agent import AgentConversation
from cbbench.harness.load.prompts import PromptBuilder
from cbbench.harness.load.sessions import Conversation, Prompt, history_mode
from cbbench.harness.load.text_fit import fetch_text_fit
from cbbench.harness.load.words import WORDS
from cbbench.harness.locust.collector import RunCollector
from cbbench.harness.locust.dispenser import Dispenser, Plan, Ticket
from cbbench.harness.locust.schedule_note import schedule_note
from cbbench.harness.locust.settings import LocustSettings, load_workload_for, workload_digest
from cbbench.harness.results.records import RequestRecord
from cbbench.workloads.spec import RequestSpec
from locust.runners import STATE_RUNNING, STATE_SPAWNING, MasterRunner, WorkerRunner

log = logging.getLogger("cbbench.locust")

FLUSH_PERIOD_S = 0.5
DRAIN_TIMEOUT_S = 10.0
SPAWN_WAIT_S = 60.0
MSG_PLAN = "cbbench_plan"
MSG_RECORDS = "cbbench_records"
MSG_DRAIN = "cbbench_drain"
MSG_DRAINED = "cbbench_drained"
MSG_EXHAUSTED = "cbbench_exhausted"
MSG_REFUSED = "cbbench_refused"
MSG_HELLO = "cbbench_hello"
MSG_REJECT = "cbbench_reject"


class LocustRun:
    def __init__(self, environment, settings: LocustSettings) -> None:
        self.env = environment
        self.settings = settings
        runner = environment.runner
        self.role = (
            "master"
            if isinstance(runner, MasterRunner)
            else "worker"
            if isinstance(runner, WorkerRunner)
            else "local"
        )
        self.workload = load_workload_for(settings)
        self.digest = workload_digest(self.workload)
        schedule = settings.schedule if settings.schedule is not None else self.workload.open_loop
        self.dispenser = Dispenser(self.workload, schedule, settings.cycle)
        if not settings.model:
            models = probe_server(settings.base_url, settings.api_key)["models"]
            settings.model = models[0] if models else "default"
        self.client_cfg = ClientConfig(
            base_url=settings.base_url,
            model=settings.model,
            endpoint=settings.endpoint,
            stream=settings.stream,
            embeddings_batch=settings.embeddings_batch,
            api_key=settings.api_key,
            timeout_s=settings.timeout_s,
            extensions=settings.extensions,
            extra_body=settings.extra_body,
            reasoning_parser=settings.reasoning_parser,
        )
        self.text_prompts = settings.text_prompts or is_conversational(settings.endpoint)
        fit = None  # exact text lengths on a server with /tokenize, as `bench` (text_fit.py)
        if self.text_prompts and not settings.tokenizer:
            fit = fetch_text_fit(settings.base_url, settings.model, WORDS, settings.api_key)[0]
        wl = self.workload
        self.prompts = PromptBuilder(
            wl.prompt_seed, wl.prefix_block_size, settings.tokenizer, text_fit=fit
        )
        has_text = any(r.text is not None for r in self.workload.requests)
        self.history_mode = history_mode(settings.endpoint, self.text_prompts, has_text)
        self.t0_ns: int | None = None
        self.t0_wall: float | None = None
        self.accepting = False  # records of this epoch are kept
        self.outstanding = 0  # tickets taken and not yet finished (waiting or in flight)
        self.dropped = 0  # finished after the drain: counted as cancelled at the drain
        self.abandoned = 0  # tickets given back unfinished since the epoch began
        self.exhausted_sent = False
        self.worker_id = 0
        self.outbox: list[dict] = []
        # master / local
        self.collector: RunCollector | None = None
        self.planned: dict[str, int] = {}  # worker client id -> slot, this epoch
        self.acks: dict[str, dict] = {}
        self.exhausted_workers: set[str] = set()
        self.taken_max = -1
        self.tests_started = 0
        if self.role != "worker":
            meta = {"workload_schedule": schedule}
            self.collector = RunCollector(settings, self.workload, self.digest, meta)
        self._register_messages(runner)

    # -- messages ---------------------------------------------------------------------
    def _register_messages(self, runner) -> None:
        if self.role == "master":
            runner.register_message(MSG_RECORDS, self._on_records)
            runner.register_message(MSG_DRAINED, self._on_drained)
            runner.register_message(MSG_EXHAUSTED, self._on_exhausted)
            runner.register_message(MSG_REFUSED, self._on_refused)
            runner.register_message(MSG_HELLO, self._on_hello)
        elif self.role == "worker":
            runner.register_message(MSG_PLAN, self._on_plan)
            runner.register_message(MSG_DRAIN, lambda environment, msg: self._on_drain())
            runner.register_message(MSG_REJECT, lambda environment, msg: self._reject(msg.data))
            runner.send_message(MSG_HELLO, {"digest": self.digest})
            gevent.spawn(self._flush_loop)

    def _on_drain(self) -> None:
        """Worker, asked by a quitting master: stop (users get Locust's --stop-timeout); the
        answer goes out at test_stop. A worker with no test running answers at once."""
        if self.env.runner.state in (STATE_SPAWNING, STATE_RUNNING):
            gevent.spawn(self.env.runner.stop)
        else:
            self.drain(always_answer=True)

    def _on_hello(self, environment, msg) -> None:
        """A worker joined: one with another workload is told to quit before any test."""
        if msg.data["digest"] != self.digest:
            self._on_refused(environment, msg)
            self.env.runner.send_message(MSG_REJECT, {"digest": self.digest}, client_id=msg.node_id)

    def _reject(self, master: dict) -> None:
        log.error(
            "cbbench: this worker loaded a different workload than the master (digest %s, "
            "master %s): check --workload/--seed/--num-requests/--rate; quitting",
            self.digest,
            master["digest"],
        )
        self.env.process_exit_code = 2
        gevent.spawn(self.env.runner.quit)

    def _on_records(self, environment, msg) -> None:
        assert self.collector is not None
        self.collector.add_dicts(msg.data["records"])

    def _on_drained(self, environment, msg) -> None:
        assert self.collector is not None
        self.collector.add_dicts(msg.data["records"])
        self.collector.cancelled += msg.data["cancelled"]
        self.taken_max = max(self.taken_max, msg.data["taken_max"])
        self.acks[msg.node_id] = msg.data

    def _on_refused(self, environment, msg) -> None:
        assert self.collector is not None
        log.error(
            "cbbench: worker %s loaded a different workload (digest %s, master %s); "
            "it is told to quit and sends nothing",
            msg.node_id,
            msg.data["digest"],
            self.digest,
        )
        self.collector.meta["load"]["refused_workers"] = (
            self.collector.meta["load"].get("refused_workers", 0) + 1
        )
        self.planned.pop(msg.node_id, None)
        self._on_exhausted(environment, msg)

    def _on_exhausted(self, environment, msg) -> None:
        if (msg.data or {}).get("idle"):
            assert self.collector is not None
            log.warning(
                "cbbench: worker %s got no users: its share of the requests is not sent "
                "(start at least as many users as workers)",
                msg.node_id,
            )
            load = self.collector.meta["load"]
            load["idle_workers"] = load.get("idle_workers", 0) + 1
        self.exhausted_workers.add(msg.node_id)
        if self.planned and set(self.planned) <= self.exhausted_workers:
            self._finish("every worker ran out of requests")

    def _on_plan(self, environment, msg) -> None:
        d = msg.data
        if d["digest"] != self.digest:
            self.env.runner.send_message(MSG_REFUSED, {"digest": self.digest})
            self._reject(d)
            return
        self.t0_wall = d["t0_wall"]
        self.t0_ns = time.monotonic_ns() - int((time.time() - d["t0_wall"]) * 1e9)
        index = getattr(self.env.runner, "worker_index", -1)
        self.worker_id = index if index >= 0 else d["slot"]
        self.dispenser.assign(Plan(d["slot"], d["of"], d["base"], d["shift_s"]))
        self.accepting = True
        self.exhausted_sent = False
        self.abandoned = 0
        self._check_exhausted()  # a restart after the whole workload ran: nothing to send

    def on_spawning_complete(self) -> None:
        """Worker: with no users, its slot's requests are never sent; tell the master."""
        if self.accepting and self.env.runner.user_count == 0 and not self.exhausted_sent:
            self.exhausted_sent = True
            log.warning("cbbench: this worker got no users; its share of requests is not sent")
            self.env.runner.send_message(MSG_EXHAUSTED, {"idle": True})

    def _flush_loop(self) -> None:
        while True:
            gevent.sleep(FLUSH_PERIOD_S)
            self.flush()

    def flush(self) -> None:
        if self.outbox:
            batch, self.outbox = self.outbox, []
            self.env.runner.send_message(MSG_RECORDS, {"records": batch})

    # -- test lifecycle (local and master) ----------------------------------------------
    def now_s(self) -> float:
        assert self.t0_ns is not None
        return (time.monotonic_ns() - self.t0_ns) / 1e9

    def start_test(self) -> None:
        assert self.collector is not None
        self.tests_started += 1
        if self.t0_ns is None:
            self.t0_ns, self.t0_wall = time.monotonic_ns(), time.time()
            self.collector.start_samplers(self.t0_ns)
        done = [self.dispenser.position_of(r.index) for r in self.collector.records]
        base = max([self.taken_max, self.dispenser.taken_max, *done]) + 1
        shift = self.now_s() - self.dispenser.due_raw(base) if base else 0.0
        self.exhausted_sent = False
        self.exhausted_workers = set()
        if self.role == "local":
            self.dispenser.assign(Plan(0, 1, base, shift))
            self.accepting = True
            self.abandoned = 0
            self._check_exhausted()
            return
        runner = self.env.runner
        workers = runner.clients.ready + runner.clients.spawning + runner.clients.running
        ids = sorted((w.id for w in workers), key=runner.get_worker_index)
        self.planned = {cid: k for k, cid in enumerate(ids)}
        self.acks = {}
        for cid, k in self.planned.items():
            data = {"slot": k, "of": len(ids), "base": base, "shift_s": shift}
            data.update(t0_wall=self.t0_wall, digest=self.digest)
            runner.send_message(MSG_PLAN, data, client_id=cid)

    def stopping(self) -> None:
        """A test is stopping: hand out no more requests; those in flight may still finish
        while Locust stops the users (immediately, or within --stop-timeout)."""
        self.dispenser.close()

    def drain(self, always_answer: bool = False) -> None:
        """The users are stopped: keep what finished, count what did not as cancelled."""
        if self.role == "master":
            self._drain_workers()
            return
        if not self.accepting and not always_answer:
            return
        self.accepting = False
        self.dispenser.close()
        cancelled, self.abandoned = self.outstanding + self.abandoned, 0
        if self.role == "worker":
            batch, self.outbox = self.outbox, []
            data = {"records": batch, "cancelled": cancelled}
            data["taken_max"] = self.dispenser.taken_max
            self.env.runner.send_message(MSG_DRAINED, data)
        else:
            assert self.collector is not None
            self.collector.cancelled += cancelled

    def _drain_workers(self) -> None:
        runner = self.env.runner
        waiting = [cid for cid in self.planned if cid in runner.clients and cid not in self.acks]
        for cid in waiting:
            runner.send_message(MSG_DRAIN, None, client_id=cid)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S + (self.env.stop_timeout or 0.0)
        while time.monotonic() < deadline and any(
            cid not in self.acks and cid in runner.clients for cid in waiting
        ):
            gevent.sleep(0.05)
        missing = [cid for cid in waiting if cid not in self.acks]
        if missing:
            log.warning("cbbench: no drain answer from %d worker(s): %s", len(missing), missing)
        self.planned = {}

    def _finish(self, reason: str) -> None:
        opts = self.env.parsed_options
        headless = bool(opts and getattr(opts, "headless", False))
        log.info("cbbench: %s; %s", reason, "quitting" if headless else "stopping the test")
        runner = self.env.runner

        def stop() -> None:
            # a stop while Locust is still spawning would be undone when spawning completes
            deadline = time.monotonic() + SPAWN_WAIT_S
            while runner.state == STATE_SPAWNING and time.monotonic() < deadline:
                gevent.sleep(0.05)
            (runner.quit if headless else runner.stop)()

        gevent.spawn(stop)

    def close(self) -> None:
        """At quit: drain, stop the samplers, write the final run.json."""
        self.drain()
        if self.collector is not None:
            runner = self.env.runner
            workers = getattr(runner, "worker_index_max", 0) if self.role == "master" else 0
            self.collector.close("complete", locust_workers=workers)
            if self.collector.meta.get("status") == "empty":
                print("cbbench locust: no request finished (stopped before any test ran): "
                      "run.json says status 'empty'", flush=True)  # fmt: skip
            opts = self.env.parsed_options
            note = schedule_note(self.collector.records, getattr(opts, "num_users", None))
            if note is not None:
                print(note, flush=True)
            print(f"cbbench locust: run folder {self.collector.run_dir}", flush=True)

    # -- users (local and worker) -------------------------------------------------------
    def take(self) -> Ticket | None:
        if not self.accepting:
            return None
        ticket = self.dispenser.take()
        if ticket is not None:
            self.outstanding += 1
        return ticket

    def new_record(self, ticket: Ticket, spec: RequestSpec) -> RequestRecord:
        """The record of one turn of `ticket` (or of its one request)."""
        index = ticket.index_of(spec)
        rec = RequestRecord(
            id=f"cbb-{index}",
            index=index,
            prompt_len=spec.prompt_len,
            output_len=spec.output_len,
            priority=spec.priority,
            worker=self.worker_id,
            session_id=ticket.session_id(spec),
            turn=spec.turn if spec.session_id is not None else None,
        )
        if ticket.lap:
            rec.extra["lap"] = ticket.lap
        return rec

    def conversation(self, ticket: Ticket) -> Conversation | None:
        """A session's history (None for a lone request)."""
        if ticket.turns[0].session_id is None:
            return None
        if ticket.turns[0].agent is not None:  # tools, tool_calls, tool results (load/agent.py)
            return AgentConversation(self.prompts)  # type: ignore[return-value]
        return Conversation(self.history_mode, self.prompts)

    def prompt(
        self, ticket: Ticket, spec: RequestSpec, rec: RequestRecord, conv: Conversation | None
    ) -> Prompt:
        """The turn's whole prompt (a session's history first); sets the record's client
        prompt-token count as `cbbench bench` does."""
        index = ticket.index_of(spec)
        if conv is not None:
            prompt = conv.prompt(rec, spec, index)
        else:
            build = self.prompts.text if self.text_prompts else self.prompts.token_ids
            prompt = build(index, spec.prompt_len, spec.prefix_ids)
        session = rec.session_id is not None
        endpoint = self.settings.endpoint
        rec.prompt_tokens_client = self.prompts.count_prompt(
            prompt, endpoint, spec.prompt_len, session
        )
        return prompt

    def keep(self, rec: RequestRecord) -> bool:
        """A finished request (a turn): kept if this epoch still accepts records."""
        if not self.accepting:
            self.dropped += 1
            return False
        if self.role == "worker":
            self.outbox.append(rec.to_dict())
        else:
            assert self.collector is not None
            self.collector.add(rec)
        return True

    def release(self, cancelled: bool) -> None:
        """A ticket is done; `cancelled`: a request of it was in flight or still waiting to
        be due when its user was stopped (counted, never recorded)."""
        self.outstanding -= 1
        assert self.outstanding >= 0
        if cancelled:
            self.abandoned += 1
        self._check_exhausted()

    def _check_exhausted(self) -> None:
        if self.exhausted_sent or not self.accepting or self.outstanding:
            return
        if not self.dispenser.exhausted:
            return
        self.exhausted_sent = True
        if self.role == "worker":
            self.flush()
            self.env.runner.send_message(MSG_EXHAUSTED, {"taken_max": self.dispenser.taken_max})
        else:
            self._finish("the workload ran out of requests")
