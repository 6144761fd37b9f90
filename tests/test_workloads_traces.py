"""Trace loaders on the real traces in ../shared/traces, cross-checked with pandas."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from cbbench.harness.cli import main
from cbbench.workloads import WorkloadError, load_trace, load_workload, trace_sharegpt

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
AZURE = TRACES / "azure_llm_2023_conv.csv"
MOONCAKE = TRACES / "mooncake_conversation.jsonl"


@pytest.fixture(scope="module", autouse=True)
def traces_present():
    missing = [p for p in (AZURE, MOONCAKE) if not p.is_file()]
    assert not missing, f"shared traces missing (tests need ../shared/traces): {missing}"


def expected_summary(prompt: pd.Series, output: pd.Series, t: pd.Series) -> dict:
    """The numbers `workload show` must print, computed independently with pandas."""
    gaps = t.diff().dropna()
    duration = t.max() - t.min()
    out = {"count": len(prompt), "duration_s": duration, "mean_rate": (len(t) - 1) / duration}
    out["burstiness"] = gaps.std(ddof=0) / gaps.mean()
    for name, col in (("prompt_len", prompt), ("output_len", output)):
        out[name] = {
            "mean": col.mean(),
            "p50": col.quantile(0.5),
            "p90": col.quantile(0.9),
            "p99": col.quantile(0.99),
            "max": col.max(),
        }
    return out


def show_json(capsys, spec: str) -> dict:
    assert main(["workload", "show", spec, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def check_summary(got: dict, want: dict) -> None:
    assert got["count"] == want["count"]
    for key in ("duration_s", "mean_rate", "burstiness"):
        assert got[key] == pytest.approx(want[key], rel=1e-9), key
    for name in ("prompt_len", "output_len"):
        for stat, value in want[name].items():
            assert got[name][stat] == pytest.approx(value, rel=1e-12), (name, stat)


def test_show_azure_conv_matches_pandas(capsys):
    df = pd.read_csv(AZURE)
    stamps = pd.to_datetime(df["TIMESTAMP"])
    t = (stamps - stamps.iloc[0]).dt.total_seconds()
    want = expected_summary(df["ContextTokens"], df["GeneratedTokens"], t)
    check_summary(show_json(capsys, "azure-conv"), want)
    # The text view prints the same count and percentiles.
    assert main(["workload", "show", "azure-conv"]) == 0
    text = capsys.readouterr().out
    assert "requests: 19,366" in text
    assert f"{want['prompt_len']['p90']:,.1f}" in text
    assert f"{want['output_len']['p99']:,.1f}" in text
    assert f"{want['mean_rate']:,.3f} req/s" in text


def test_show_mooncake_conv_matches_pandas(capsys):
    df = pd.read_json(MOONCAKE, lines=True)
    want = expected_summary(df["input_length"], df["output_length"], df["timestamp"] / 1000)
    got = show_json(capsys, "mooncake-conv")
    check_summary(got, want)
    assert got["with_prefix_ids"] == len(df)


def test_packaged_traces_equal_shared_files():
    for preset, path in (("azure-conv", AZURE), ("mooncake-conv", MOONCAKE)):
        packaged, shared = load_workload(preset), load_trace(path)
        assert packaged.requests == shared.requests
        assert packaged.source["rows_skipped"] == {}


def test_mooncake_hash_ids_become_prefix_ids():
    wl = load_workload("mooncake-conv", num_requests=50)
    first = json.loads(MOONCAKE.open().readline())
    assert wl.requests[0].prefix_ids == tuple(first["hash_ids"])
    assert wl.prefix_block_size == 512
    for r in wl.requests:  # one id per started 512-token block
        assert len(r.prefix_ids) == -(-r.prompt_len // 512)


def test_arrivals_relative_and_100ns_exact(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 23:59:59.9999999,10,5\n"
        "2023-11-17 00:00:00.0000001,11,6\n"
        "2023-11-17T00:00:01.5Z,12,7\n"
        "2023-11-17 02:00:01.5000000+02:00,13,8\n"
    )
    wl = load_trace(path)
    assert [r.arrival_s for r in wl.requests] == [0.0, 2e-7, 1.5000001, 1.5000001]
    assert [r.index for r in wl.requests] == [0, 1, 2, 3]


def test_num_requests_takes_the_first_rows():
    full = load_workload("azure-conv")
    head = load_workload("azure-conv", num_requests=100)
    assert head.requests == full.requests[:100]


def test_gzip_copy_loads_like_plain(tmp_path):
    gz = tmp_path / "conv.jsonl.gz"
    with MOONCAKE.open("rb") as src, gzip.open(gz, "wb") as dst:
        shutil.copyfileobj(src, dst)
    assert (
        load_trace(gz, num_requests=300).requests == load_trace(MOONCAKE, num_requests=300).requests
    )


def test_unsorted_rows_are_sorted_and_counted(tmp_path):
    path = tmp_path / "m.jsonl"
    rows = [(5000, 10), (1000, 20), (3000, 30)]
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": n, "output_length": 1, "hash_ids": []})
            + "\n"
            for t, n in rows
        )
    )
    wl = load_trace(path)
    assert [(r.arrival_s, r.prompt_len) for r in wl.requests] == [(0.0, 20), (2.0, 30), (4.0, 10)]
    assert wl.source["reordered"] == 3


BURSTGPT = (
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "5,ChatGPT,472,18,490,Conversation log\n"
    "45,ChatGPT,1087,0,1087,Conversation log\n"
    "118,GPT-4,417,276,693,Conversation log\n"
    "125,ChatGPT,1360,395,1755,API log\n"
)


def test_burstgpt_drops_failed_rows_and_filters(tmp_path):
    path = tmp_path / "burst.csv"
    path.write_text(BURSTGPT)
    wl = load_workload(str(path))
    assert [(r.arrival_s, r.prompt_len, r.output_len) for r in wl.requests] == [
        (0.0, 472, 18),
        (113.0, 417, 276),
        (120.0, 1360, 395),
    ]
    assert wl.source["rows_skipped"] == {"failed": 1}
    kept = load_trace(path, drop_failed=False)
    assert [r.output_len for r in kept.requests] == [18, 0, 276, 395]
    chat = load_trace(path, model="ChatGPT", log_type="Conversation log")
    assert [r.prompt_len for r in chat.requests] == [472]
    assert chat.source["rows_skipped"] == {"failed": 1, "log_type": 1, "model": 1}


def write_tokenizer(path: Path, words: list[str]) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(["[UNK]", *sorted(set(words))])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))


SHAREGPT = [
    {
        "id": "a",
        "conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "human", "value": "hello there how are you"},
            {"from": "gpt", "value": "fine thanks"},
            {"from": "human", "value": "ignored second turn"},
        ],
    },
    {"id": "b", "conversations": [{"from": "human", "value": "no reply here"}]},
    {
        "id": "c",
        "conversations": [{"from": "human", "value": "x" * 9}, {"from": "gpt", "value": ""}],
    },
    {
        "id": "d",
        "conversations": [
            {"from": "human", "value": "one"},
            {"from": "gpt", "value": "two three four"},
        ],
    },
]


def test_sharegpt_estimate_and_tokenizer(tmp_path, monkeypatch):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(SHAREGPT, indent=2))
    monkeypatch.setattr(trace_sharegpt, "CHUNK_CHARS", 7)  # items straddle many chunk borders
    wl = load_workload(str(path))
    assert [(r.prompt_len, r.output_len) for r in wl.requests] == [(6, 3), (1, 4)]  # ceil(chars/4)
    assert [r.session_id for r in wl.requests] == ["a", "d"]
    assert [r.text for r in wl.requests] == ["hello there how are you", "one"]  # sent as is
    assert wl.source["rows_skipped"] == {"empty_turn": 1, "no_reply": 1}
    assert not wl.open_loop
    tok = tmp_path / "tokenizer.json"
    write_tokenizer(
        tok,
        ["hello", "there", "how", "are", "you", "fine", "thanks", "one", "two", "three", "four"],
    )
    counted = load_workload(str(path), tokenizer=tok)
    assert [(r.prompt_len, r.output_len) for r in counted.requests] == [(5, 2), (1, 3)]


def test_sharegpt_jsonl_variant(tmp_path):
    path = tmp_path / "sg.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in SHAREGPT))
    assert [r.session_id for r in load_workload(str(path)).requests] == ["a", "d"]


def test_empirical_from_trace_column_samples_trace_values():
    from cbbench.workloads.loader import build_from_spec

    spec = {
        "num_requests": 2000,
        "prompt": 8,
        "output": {"dist": "empirical", "trace": "azure-conv", "column": "output"},
    }
    values = [r.output_len for r in build_from_spec(spec, "t", "test").requests]
    pool = set(pd.read_csv(AZURE)["GeneratedTokens"])
    assert set(values) <= pool
    assert len(set(values)) > 100


@pytest.mark.parametrize("chunk", [1, 5, 64, 1 << 20])
def test_sharegpt_minified_array_any_chunk_size(tmp_path, monkeypatch, chunk):
    path = tmp_path / "sg.json.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps(SHAREGPT * 3, separators=(",", ":")))
    monkeypatch.setattr(trace_sharegpt, "CHUNK_CHARS", chunk)
    wl = load_workload(str(path))
    assert [r.session_id for r in wl.requests] == ["a", "d"] * 3
    assert wl.source["rows_skipped"] == {"empty_turn": 3, "no_reply": 3}


def test_loaders_stream_and_stop_after_num_requests(tmp_path):
    """Rows past the first N are never parsed: a bad row after them does not matter."""
    csv_path = tmp_path / "a.csv"
    csv_path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        + "".join(f"2023-11-16 18:15:{s:02d}.0000000,{s + 1},{s + 2}\n" for s in range(3))
        + "garbage,row,here\n"
    )
    assert [r.prompt_len for r in load_trace(csv_path, num_requests=3).requests] == [1, 2, 3]
    jsonl = tmp_path / "m.jsonl"
    jsonl.write_text(
        '{"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [0]}\n{not json\n'
    )
    assert len(load_trace(jsonl, num_requests=1)) == 1
    with pytest.raises(WorkloadError, match=r"m\.jsonl:2: not valid JSON"):
        load_trace(jsonl)


def test_native_stops_after_num_requests(tmp_path):
    path = tmp_path / "n.jsonl"
    path.write_text(
        '{"cbbench_workload": 1, "name": "n", "seed": 4}\n{"prompt_len": 3, "output_len": 2}\n{bad\n'
    )
    assert [r.prompt_len for r in load_workload(str(path), num_requests=1).requests] == [3]
    empty = load_workload(str(path), num_requests=0)
    assert len(empty) == 0 and empty.name == "n" and empty.seed == 4
