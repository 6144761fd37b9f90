"""`cbbench locust` counts requests as Locust requests (issue 42, finding 16): one LLM request
is one Locust request (its E2E), so the header RPS and the Aggregated row count requests;
TTFT, TPOT and per-token ITL rows sit beside it without being counted as requests.

Locust monkey-patches the process it is imported in (gevent), so the check runs in a child
process, as `cbbench locust` itself does."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import json
from locust.env import Environment
from cbbench.harness.locust.user import REQUEST_TYPE, report_to_locust
from cbbench.harness.results.records import RequestRecord

def rec(i, ok=True):
    return RequestRecord(
        id=f"cbb-{i}", index=i, prompt_len=32, output_len=100, sent_s=0.0, end_s=1.0,
        ttft_s=0.02, tpot_s=0.01, e2e_s=1.0, itl_s=[0.01] * 99, output_tokens_server=100,
        status="ok" if ok else "error", error=None if ok else "HTTP 500: boom",
        error_kind=None if ok else "http_5xx")

env = Environment(events=None)
env.create_local_runner()  # its listener logs fired requests into env.stats
seen = []
env.events.request.add_listener(lambda name, **kw: seen.append(name))
for i in range(199):
    report_to_locust(env, rec(i))
report_to_locust(env, rec(199, ok=False))
get = lambda name: env.stats.get(name, REQUEST_TYPE)
print(json.dumps({
    "total": env.stats.total.num_requests, "failures": env.stats.total.num_failures,
    "seen": sorted(set(seen)), "n_seen": len(seen), "e2e": get("E2E").num_requests,
    "ttft": get("TTFT").num_requests, "itl": get("ITL").num_requests,
    "itl_ms": get("ITL").avg_response_time,
    "rows": sorted(n for n, _ in env.stats.entries),
}))
env.runner.quit()
"""


def test_two_hundred_requests_are_two_hundred_locust_requests() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["total"] == 200 and got["failures"] == 1  # not 200 x 100 token gaps
    assert got["seen"] == ["E2E"] and got["n_seen"] == 200  # listeners see requests only
    assert got["e2e"] == 200 and got["ttft"] == 199
    assert got["itl"] == 199 * 99 and got["itl_ms"] == 10.0  # ITL still has its row
    assert got["rows"] == ["E2E", "ITL", "TPOT", "TTFT"]
