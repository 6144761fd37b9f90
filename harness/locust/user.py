"""`CbbenchUser`: a Locust user that sends the workload's requests to an OpenAI-compatible
streaming endpoint and reports LLM latencies into Locust's own statistics.

Each user has one request in flight, and runs one *unit* at a time: a request, or a
multi-turn session from its first turn to its last reply (users = concurrent chat users, as
`cbbench bench --cap-unit sessions`). A later turn resends the history with the server's
actual reply (`sessions.Conversation`) after the session's think time; a failed turn ends its
session; a stopping test starts no new turn. Closed loop: a user takes the next unit as soon
as its previous one ends (load = user count). Schedule (open loop): a user takes the next
unit in arrival order (a session by its first turn) and sends it when it is due; if every
user is busy it waits for one (recorded as `client_queue_s`, as `cbbench bench` does with a
concurrency cap). Pacing: `wait_time` is Locust's `constant_pacing` (set by `--pacing`).

Per finished request, one Locust request of request_type "LLM" named "E2E" (response time in
ms, response length the output tokens): Locust's RPS and Aggregated row count requests. Rows
"TTFT", "TPOT" and "ITL" (one sample per token gap) sit beside it in Locust's table, outside
the Aggregated row. A failed request is one failed "E2E" request carrying the error.
"""

from __future__ import annotations

import gevent
from cbbench.harness.client.reply import Reply
from cbbench.harness.locust.dispenser import Ticket
from cbbench.harness.locust.run_state import LocustRun
from cbbench.harness.locust.sync_client import SyncOpenAIClient
from cbbench.harness.results.records import RequestRecord
from locust import User, constant, task

REQUEST_TYPE = "LLM"
IDLE_SLEEP_S = 0.2  # a user with nothing to send (workload done, or no slot yet)
STOP_POLL_S = 0.1  # a thinking session checks this often whether the test is stopping


class LLMRequestError(Exception):
    """A failed request, as Locust's failures table shows it."""


def report_to_locust(environment, rec: RequestRecord, itl_events: bool = True) -> None:
    """One Locust request per LLM request (its E2E): Locust's header RPS, its Aggregated row
    and its request listeners count requests. TTFT, TPOT and ITL get rows of their own in
    Locust's table (logged into their stats entries, which the distributed master merges
    like any row) but are not requests: they stay out of the Aggregated row and the RPS."""
    if not rec.ok:
        elapsed = (rec.end_s or 0.0) - (rec.sent_s or rec.end_s or 0.0)
        exc = LLMRequestError(f"{rec.error_kind}: {rec.error}")
        _fire(environment, rec, "E2E", elapsed, 0, exc)
        return
    stats = environment.stats

    def part(name: str, seconds: float, length: int = 0) -> None:
        stats.get(name, REQUEST_TYPE).log(seconds * 1000.0, length)

    if rec.ttft_s is not None:
        part("TTFT", rec.ttft_s)
    if rec.tpot_s is not None:
        part("TPOT", rec.tpot_s)
    if itl_events:
        for gap in rec.itl_s:
            part("ITL", gap, 1)
    tokens = rec.output_tokens_server or rec.output_tokens_client or 0
    _fire(environment, rec, "E2E", rec.e2e_s or 0.0, tokens)


def _fire(environment, rec: RequestRecord, name: str, seconds: float, length: int, exc=None):
    environment.events.request.fire(
        request_type=REQUEST_TYPE,
        name=name,
        response_time=seconds * 1000.0,
        response_length=length,
        exception=exc,
        context={"request_id": rec.id},
    )


class CbbenchUser(User):
    """Configured by `CBBENCH_LOCUST_SETTINGS` (see `cbbench locust`)."""

    wait_time = constant(0)

    def on_start(self) -> None:
        self.run: LocustRun = self.environment.cbbench
        self.client = SyncOpenAIClient(self.run.client_cfg)

    def on_stop(self) -> None:
        self.client.close()

    @task
    def send_next(self) -> None:
        """Run one unit: a request, or a session's turns one after another."""
        run = self.run
        ticket = run.take()
        if ticket is None:
            gevent.sleep(IDLE_SLEEP_S)
            return
        pending = True  # a request waits or is in flight: cancelled if the user stops now
        try:
            self.client.t0_ns = run.t0_ns
            conv = run.conversation(ticket)
            for k, spec in enumerate(ticket.turns):
                if k:
                    pending = False
                    waited = run.now_s()
                    if not self._think(spec.think_s or 0.0):
                        return  # the test is stopping: no new turn
                    pending = True
                    ready = run.now_s()  # after the previous reply and the think time
                rec = run.new_record(ticket, spec)
                if k and spec.agent is not None:  # the tool ran: apart from every latency
                    rec.extra["tool_wait_s"] = ready - waited
                prompt = run.prompt(ticket, spec, rec, conv)
                if k:
                    rec.ready_s = ready
                elif not self._wait_until_due(rec, ticket):
                    return  # the test is stopping: not sent
                reply = Reply() if conv is not None else None
                self.client.send_sync(rec, prompt, reply)
                assert rec.sent_s is not None and rec.ready_s is not None
                rec.send_lag_s = (
                    rec.sent_s - rec.ready_s - (rec.client_queue_s or 0.0) - (rec.connect_s or 0.0)
                )
                pending = False
                if run.keep(rec):
                    report_to_locust(self.environment, rec, run.settings.itl_events)
                if conv is not None and not conv.reply(rec, prompt, reply):
                    return  # a failed turn ends its session: there is no reply to build on
        finally:
            run.release(cancelled=pending)

    def _wait_until_due(self, rec: RequestRecord, ticket: Ticket) -> bool:
        """A first turn: wait for its due time (schedule mode); False if the test stopped."""
        run = self.run
        now = run.now_s()
        if ticket.due_s is None:
            rec.ready_s = now
            return True
        rec.scheduled_s = rec.ready_s = ticket.due_s
        if ticket.due_s > now:
            # never early: libev's cached loop time can lag the monotonic clock
            while (left := ticket.due_s - run.now_s()) > 0:
                gevent.sleep(left)
            return run.dispenser.is_open
        rec.client_queue_s = now - ticket.due_s  # late: every user was busy when it came due
        return True

    def _think(self, think_s: float) -> bool:
        """A session's pause before its next turn (at least think_s); False as soon as the
        test stops."""
        run = self.run
        until = run.now_s() + think_s
        while run.dispenser.is_open and (left := until - run.now_s()) > 0:
            gevent.sleep(min(left, STOP_POLL_S))
        return run.dispenser.is_open
