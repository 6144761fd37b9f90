"""Connection set-up apart from TTFT (prewarm, connect_s, counts) and kernel receive timestamps
on the raw transport, against the scripted server on 127.0.0.1."""

import asyncio
import io
import json
import logging
import time

import pytest
from cbbench.harness.client import http1
from cbbench.harness.client.api import ClientConfig, OpenAIClient
from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.results.records import RequestRecord
from cbbench.workloads.spec import RequestSpec, Workload
from rich.console import Console
from servers.fake import Behavior, FakeServerConfig, threaded

KERNEL = http1.kernel_timestamps_supported() is None


def _bench(url, tmp_path, n=12, concurrency=4, **kw):
    wl = Workload("t", 0, tuple(RequestSpec(i, 4, 3) for i in range(n)))
    cfg = BenchConfig(
        base_url=url, workload=wl, concurrency=concurrency, out_dir=tmp_path / "run", live=False
    )
    for k, v in kw.items():
        setattr(cfg, k, v)
    return run_bench(cfg, console=Console(file=io.StringIO(), width=200))


def test_prewarmed_pool_opens_every_connection_before_t0(tmp_path):
    with threaded(FakeServerConfig(Behavior(itl_s=0.005))) as srv:
        res = _bench(srv.url, tmp_path)
        assert srv.server.connections == 1 + 4  # the /v1/models probe, then the pool
    c = res.summary["connections"]
    assert c["opened"] == 4 and c["prewarmed"] == 4
    assert c["requests_on_new_connection"] == 0 and c["connect_s"]["count"] == 0
    assert c["reused"] == 12 - 4 and c["closed_by_server"] == 0
    assert all(r.ok and r.connect_s is None for r in res.records)
    assert sum(r.conn_reused for r in res.records) == 8
    run = json.loads((res.run_dir / "run.json").read_text())
    assert run["load"]["prewarm"] is True
    assert run["timestamp_source"] == ("kernel" if KERNEL else "user")
    assert run["summary"]["connections"]["opened"] == 4


def test_no_prewarm_reports_each_cold_connection_apart_from_ttft(tmp_path):
    with threaded(FakeServerConfig(Behavior(itl_s=0.005))) as srv:
        res = _bench(srv.url, tmp_path, prewarm=False)
    c = res.summary["connections"]
    assert c["opened"] == 4 and c["prewarmed"] == 0
    cold = [r for r in res.records if r.connect_s is not None]
    assert len(cold) == c["requests_on_new_connection"] == 4
    assert all(not r.conn_reused for r in cold)
    for r in cold:  # sent after the connection was up: set-up is before sent_s, not in TTFT
        assert r.connect_s > 0 and r.sent_s - r.ready_s >= r.connect_s
        assert r.send_lag_s == pytest.approx(r.sent_s - r.ready_s - r.connect_s)
    assert c["connect_s"]["count"] == 4


def test_unsupported_kernel_timestamps_fall_back_with_one_warning(monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(http1, "kernel_timestamps_supported", lambda: "not here (test)")
    monkeypatch.setattr(http1, "_warned", False)
    caplog.set_level(logging.WARNING, logger="cbbench")
    with threaded(FakeServerConfig(Behavior())) as srv:
        res = _bench(srv.url, tmp_path, n=6, concurrency=2)
        http1.H1Pool(srv.url)  # a second pool: no second warning
    warned = [r.getMessage() for r in caplog.records if "kernel receive timestamps" in r.message]
    assert len(warned) == 1 and "not here (test)" in warned[0]
    assert all(r.ok for r in res.records)
    assert json.loads((res.run_dir / "run.json").read_text())["timestamp_source"] == "user"


async def _first_token_while_the_loop_is_blocked(url: str, kernel: bool) -> RequestRecord:
    """The server answers after 0.1 s; the client's event loop is blocked from 0.05 s to
    0.3 s, so the bytes wait in the socket for ~0.2 s before anyone reads them."""
    cfg = ClientConfig(base_url=url, model="m", kernel_timestamps=kernel)
    client = OpenAIClient(cfg, time.monotonic_ns())
    await client.pool.prewarm(1)
    await asyncio.sleep(0.05)  # the kernel turns receive stamping on a moment after it's asked
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, time.sleep, 0.25)
    rec = RequestRecord(id="cbb-1", index=1, prompt_len=2, output_len=2)
    try:
        await client.send(rec, [1, 2])
    finally:
        await client.aclose()
    assert client.pool.timestamp_source == ("kernel" if kernel else "user"), client.pool.stats
    return rec


@pytest.mark.skipif(not KERNEL, reason="SO_TIMESTAMPNS: Linux on a 64-bit generic-ABI CPU")
def test_kernel_stamps_leave_event_loop_queueing_out_of_ttft():
    with threaded(FakeServerConfig(Behavior(ttft_s=0.1, itl_s=0.0))) as srv:
        kernel = asyncio.run(_first_token_while_the_loop_is_blocked(srv.url, True))
        user = asyncio.run(_first_token_while_the_loop_is_blocked(srv.url, False))
    assert kernel.ok and user.ok
    assert 0.1 <= kernel.ttft_s < 0.2  # when the bytes came in
    assert user.ttft_s >= 0.28  # when the blocked loop got to them


def test_bench_flags_reach_the_config():
    from cbbench.harness.cli import build_parser
    from cbbench.harness.cli.bench import config_from_args

    base = ["bench", "--base-url", "http://127.0.0.1:9", "--workload", "seed-demo"]
    on = config_from_args(build_parser().parse_args(base))
    off = config_from_args(build_parser().parse_args([*base, "--no-prewarm", "--user-timestamps"]))
    assert (on.prewarm, on.kernel_timestamps) == (True, True)
    assert (off.prewarm, off.kernel_timestamps) == (False, False)
