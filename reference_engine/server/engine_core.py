"""The engine process: schedules and executes, nothing else (vLLM v1's EngineCore).

It owns the LLMEngine. Commands arrive from the API process on a ZMQ PULL socket (batches
of `("add", ...)`, `("abort", id)`, `("reset_prefix_cache",)`, `("shutdown",)`); after each step it sends ONE message on
a PUSH socket with everything the API needs: the step's RequestOutputs, the engine stats,
the engine clock, and which adds were accepted or rejected. See ipc.py for the encoding.

Messages engine -> API (msgpack maps, key "t" is the type):
  {"t": "ready", "info": describe(), "max_model_len": int, "vocab_size": int}
  {"t": "step", "now": float, "outputs": [RequestOutput], "stats": EngineStats,
   "accepted": [request_id], "rejected": [[request_id, kind, message]]}
  {"t": "error", "message": str}   (start-up failed or the loop crashed; the process exits)
  {"t": "bye"}                    (after a shutdown command)

The process ignores SIGINT (a terminal's Ctrl-C reaches the whole process group; the API
process decides when to stop) and exits by itself when its parent goes away.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import traceback
from typing import Any

from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.errors import EngineError, QueueFullError
from cbbench.reference_engine.server.ipc import decode, encode
from cbbench.reference_engine.server.lifeline import die_with_parent
from cbbench.reference_engine.server.quick_exit import exit_now

logger = logging.getLogger("cbbench.engine_core")

MAX_IDLE_WAIT_S = 0.5  # upper bound on one idle poll (parent liveness, next_wakeup None)


def run_engine_core(
    config: EngineConfig, in_addr: str, out_addr: str, parent_pid: int, nice: int = 0
) -> None:
    """Entry point of the engine process (multiprocessing target). `nice` > 0 lowers its
    CPU priority, so the API process wins a contended core (docs/performance.md)."""
    import zmq

    # First: a server killed while this process builds kernels or loads weights must not
    # leave it running (poll only: the server may start it from any thread).
    die_with_parent(parent_pid, pdeathsig=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if nice:
        os.nice(nice)
    ctx = zmq.Context(1)
    inbox = ctx.socket(zmq.PULL)
    inbox.connect(in_addr)
    outbox = ctx.socket(zmq.PUSH)
    outbox.setsockopt(zmq.LINGER, 2000)
    outbox.connect(out_addr)
    try:
        core = EngineCore(config)
    except BaseException as exc:  # start-up failed: say why, exit
        outbox.send(encode({"t": "error", "message": _describe(exc)}))
        outbox.close()
        ctx.term()
        exit_now(0)
    outbox.send(encode({"t": "ready", **core.ready_info()}))
    try:
        core.serve(inbox, outbox, parent_pid)
    except BaseException as exc:
        logger.error("engine core crashed:\n%s", traceback.format_exc())
        outbox.send(encode({"t": "error", "message": _describe(exc)}))
    finally:
        inbox.close(linger=0)
        outbox.close()
        ctx.term()
    exit_now(0)  # the server waits for this process: skip the interpreter's slow teardown


def _describe(exc: BaseException) -> str:
    if isinstance(exc, EngineError):
        return str(exc)
    return f"{type(exc).__name__}: {str(exc)[:200]}"


class EngineCore:
    """The engine loop, transport-agnostic apart from `serve`."""

    def __init__(self, config: EngineConfig, llm_engine: Any = None):
        if llm_engine is None:
            from cbbench.reference_engine.engine.llm_engine import LLMEngine

            llm_engine = LLMEngine.from_config(config)
        self.engine = llm_engine
        from cbbench.reference_engine.server.async_engine import _is_virtual, _WallClockPacer

        self.pacer = _WallClockPacer(llm_engine.executor) if _is_virtual(llm_engine) else None

    def ready_info(self) -> dict[str, Any]:
        e = self.engine
        return {
            "info": e.describe(),
            "max_model_len": e.max_model_len,
            "vocab_size": e.model_config.vocab_size,
        }

    # --- commands ------------------------------------------------------------------------
    def apply(self, commands: list[list[Any]]) -> tuple[list[str], list[list[str]], bool]:
        """Apply a batch of commands: (accepted ids, rejected [id, kind, message], shutdown)."""
        accepted: list[str] = []
        rejected: list[list[str]] = []
        for cmd in commands:
            kind = cmd[0]
            if kind == "add":
                _, request_id, prompt, params, priority, *kv = cmd
                try:
                    self.engine.add_request(
                        request_id, prompt, params, priority=priority, **(kv[0] if kv else {})
                    )
                except QueueFullError as exc:
                    rejected.append([request_id, "queue_full", str(exc)])
                except EngineError as exc:
                    rejected.append([request_id, "invalid", str(exc)])
                except Exception as exc:  # an engine bug: fail this request, keep serving
                    rejected.append([request_id, "internal", _describe(exc)])
                else:
                    accepted.append(request_id)
            elif kind == "abort":
                self.engine.abort_request(cmd[1])
            elif kind == "reset_prefix_cache":
                self.engine.reset_prefix_cache()
            elif kind == "shutdown":
                return accepted, rejected, True
            else:
                raise AssertionError(f"unknown engine command {kind!r}")
        return accepted, rejected, False

    def idle_timeout(self) -> float | None:
        """Seconds to wait for a command when there is nothing to compute now."""
        e = self.engine
        if not e.has_unfinished_requests():
            return MAX_IDLE_WAIT_S
        wakeup = e.next_wakeup()
        if wakeup is None:
            return MAX_IDLE_WAIT_S
        return min(MAX_IDLE_WAIT_S, max(0.0, wakeup - e.now()))

    def step(self) -> tuple[list[Any], Any, bool]:
        """One engine step if there is work: (outputs, stats, progressed)."""
        e = self.engine
        if not e.has_unfinished_requests():
            return [], e.get_stats(), False
        outputs = e.step()
        if self.pacer is not None:
            self.pacer.wait_for_virtual_time()
        stats = e.get_stats()
        return outputs, stats, bool(outputs) or stats.num_batched_tokens > 0

    # --- the process loop ----------------------------------------------------------------
    def serve(self, inbox: Any, outbox: Any, parent_pid: int) -> None:
        import zmq

        poller = zmq.Poller()
        poller.register(inbox, zmq.POLLIN)
        progressed = False
        last_parent_check = time.monotonic()
        while True:
            if self.pacer is not None:
                self.pacer.catch_up()
            if not progressed:
                timeout = self.idle_timeout()
                poller.poll(None if timeout is None else int(timeout * 1000) + 1)
                if self.pacer is not None:
                    self.pacer.catch_up()
            commands: list[list[Any]] = []
            while True:
                try:
                    commands.extend(decode(inbox.recv(zmq.NOBLOCK)))
                except zmq.Again:
                    break
            accepted, rejected, shutdown = self.apply(commands) if commands else ([], [], False)
            if shutdown:
                outbox.send(encode({"t": "bye"}))
                return
            early = self.engine.take_pending_outputs()  # imported first tokens: sent at once,
            if early:  # not a decode step later with the second (engine/disagg.py)
                outbox.send(encode({"t": "step", "now": self.engine.now(), "outputs": early,
                                    "stats": self.engine.get_stats(), "accepted": accepted,
                                    "rejected": rejected}))  # fmt: skip
                accepted, rejected = [], []
            outputs, stats, progressed = self.step()
            if outputs or accepted or rejected or progressed or commands:
                outbox.send(
                    encode(
                        {
                            "t": "step",
                            "now": self.engine.now(),
                            "outputs": outputs,
                            "stats": stats,
                            "accepted": accepted,
                            "rejected": rejected,
                        }
                    )
                )
            now = time.monotonic()
            if now - last_parent_check > MAX_IDLE_WAIT_S:
                last_parent_check = now
                if os.getppid() != parent_pid:
                    return  # the API process is gone: nobody to serve
