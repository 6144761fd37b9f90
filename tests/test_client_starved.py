"""The client-bound flag fires before the timing error passes 5 ms: starve the client (a
thread that holds the GIL for 8 ms at a time) and stamp arrivals in user space, where loop
delay becomes timing error; the run must say the client set the pace."""

import sys
import threading
import time

from cbbench.harness.cli.selftest import ServerProcess
from cbbench.harness.servers.fake_server import Behavior, FakeServerConfig
from cbbench.harness.studies.selftest import measure


def _hog(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(10_000))  # pure Python: keeps the GIL until the switch interval ends


def test_starved_client_is_flagged_before_errors_pass_5_ms():
    cfg = FakeServerConfig(Behavior(itl_s=0.005, queue_time_s=None))
    stop = threading.Event()
    old = sys.getswitchinterval()
    with ServerProcess(cfg) as srv:
        sys.setswitchinterval(0.008)
        hog = threading.Thread(target=_hog, args=(stop,), daemon=True)
        hog.start()
        try:
            m = measure(srv.url, 8, 1, 20, 10_000, 2.5, kernel_timestamps=False, prewarm=True)
        finally:
            stop.set()
            hog.join(5)
            sys.setswitchinterval(old)
            time.sleep(0)
    assert m["failed"] == 0 and m["requests"] > 0
    assert m["chunk_error_ms_p99"] > 5, m  # the starvation worked: errors past 5 ms
    assert m["client_bound"], m
    assert "event-loop lag" in m["client_bound_reason"]
