"""requests.jsonl under load: a line is flushed at once unless one was flushed less than
RECORD_FLUSH_S ago; the lines held back go out with the next record past that, the next
telemetry sample, `flush` or `close` (harness/results/run_folder.py)."""

from __future__ import annotations

import json
import time

from cbbench.harness.results.records import RequestRecord
from cbbench.harness.results.run_folder import (
    RECORD_FLUSH_S,
    REQUESTS_FILE,
    JsonlAppender,
    RunWriter,
)


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_burst_is_held_back_at_most_the_delay(tmp_path):
    path = tmp_path / "a.jsonl"
    app = JsonlAppender(path, max_delay_s=60.0)  # a delay no test run outlasts
    app.write({"n": 0})
    assert _lines(path) == [{"n": 0}]  # nothing flushed before: out at once
    app.write({"n": 1})
    app.write({"n": 2})
    assert _lines(path) == [{"n": 0}]  # within the delay: held back
    app.flush()
    assert [x["n"] for x in _lines(path)] == [0, 1, 2]
    app.write({"n": 3})
    app.close()
    assert [x["n"] for x in _lines(path)] == [0, 1, 2, 3]


def test_a_record_past_the_delay_takes_the_held_ones_out(tmp_path):
    path = tmp_path / "a.jsonl"
    app = JsonlAppender(path, max_delay_s=0.05)
    app.write({"n": 0})
    app.write({"n": 1})
    assert len(_lines(path)) == 1
    time.sleep(0.06)
    app.write({"n": 2})
    assert [x["n"] for x in _lines(path)] == [0, 1, 2]
    app.close()


def test_without_a_delay_every_line_is_flushed(tmp_path):
    path = tmp_path / "a.jsonl"
    app = JsonlAppender(path)
    for i in range(3):
        app.write({"n": i, "text": "é"})
        assert len(_lines(path)) == i + 1
    app.close()
    assert _lines(path)[0]["text"] == "é"


def test_run_writer_flushes_records_with_each_sample(tmp_path):
    assert 0 < RECORD_FLUSH_S <= 0.05
    w = RunWriter(tmp_path / "run")
    recs = [RequestRecord(id=f"r{i}", index=i, prompt_len=1, output_len=1) for i in range(3)]
    for r in recs:
        w.add_record(r)
    path = tmp_path / "run" / REQUESTS_FILE
    held = len(_lines(path))
    assert 1 <= held <= 3
    w.add_sample({"t_s": 0.0, "source": "client"})
    assert [x["id"] for x in _lines(path)] == ["r0", "r1", "r2"]
    w.close()
