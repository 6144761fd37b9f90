"""Measure the engine <-> API transport: `python -m tests.benchmarks.studies.ipc_bench`.

Ping-pong between two processes, side by side in one run: ZMQ (ipc://) + pickle (what the
engine process uses), ZMQ + msgpack (ipc.msgpack_encode), and a multiprocessing.Queue pair
(pickle + a pipe + a feeder thread).
The payload is one engine step's message with N RequestOutputs; the figure is the median
round trip (two one-way messages, each encoded and decoded once).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import time
from typing import Any

from cbbench.reference_engine.core.outputs import EngineStats, RequestMetrics, RequestOutput
from cbbench.reference_engine.server.ipc import decode, encode, msgpack_decode, msgpack_encode

CODECS = {"pickle": (encode, decode), "msgpack": (msgpack_encode, msgpack_decode)}


def step_message(n: int) -> dict[str, Any]:
    outs = [
        RequestOutput(f"cmpl-{i:032x}", [i], 100, 10, False, None, RequestMetrics(1.0, 1.1, 1.2))
        for i in range(n)
    ]
    stats = EngineStats(n, 0, 0, 10, 100, 0, 1.0, n, 0.01)
    return {
        "t": "step",
        "now": 1.0,
        "outputs": outs,
        "stats": stats,
        "accepted": [],
        "rejected": [],
    }


def _zmq_echo(addr_in: str, addr_out: str, rounds: int, codec: str) -> None:
    import zmq

    encode, decode = CODECS[codec]
    ctx = zmq.Context(1)
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.connect(addr_in)
    push.connect(addr_out)
    for _ in range(rounds):
        push.send(encode(decode(pull.recv())))
    push.close(linger=1000)
    pull.close()
    ctx.term()


def bench_zmq(n: int, rounds: int, codec: str) -> list[float]:
    import zmq

    encode, decode = CODECS[codec]
    d = tempfile.mkdtemp(prefix="cbbench-ipcbench-")
    a, b = f"ipc://{d}/a", f"ipc://{d}/b"
    ctx = zmq.Context(1)
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    push.bind(a)
    pull.bind(b)
    p = multiprocessing.get_context("spawn").Process(target=_zmq_echo, args=(a, b, rounds, codec))
    p.start()
    msg, times = step_message(n), []
    for _ in range(rounds):
        t = time.perf_counter()
        push.send(encode(msg))
        decode(pull.recv())
        times.append(time.perf_counter() - t)
    p.join()
    push.close(linger=0)
    pull.close(linger=0)
    ctx.term()
    return times


def _queue_echo(q_in: Any, q_out: Any, rounds: int) -> None:
    for _ in range(rounds):
        q_out.put(q_in.get())


def bench_mp_queue(n: int, rounds: int) -> list[float]:
    mp = multiprocessing.get_context("spawn")
    q_in, q_out = mp.Queue(), mp.Queue()
    p = mp.Process(target=_queue_echo, args=(q_in, q_out, rounds))
    p.start()
    msg, times = step_message(n), []
    for _ in range(rounds):
        t = time.perf_counter()
        q_in.put(msg)
        q_out.get()
        times.append(time.perf_counter() - t)
    p.join()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2000)
    ap.add_argument("--outputs", type=int, nargs="+", default=[1, 8, 64, 256])
    args = ap.parse_args()
    print("median round trip of one step message, microseconds (lower is better)")
    print(f"{'outputs/step':>12} {'zmq+pickle':>11} {'zmq+msgpack':>12} {'mp.Queue':>9}")
    for n in args.outputs:
        p = statistics.median(bench_zmq(n, args.rounds, "pickle")) * 1e6
        m = statistics.median(bench_zmq(n, args.rounds, "msgpack")) * 1e6
        q = statistics.median(bench_mp_queue(n, args.rounds)) * 1e6
        print(f"{n:>12} {p:>11.1f} {m:>12.1f} {q:>9.1f}")


if __name__ == "__main__":
    main()
