"""`cbbench bench` says "stopped early" only when the stop held requests back: a run whose
every request was already sent when its first five answers were the same client error
finished (with failures) and says so (issue f1, item 1)."""

from __future__ import annotations

import sys

from cbbench.harness.cli import main
from cbbench.harness.results.outcome import EXIT_FAILED, FirstFailures
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.run_folder import load_run
from server_support import serve
from servers.fake import Behavior, FakeServerConfig, threaded


def bench(url: str, out, *extra: str) -> list[str]:
    return [
        "bench", "--base-url", url, "--out", str(out), "--no-live", "--no-server-metrics",
        "--no-gpu-metrics", "--workload", "seed-demo", *extra,
    ]  # fmt: skip


def run(argv: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["cbbench", *argv])
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_every_request_sent_is_not_stopped_early(tmp_path, monkeypatch, capsys):
    # a wrong --model on the tiny engine, 5 requests: all 5 were sent and answered 400; the
    # line said "stopped early" though nothing was held back
    with serve() as (url, _):
        rc, _, err = run(bench(url, tmp_path / "r", "--model", "gpt-4", "--num-requests", "5"),
                         monkeypatch, capsys)  # fmt: skip
    assert rc == EXIT_FAILED
    assert "stopped early" not in err
    assert "all 5 requests failed: HTTP 404: model 'gpt-4' is not served here" in err
    summary = load_run(tmp_path / "r").meta["summary"]
    assert "stopped_early" not in summary and summary["counts"]["failed"] == 5


def test_a_stop_that_held_requests_back_says_how_many(tmp_path, monkeypatch, capsys):
    with threaded(FakeServerConfig(Behavior(status=404))) as srv:
        argv = bench(srv.url, tmp_path / "r", "--workload", "mixed", "--num-requests", "60",
                     "--rate", "20", "--seed", "1")  # fmt: skip
        rc, _, err = run(argv, monkeypatch, capsys)
    assert rc == EXIT_FAILED
    summary = load_run(tmp_path / "r").meta["summary"]
    held = 60 - summary["counts"]["total"] - summary["cancelled_in_flight"]
    assert held > 0 and f"stopped early ({held} never sent" in err, err
    assert summary["stopped_early"].startswith(f"stopped early ({held} never sent")


def rec(i: int) -> RequestRecord:
    return RequestRecord(
        id=str(i), index=i, prompt_len=4, output_len=4, sent_s=0.0, status="error",
        error_kind="http_4xx", error="HTTP 400: bad model",
    )  # fmt: skip


def test_held_back_names_what_was_held_back():
    first = FirstFailures(5)
    for i in range(5):
        first.add(rec(i))
    assert first.verdict is not None  # the stop was asked for
    assert first.held_back(0, 0) is None  # but nothing was held back
    line = first.held_back(3, 2)
    assert line and line.startswith("stopped early (3 never sent, 2 cancelled in flight): ")
    assert line.endswith("HTTP 400: bad model")
    assert first.held_back(0, 1).startswith("stopped early (1 cancelled in flight): ")


def test_a_closed_loop_stops_on_a_repeated_client_error_as_the_open_loop_does(
    tmp_path, monkeypatch, capsys
):
    # r51 finding 3: `--concurrency 2` against a server answering 404 in a millisecond sent
    # all 30 requests before the stop was polled, and run.json said "complete"
    with threaded(FakeServerConfig(Behavior(status=404))) as srv:
        argv = bench(srv.url, tmp_path / "r", "--workload", "mixed", "--num-requests", "60",
                     "--concurrency", "2", "--seed", "1")  # fmt: skip
        rc, _, err = run(argv, monkeypatch, capsys)
    assert rc == EXIT_FAILED
    meta = load_run(tmp_path / "r").meta
    summary = meta["summary"]
    held = 60 - summary["counts"]["total"] - summary["cancelled_in_flight"]
    assert held >= 50 and f"stopped early ({held} never sent" in err, err
    assert meta["status"] == "stopped-early"
