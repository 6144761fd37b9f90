"""`workload show/convert`: arrival flags the chosen kind does not use are refused in one line,
and --time-scale / --target-rate alone replay the trace (both were silently ignored: a convert
"20x faster" wrote the trace's own times)."""

from __future__ import annotations

import json

import pytest
from cbbench.harness.cli import main

ROWS = [
    ("2023-11-16 18:15:46.0000000", 10, 5),
    ("2023-11-16 18:15:50.0000000", 20, 6),
    ("2023-11-16 18:15:56.0000000", 30, 7),
]


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "azure.csv"
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"] + [",".join(map(str, r)) for r in ROWS]
    path.write_text("\n".join(lines) + "\n")
    return path


def _arrivals(path):
    return [json.loads(line)["arrival_s"] for line in path.read_text().splitlines()[1:]]


def test_time_scale_alone_replays_faster(trace, tmp_path):
    out = tmp_path / "fast.jsonl"
    assert main(["workload", "convert", str(trace), "-o", str(out), "--time-scale", "20"]) == 0
    assert _arrivals(out) == pytest.approx([0.0, 0.2, 0.5])


def test_target_rate_alone_replays_at_that_rate(trace, capsys):
    assert main(["workload", "show", str(trace), "--target-rate", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mean_rate"] == pytest.approx(2.0)


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--rate", "3"], "--rate has no effect with no --arrival"),
        (["--ramp-up", "5"], "--ramp-up has no effect with no --arrival"),
        (
            ["--arrival", "poisson", "--rate", "3", "--time-scale", "2"],
            "--time-scale has no effect",
        ),
        (["--arrival", "replay", "--rate", "3"], "--rate has no effect with --arrival replay"),
        (["--arrival", "poisson", "--rate", "3", "--burstiness", "0.5"], "needs --arrival gamma"),
    ],
)
def test_unused_arrival_flag_is_refused(trace, tmp_path, capsys, flags, named):
    out = tmp_path / "x.jsonl"
    for action in (["show"], ["convert", "-o", str(out)]):
        assert main(["workload", *action, str(trace), *flags]) == 2
        assert named in capsys.readouterr().err
    assert not out.exists()


def test_show_names_the_burstiness_that_reproduces_the_gaps(trace, capsys):
    """`show` printed "burstiness (CV of gaps): 3.03" for Mooncake, which bench's --burstiness
    (the gamma shape, 1/CV²) reads as far smoother than Poisson."""
    assert main(["workload", "show", str(trace)]) == 0
    out = capsys.readouterr().out
    gaps = [4.0, 6.0]
    cv = (sum((g - 5.0) ** 2 for g in gaps) / 2) ** 0.5 / 5.0  # 0.2
    assert f"CV of gaps: {cv:.3f} = --burstiness {1 / cv**2:.3g}" in out
    assert "burstiness (CV" not in out
