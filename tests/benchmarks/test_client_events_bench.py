"""The response handler per read: one read of 16 common SSE events (the fake server's own
chunks, one token id and a t_send_ns each), counted by `Response.data` on each decode path,
side by side in one run (pytest-benchmark; skipped by the default run).

Run: python -m pytest tests/benchmarks/test_client_events_bench.py --benchmark-only
The table's mean is µs per read; `msgspec` is the typed decode of fast_events.py (orjson
behind it for the other events), `orjson` the path before it, `stdlib` neither accelerator.
"""

from __future__ import annotations

import json

import pytest
from cbbench.harness.client import fast_events, response
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.servers.fake_server import _chunk

EVENTS = 16
HEAD = json.dumps(_chunk("text_completion", False, False, 1, True, None))[:-1].encode()
READ = b"".join(b'data: %s, "t_send_ns": %d}\n\n' % (HEAD, 10**18 + i) for i in range(EVENTS))


@pytest.mark.parametrize("path", ["msgspec", "orjson", "stdlib"])
def test_one_read_of_16_common_events(benchmark, path):
    response.use_stdlib_json(path == "stdlib")
    response.count_common = fast_events.count_common if path == "msgspec" else None

    def fresh():
        r = response.Response(
            RequestRecord(id="b", index=0, prompt_len=1, output_len=1), True, True
        )
        r.status = 200
        return (r,), {}

    def read(r: response.Response) -> response.Response:
        r.data(READ, 1)
        return r

    try:
        r = benchmark.pedantic(read, setup=fresh, rounds=3000, iterations=1, warmup_rounds=50)
    finally:
        response.use_stdlib_json(False)
    assert r.state["ids_total"] == EVENTS and r.chunks == [(1, EVENTS)]
    assert [ts for _, ts in r.sends] == [10**18 + i for i in range(EVENTS)]
