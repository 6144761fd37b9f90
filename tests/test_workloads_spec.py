"""Presets, spec files (TOML/JSON) and the `cbbench workload` CLI."""

from __future__ import annotations

import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from cbbench.harness.cli import main
from cbbench.workloads import PRESETS, load_workload, summarize_workload

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"


def test_seed_demo_is_the_seed_scenario():
    wl = load_workload("seed-demo")
    assert [r.output_len for r in wl.requests] == [10, 5, 8, 3, 12, 6]
    assert len({r.prompt_len for r in wl.requests}) == 1
    assert not wl.open_loop and not PRESETS["seed-demo"].has_arrivals
    assert [r.output_len for r in load_workload("seed-demo", num_requests=8).requests][6:] == [
        10,
        5,
    ]


@pytest.mark.parametrize(
    ("name", "lo", "hi"), [("uniform", 256, 256), ("mixed", 10, 1000), ("heavy-mixed", 1, 4000)]
)
def test_synthetic_presets_output_ranges(name, lo, hi):
    wl = load_workload(name)
    out = np.asarray([r.output_len for r in wl.requests])
    assert len(wl) == 200 and not wl.open_loop
    assert out.min() >= lo and out.max() <= hi
    if lo != hi:  # uniform over the range: the spread covers most of it
        assert out.max() - out.min() > 0.8 * (hi - lo)


def test_chat_preset_short_prompts_lognormal_outputs():
    wl = load_workload("chat", num_requests=4000)
    prompt = np.asarray([r.prompt_len for r in wl.requests])
    out = np.log([r.output_len for r in wl.requests])
    assert np.median(prompt) < 100
    assert np.median(out) == pytest.approx(np.log(160), abs=0.08)
    assert out.std() == pytest.approx(0.8, abs=0.06)  # lightly clipped at 8 and 2048


def readme_toml() -> str:
    section = (ROOT / "docs" / "workloads.md").read_text()
    return re.search(r"```toml\n(.*?)```", section, re.S).group(1)


def test_readme_spec_example_loads(tmp_path):
    path = tmp_path / "spec.toml"
    path.write_text(readme_toml())
    wl = load_workload(str(path))
    assert len(wl) == 500 and wl.seed == 7 and wl.open_loop
    s = summarize_workload(wl)
    assert s["mean_rate"] == pytest.approx(4.0, rel=0.15)
    assert {r.priority for r in wl.requests} <= {0, 1, 2}
    assert all(r.prefix_ids for r in wl.requests)
    assert wl.source["spec"]["arrival"] == {"kind": "poisson", "rate": 4.0}
    # Explicit arguments override the file's seed and count; the request set is a prefix.
    assert load_workload(str(path), seed=7, num_requests=50).requests == wl.requests[:50]
    assert load_workload(str(path), seed=8, num_requests=50).requests != wl.requests[:50]


def test_json_spec_equals_toml_spec(tmp_path):
    spec = {
        "num_requests": 40,
        "prompt": {"dist": "normal", "mean": 500, "std": 100, "min": 1, "max": 900},
        "output": {"dist": "zipf", "a": 1.5, "scale": 10, "max": 2000},
    }
    (tmp_path / "s.json").write_text(json.dumps(spec))
    (tmp_path / "s.toml").write_text(
        "num_requests = 40\n"
        'prompt = {dist = "normal", mean = 500, std = 100, min = 1, max = 900}\n'
        'output = {dist = "zipf", a = 1.5, scale = 10, max = 2000}\n'
    )
    a, b = load_workload(str(tmp_path / "s.json")), load_workload(str(tmp_path / "s.toml"))
    assert a.requests == b.requests and len(a) == 40


