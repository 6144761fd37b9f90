"""Optional accelerators (orjson, uvloop) stay optional: the pure-Python path gives the same
results, and the event-loop choice is honoured."""

import asyncio
import json
import time

import numpy as np
import pytest
from cbbench.harness.client import aio, response
from cbbench.harness.client.api import ClientConfig, OpenAIClient
from cbbench.harness.results import run_folder as results
from cbbench.harness.results.records import RequestRecord
from servers.fake import Behavior, FakeServerConfig, threaded


def _send(url: str) -> RequestRecord:
    async def go() -> RequestRecord:
        client = OpenAIClient(ClientConfig(base_url=url, model="m"), time.monotonic_ns())
        rec = RequestRecord(id="cbb-1", index=1, prompt_len=3, output_len=6)
        try:
            return await client.send(rec, [1, 2, 3])
        finally:
            await client.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize("pure", [True, False])
def test_stdlib_json_path_gives_the_same_record(pure):
    response.use_stdlib_json(pure)
    try:
        assert (response.parse_json is response._parse_json_std) == pure
        with threaded(FakeServerConfig(Behavior(tokens_per_chunk=2))) as srv:
            r = _send(srv.url)
    finally:
        response.use_stdlib_json(False)
    assert r.ok, r.error
    assert r.output_tokens_client == r.output_tokens_server == 6
    assert len(r.token_times_s) == 6 and r.prompt_tokens_server == 3


def test_record_lines_agree_with_and_without_orjson():
    rec = {"a": np.float64(0.25), "b": [1.5, 3], "c": None, "d": "x\u00e9\ud800", "e": {}}
    assert json.loads(results._json_line(rec)) == json.loads(results._json_line_std(rec))
    assert results._json_line(rec).endswith("\n")
    assert json.loads(results._json_line({"n": np.int64(3)})) == {"n": 3}


def test_event_loop_choice(monkeypatch):
    async def which() -> str:
        return type(asyncio.get_running_loop()).__module__

    monkeypatch.setenv("CBBENCH_NO_UVLOOP", "1")
    assert aio.loop_name() == "asyncio"
    assert aio.run(which()).startswith("asyncio")
    monkeypatch.delenv("CBBENCH_NO_UVLOOP")
    if aio.loop_name() == "uvloop":  # installed (the `fast` extra)
        assert aio.run(which()).startswith("uvloop")
    assert aio.loop_name(use_uvloop=False) == "asyncio"


def test_open_loop_never_sends_before_the_schedule(tmp_path):
    """uvloop's timers work in whole milliseconds and may fire a little early: a scheduled
    request still goes out at or after its arrival time."""
    import io

    from cbbench.harness.load.runner import BenchConfig, run_bench
    from cbbench.workloads.spec import RequestSpec, Workload
    from rich.console import Console

    specs = tuple(RequestSpec(i, 4, 2, arrival_s=0.0137 * i + 0.0004) for i in range(60))
    wl = Workload("t", 0, specs)
    assert wl.open_loop
    with threaded(FakeServerConfig(Behavior())) as srv:
        cfg = BenchConfig(base_url=srv.url, workload=wl, out_dir=tmp_path / "run", live=False)
        res = run_bench(cfg, console=Console(file=io.StringIO()))
    recs = [r for r in res.records if r.ok]
    assert len(recs) == 60
    early = [r.scheduled_s - r.sent_s for r in recs if r.sent_s < r.scheduled_s]
    assert not early, f"{len(early)} sent early, by up to {max(early) * 1e3:.3f} ms"
