"""Tables stay readable when piped and land in the run folder (issue 13): `sweep` prints its
levels as a Markdown table when its output is not a terminal and writes sweep.md into the
sweep folder; `calibrate` writes its fit table beside its JSON."""

from __future__ import annotations

import json

from cbbench.harness.cli import main
from cbbench.harness.sweep.runner import SWEEP_TABLE, print_sweep


def _index() -> dict:
    level = {"load": "rate 12.5/s (a long level name)", "request_throughput": 12.25,
             "output_throughput": 1530.0, "ttft_p50_s": 0.0421, "ttft_p99_s": 0.25,
             "stopped_early": "saturated: queue grew"}  # fmt: skip
    return {
        "mode": "rates",
        "status": "done",
        "levels": [
            level,
            {**level, "load": "rate 25/s", "ttft_p99_s": None, "stopped_early": None},
        ],
        "saturation": {"max_sustained_rate": 12.5, "max_request_throughput": 12.25},
    }


def test_sweep_table_is_markdown_when_piped_and_written_to_the_folder(tmp_path, capsys):
    path = print_sweep(_index(), tmp_path)
    err = capsys.readouterr().out  # the table is the command's output: stdout (issue 42)
    row = "| rate 12.5/s (a long level name) | 12.25 | 1530.0 | 42.1 | 250.0 |  | saturated: queue grew |"
    assert row in err  # names whole, one line per level
    assert "| rate 25/s |" in err
    assert path == tmp_path / SWEEP_TABLE
    assert row in path.read_text()
    assert "highest sustained rate 12.5 req/s" in err


def test_sweep_table_without_a_folder_writes_nothing(tmp_path, capsys):
    assert print_sweep(_index()) is None
    assert list(tmp_path.iterdir()) == []


def test_calibrate_writes_its_table_beside_the_json(tmp_path, capsys):
    out = tmp_path / "fits" / "grid.json"
    out.parent.mkdir()
    argv = ["calibrate", "--model", "tiny", "--batch-sizes", "1", "--context-lens", "16",
            "--prefill-lens", "16,32", "--repeats", "1", "--min-time", "0", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    table = (tmp_path / "fits" / "grid.md").read_text()
    assert "| decode only | 1 |" in table and "| with a prefill | 2 |" in table
    assert "| decode only | 1 |" in printed  # piped: the same Markdown on stdout
    assert json.loads(out.read_text())["fit"]["points"] == 3
