"""The per-request timing bound is an upper bound in stalled runs, graded request by request
against the scripted server's log (the healthy case is test_selftest_workers).

The server logs, per request, when the request came (`t_recv_ns`, the kernel's stamp), when
it stamped its first token (`t_send_ns`, right before the send) and when that send returned
(`t_first_written_ns`): the first token reached the client's socket in between. So a
request's TTFT error is at least (client stamp - written) + (t_recv - sent) and at most the
same with `t_send_ns`; the first can only exceed the request's `stamp_bound_s` if the bound
is not one (the server being preempted between its stamp and its send, ~4 ms slices on this
shared machine, moves only the second). Two ways to stall the loop: 512 streams with a token
every 10 ms on one worker (the loop is never idle, reads merge; the bound of the first pass,
`lateness.py`, was exceeded here by up to 5 ms in 69 requests of 9,280), and a thread that
holds the GIL 30 ms at a time.
"""

import io
import os
import sys
import tempfile
import threading

import numpy as np
import pytest
from cbbench.harness.cli.selftest import ServerProcess
from cbbench.harness.client.h1conn import kernel_timestamps_supported
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.servers.fake_server import Behavior, FakeServerConfig
from cbbench.harness.studies.selftest import good_records
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console

# the kernel's stamp is CLOCK_REALTIME, moved to CLOCK_MONOTONIC with two clock reads
CLOCK_SLACK_S = 0.0002

# serial (its stalls and its bound are graded against the server's log, tuned on a quiet core): the README's command
# runs it after the parallel phase, alone
pytestmark = [
    pytest.mark.serial,
    pytest.mark.skipif(kernel_timestamps_supported() is not None, reason="needs SO_TIMESTAMPNS"),
]


def _hog(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(10_000))


def _run(streams: int, itl_s: float, seconds: float, hog: bool):
    cfg = FakeServerConfig(Behavior(ttft_s=0.03, itl_s=itl_s, queue_time_s=None))
    wl = Workload("stall", 0, tuple(RequestSpec(i, 16, 12) for i in range(20_000)))
    stop = threading.Event()
    old = sys.getswitchinterval()
    with ServerProcess(cfg) as srv, tempfile.TemporaryDirectory() as tmp:
        bench = BenchConfig(
            base_url=srv.url, workload=wl, concurrency=streams, duration_s=seconds, warmup=0,
            workers=1, out_dir=os.path.join(tmp, "run"), name="stall", live=False,
            collect_server_times=True, kernel_timestamps=True,
        )  # fmt: skip
        thread = threading.Thread(target=_hog, args=(stop,), daemon=True)
        if hog:
            sys.setswitchinterval(0.03)
            thread.start()
        try:
            res = run_bench(bench, console=Console(file=io.StringIO()))
        finally:
            stop.set()
            if hog:
                thread.join(5)
            sys.setswitchinterval(old)
    return res


def _graded(res) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request with the server's whole log: (error low, error high, bound), seconds."""
    lo, hi, bound = [], [], []
    for r in good_records(res.records):
        x = r.extra
        if "t_first_written_ns" not in x:  # its first chunk was held back or was its last
            continue
        stamp = x["server_send_ns"][0] + round(x["recv_minus_send_s"][0] * 1e9)
        send_err = (x["t_recv_ns"] - x["sent_ns"]) / 1e9  # upload: the request's own stamp
        lo.append((stamp - x["t_first_written_ns"]) / 1e9 + send_err)
        hi.append(r.ttft_s - (x["server_send_ns"][0] - x["t_recv_ns"]) / 1e9)
        bound.append(x["stamp_bound_s"])
    return np.asarray(lo), np.asarray(hi), np.asarray(bound)


def _check(res, merged_at_least: int) -> None:
    lo, hi, bound = _graded(res)
    assert len(lo) >= 50
    over = np.flatnonzero(lo > bound + CLOCK_SLACK_S)
    assert not over.size, [(lo[i], hi[i], bound[i]) for i in over[:5]]
    # not vacuous: first tokens were stamped late (their reads merged) and were bounded
    late = int(np.sum(lo > 0.004))
    assert late >= merged_at_least, f"only {late} first tokens stamped > 4 ms late: no stall"
    # the worker's bound (the p99 of the requests' bounds) covers the p99 error
    (w,) = res.summary["client"]["workers"]
    assert w["timing_bound_s"] + CLOCK_SLACK_S >= np.percentile(lo, 99)
    assert w["stall"] is not None  # and says which resource ran out


# Not in the default run: whether 512 streams overload the loop depends on the machine (a
# clean CI clone on a quiet 2-core host had 1 first token stamped late, and this test's own
# guard failed). The default cover of the same bound: the next test, whose stalls are made.
@pytest.mark.slow
def test_a_loop_too_busy_to_read_on_time_stays_within_each_requests_bound():
    _check(_run(512, 0.01, 3.0, hog=False), merged_at_least=5)


def test_a_loop_stalled_by_a_thread_stays_within_each_requests_bound():
    # 32 streams for 4 s: the 30 ms holds leave ~50-80 graded requests at 16 streams for 3 s
    _check(_run(32, 0.004, 4.0, hog=True), merged_at_least=5)
