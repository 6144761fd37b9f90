"""Workloads past what memory holds (issue 20): `load_workload` refuses more than
MAX_REQUESTS in one line; `workload show` of a synthetic spec streams its summary in bounded
memory and gets the same numbers as the built workload."""

from __future__ import annotations

import json
import tracemalloc

import pytest
from cbbench.harness.cli import main
from cbbench.workloads import WorkloadError, load_workload, summarize_workload
from cbbench.workloads.presets import PRESETS
from cbbench.workloads.stream import MAX_REQUESTS, STREAM_ABOVE, streamable, summarize_streamed

MIXTURE = {
    "mixture": [
        {"weight": 3, "prompt": {"dist": "lognormal", "median": 100, "sigma": 0.8},
         "output": {"dist": "uniform", "min": 1, "max": 300}},
        {"weight": 1, "prompt": {"dist": "normal", "mean": 500, "std": 50},
         "output": {"dist": "zipf", "a": 1.5, "scale": 4, "max": 5000}},
        {"weight": 1, "prompt": 64, "output": {"dist": "exponential", "mean": 40}},
    ]
}  # fmt: skip


def _close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == pytest.approx(b[k], rel=1e-12, abs=1e-9), k


@pytest.mark.parametrize("name", ["mixed", "heavy-mixed", "mixture"])
def test_streamed_summary_equals_the_built_workload(name, tmp_path):
    n = 30_000
    if name == "mixture":
        path = tmp_path / "mix.json"
        path.write_text(json.dumps(MIXTURE))
        spec, built = MIXTURE, load_workload(path, seed=5, num_requests=n)
    else:
        spec, built = PRESETS[name].spec, load_workload(name, seed=5, num_requests=n)
    assert streamable(spec)
    streamed, _ = summarize_streamed(spec, name, 5, n, chunk=4096)  # many chunks
    want = summarize_workload(built)
    assert streamed["count"] == want["count"] == n
    for key in ("prompt_len", "output_len"):
        _close(streamed[key], want[key])


def test_sequence_and_session_specs_are_not_streamed():
    assert not streamable({"prompt": {"dist": "sequence", "values": [1, 2]}, "output": 3})
    assert not streamable({"prompt": 5, "output": 3, "session": {"turns": 2}})
    assert not streamable({"prompt": 5, "output": 3, "arrival": {"kind": "poisson", "rate": 1}})


def test_streamed_summary_memory_is_bounded():
    # 2M requests built would be ~700 MB of RequestSpecs; streamed, one chunk's worth.
    tracemalloc.start()
    try:
        summary, counts = summarize_streamed(PRESETS["mixed"].spec, "mixed", 0, 2_000_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert summary["count"] == counts.total == 2_000_000
    assert peak < 32 * 2**20, f"peak {peak / 2**20:.1f} MiB"


def test_workload_show_streams_past_the_threshold(capsys):
    n = STREAM_ABOVE + 1
    assert main(["workload", "show", "mixed", "--num-requests", str(n), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["streamed"] and summary["count"] == n
    assert summary["output_len"]["min"] >= 10 and summary["output_len"]["max"] <= 1000


@pytest.mark.parametrize(
    "argv",
    [
        ["workload", "show", "mixed", "--num-requests", "100000000", "--arrival", "poisson",
         "--rate", "5"],
        ["workload", "convert", "mixed", "--num-requests", "100000000", "-o", "x.jsonl"],
    ],
)  # fmt: skip
def test_too_many_requests_to_build_is_one_line(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "100,000,000 requests is more than the" in err
    assert not (tmp_path / "x.jsonl").exists()
    with pytest.raises(WorkloadError, match="--duration"):
        load_workload("mixed", num_requests=MAX_REQUESTS + 1)
