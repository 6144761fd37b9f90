"""Every malformed-row kind gives one clear error naming file:line; bad specs name the key."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from cbbench.harness.cli import main
from cbbench.workloads import WorkloadError, load_workload

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
AZURE_OK = "2023-11-16 18:15:46.6805900,374,44\n"
BURST_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
BURST_OK = "5,ChatGPT,472,18,490,Conversation log\n"


def mooncake_line(**fields) -> str:
    row = {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [0]} | fields
    return json.dumps({k: v for k, v in row.items() if v is not ...}) + "\n"


# (file name, content, line, what the message must say)
CASES = [
    ("azure.csv", "TIMESTAMP,ContextTokens\n" + "x,1\n", 1, "missing column 'GeneratedTokens'"),
    (
        "azure.csv",
        AZURE_HEADER + AZURE_OK + "2023-11-16 18:15:47.1,12\n",
        3,
        "missing column 'GeneratedTokens'",
    ),
    (
        "azure.csv",
        AZURE_HEADER + AZURE_OK + "2023-11-16 18:15:47.1,12x,4\n",
        3,
        "ContextTokens is not a number",
    ),
    (
        "azure.csv",
        AZURE_HEADER + AZURE_OK + "2023-11-16 18:15:47.1,12,-4\n",
        3,
        "GeneratedTokens is negative",
    ),
    ("azure.csv", AZURE_HEADER + AZURE_OK + "2023-13-16 18:15:47.1,12,4\n", 3, "bad timestamp"),
    ("azure.csv", AZURE_HEADER + "\n" + "16/11/2023 18:15,12,4\n", 3, "bad timestamp"),
    ("azure.csv", AZURE_HEADER + "2023-11-16 25:15:47,12,4\n", 2, "bad timestamp"),
    ("burst.csv", BURST_HEADER + BURST_OK + "6,ChatGPT,1\n", 3, "missing column 'Response tokens'"),
    (
        "burst.csv",
        BURST_HEADER + BURST_OK + "6,ChatGPT,abc,3,4,x\n",
        3,
        "Request tokens is not a number",
    ),
    (
        "burst.csv",
        BURST_HEADER + BURST_OK + "6,ChatGPT,-2,3,4,x\n",
        3,
        "Request tokens is negative",
    ),
    ("burst.csv", BURST_HEADER + BURST_OK + "soon,ChatGPT,2,3,4,x\n", 3, "bad timestamp"),
    ("burst.csv", BURST_HEADER + BURST_OK + "-1,ChatGPT,2,3,4,x\n", 3, "bad timestamp"),
    (
        "m.jsonl",
        mooncake_line() + mooncake_line(output_length=...),
        2,
        "missing column 'output_length'",
    ),
    (
        "m.jsonl",
        mooncake_line() + mooncake_line(input_length="ten"),
        2,
        "input_length is not a number",
    ),
    ("m.jsonl", mooncake_line() + mooncake_line(output_length=-3), 2, "output_length is negative"),
    ("m.jsonl", mooncake_line() + mooncake_line(timestamp="noon"), 2, "bad timestamp"),
    ("m.jsonl", mooncake_line() + mooncake_line(timestamp=-5), 2, "bad timestamp"),
    ("m.jsonl", mooncake_line() + mooncake_line(hash_ids="abc"), 2, "hash_ids must be a list"),
    ("m.jsonl", mooncake_line() + '{"timestamp": 1,\n', 2, "not valid JSON"),
    ("n.jsonl", '{"cbbench_workload": 1}\n{"prompt_len": 3}\n', 2, "missing column 'output_len'"),
    ("n.jsonl", '{"prompt_len": 3, "output_len": 2, "colour": 1}\n', 1, "unknown key 'colour'"),
    ("n.jsonl", '{"prompt_len": 3, "output_len": 2, "arrival_s": -1}\n', 1, "bad timestamp"),
    ("n.jsonl", '{"prompt_len": 3, "output_len": "2x"}\n', 1, "output_len is not a number"),
    (
        "s.json",
        '[\n{"id": 1, "conversations": []},\n{"id": 2}\n]',
        3,
        "missing column 'conversations'",
    ),
    ("s.json", '[\n{"id": 1, "conversations": []},\n{"id": 2,\n', 3, "not valid JSON"),
    ("x.jsonl", '\n{"foo": 1}\n', 2, "cannot tell the JSONL format"),
    ("x.jsonl", "\n\n{bad\n", 3, "not valid JSON"),
    ("x.csv", "when,prompt,output\n1,2,3\n", 1, "unknown CSV header"),
]


@pytest.mark.parametrize(("name", "content", "line", "what"), CASES)
def test_malformed_row_names_file_and_line(tmp_path, name, content, line, what):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(WorkloadError) as info:
        load_workload(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert what in message
    assert "\n" not in message


def test_cli_malformed_row_is_one_line_exit_2(tmp_path, capsys):
    path = tmp_path / "azure.csv"
    path.write_text(AZURE_HEADER + AZURE_OK + "2023-11-16 18:15:47.1,12,-4\n")
    assert main(["workload", "show", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"cbbench workload: error: {path}:3: GeneratedTokens is negative: -4"


def test_cli_bad_path_subprocess_exit_2_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "cbbench.harness.cli", "workload", "show", str(tmp_path / "no.csv")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert "no.csv" in proc.stderr and "not a preset" in proc.stderr


SPEC_CASES = [
    ({"prompt": 10, "output": 5, "colour": "red"}, "unknown key 'colour'"),
    (
        {"prompt": {"dist": "lognormal", "median": 10, "sigma": 1, "spread": 2}, "output": 5},
        "unknown key 'spread'",
    ),
    ({"prompt": {"dist": "weibull"}, "output": 5}, "unknown dist 'weibull'"),
    ({"prompt": {"dist": "uniform", "min": 9, "max": 3}, "output": 5}, "min 9 > max 3"),
    ({"prompt": 10}, "missing 'output'"),
    ({"prompt": 10, "output": 5, "arrival": {"kind": "poisson"}}, "needs rate > 0"),
    (
        {"prompt": 10, "output": 5, "arrival": {"kind": "poisson", "rate": 1, "burst": 2}},
        "unknown key 'burst'",
    ),
    (
        {"prompt": 10, "output": 5, "prefix": {"shared_blocks": 2, "groupz": 3}},
        "unknown key 'groupz'",
    ),
    ({"prompt": 10, "output": 5, "mixture": [{"weight": 1, "outptu": 4}]}, "unknown key 'outptu'"),
    ({"trace": {"path": "x.csv", "speed": 2}}, "unknown key 'speed'"),
    ({"trace": "azure-conv", "output": 5}, "'output' cannot be combined with 'trace'"),
    ({"prompt": 10, "output": 5, "num_requests": -1}, "'num_requests' must be an integer >= 0"),
]


@pytest.mark.parametrize(("spec", "what"), SPEC_CASES)
def test_bad_spec_file_names_file_and_key(tmp_path, spec, what):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    with pytest.raises(WorkloadError) as info:
        load_workload(str(path))
    assert str(info.value).startswith(f"{path}: "), str(info.value)
    assert what in str(info.value)


def test_bad_toml_syntax(tmp_path):
    path = tmp_path / "spec.toml"
    path.write_text("prompt = {dist=\n")
    with pytest.raises(WorkloadError, match="not a valid spec file"):
        load_workload(str(path))


def test_replay_without_timestamps_is_an_error():
    with pytest.raises(WorkloadError, match="replay needs a trace with arrival times"):
        from cbbench.workloads import with_arrivals

        with_arrivals(load_workload("seed-demo"), "replay")


def test_arrival_seed_defaults_to_the_workload_seed_and_must_be_non_negative():
    from cbbench.workloads import with_arrivals

    wl = load_workload("mixed", seed=5, num_requests=50)
    assert with_arrivals(wl, "poisson", rate=2) == with_arrivals(wl, "poisson", rate=2, seed=5)
    assert with_arrivals(wl, "poisson", rate=2) != with_arrivals(wl, "poisson", rate=2, seed=6)
    with pytest.raises(WorkloadError, match="seed must be an integer >= 0"):
        with_arrivals(wl, "poisson", rate=2, seed=-1)
    with pytest.raises(WorkloadError, match="'seed' must be an integer >= 0"):
        load_workload("mixed", seed=-1)