def test_spec_file_trace_with_relative_path_and_replay(tmp_path):
    shutil.copy(TRACES / "azure_llm_2023_conv.csv", tmp_path / "azure.csv")
    (tmp_path / "spec.toml").write_text(
        'num_requests = 1000\ntrace = {path = "azure.csv"}\narrival = {kind = "replay", time_scale = 4.0}\n'
    )
    wl = load_workload(str(tmp_path / "spec.toml"))
    base = load_workload("azure-conv", num_requests=1000)
    assert [r.arrival_s for r in wl.requests] == pytest.approx(
        [r.arrival_s / 4 for r in base.requests]
    )
    assert [r.prompt_len for r in wl.requests] == [r.prompt_len for r in base.requests]
    # A trace preset named inside a spec file.
    (tmp_path / "p.json").write_text(json.dumps({"trace": "mooncake-conv", "num_requests": 3}))
    assert (
        load_workload(str(tmp_path / "p.json")).requests
        == load_workload("mooncake-conv", num_requests=3).requests
    )


def test_cli_convert_round_trips(tmp_path, capsys):
    out = tmp_path / "mixed.jsonl"
    assert (
        main(
            ["workload", "convert", "mixed", "--seed", "3", "--num-requests", "25", "-o", str(out)]
        )
        == 0
    )
    assert "wrote 25 requests" in capsys.readouterr().out
    header = json.loads(out.read_text().splitlines()[0])
    assert header["cbbench_workload"] == 1 and header["seed"] == 3
    assert load_workload(str(out)) == load_workload("mixed", seed=3, num_requests=25)


def test_cli_show_with_arrival_flags(capsys):
    argv = ["workload", "show", "seed-demo", "--num-requests", "2000", "--arrival", "gamma"]
    assert main([*argv, "--rate", "5", "--cv", "2", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["count"] == 2000 and s["open_loop"]
    assert s["mean_rate"] == pytest.approx(5, rel=0.2)
    assert s["burstiness"] == pytest.approx(2, rel=0.2)
    assert main(["workload", "show", "seed-demo"]) == 0
    text = capsys.readouterr().out
    assert "requests: 6" in text and "closed loop" in text and "output length histogram" in text


def test_cli_list_names_every_preset(capsys):
    assert main(["workload", "list"]) == 0
    out = capsys.readouterr().out
    for name in PRESETS:
        assert name in out


def test_empirical_trace_path_is_relative_to_the_spec_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "t.jsonl").write_text(
        "".join(json.dumps({"prompt_len": 1, "output_len": n}) + "\n" for n in (7, 70, 700))
    )
    output = {"dist": "empirical", "trace": "t.jsonl", "column": "output"}
    (tmp_path / "sub" / "s.json").write_text(json.dumps({"prompt": 5, "output": output}))
    wl = load_workload(str(tmp_path / "sub" / "s.json"))
    assert len(wl) == 200
    assert {r.output_len for r in wl.requests} == {7, 70, 700}
    assert wl.source["spec"]["output"]["trace"] == "t.jsonl"  # the spec as given


@pytest.mark.parametrize("bins", [1, 7, 16, 5000])
def test_histogram_bins_cover_every_length_once(bins):
    from cbbench.harness.cli.workload import histogram
    from rich.console import Console

    values = np.asarray([r.output_len for r in load_workload("chat").requests])
    console = Console(record=True, width=120, file=io.StringIO())
    console.print(histogram(values, bins))
    rows = re.findall(r"^\s*([\d,]+)(?:-([\d,]+))?\s+([\d,]+)", console.export_text(), re.M)
    num = lambda s: int(s.replace(",", ""))  # noqa: E731
    spans = [(num(a), num(b or a), num(c)) for a, b, c in rows]
    assert spans[0][0] == values.min() and spans[-1][1] == values.max()
    assert all(nxt[0] == cur[1] + 1 for cur, nxt in zip(spans, spans[1:], strict=False))
    assert sum(c for _, _, c in spans) == len(values)
    for lo, hi, c in spans:
        assert c == ((values >= lo) & (values <= hi)).sum()
