"""Trace rows with 0 output (or 0 prompt) tokens are skipped and counted when an Azure or
Mooncake trace loads: replayed, a request for 0 tokens got HTTP 400 ("max_tokens: Input should
be greater than or equal to 1"), an error the trace never had, and the run exited 3."""

from __future__ import annotations

import json

from cbbench.workloads import load_workload

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2024-05-10T00:00:00.0000000Z,10,0
2024-05-10T00:00:01.0000000Z,0,5
2024-05-10T00:00:02.0000000Z,7,5
2024-05-10T00:00:03.0000000Z,9,4
"""


def test_azure_rows_no_server_can_replay_are_skipped_and_counted(tmp_path):
    path = tmp_path / "az.csv"
    path.write_text(AZURE)
    wl = load_workload(str(path))
    assert [(r.arrival_s, r.prompt_len, r.output_len) for r in wl.requests] == [
        (0.0, 7, 5),
        (1.0, 9, 4),
    ]
    assert wl.source["rows_skipped"] == {"empty_prompt": 1, "zero_output": 1}


def test_mooncake_zero_output_row_is_skipped_and_counted(tmp_path):
    path = tmp_path / "mc.jsonl"
    rows = [(0, 10, 5), (5, 10, 0), (9, 12, 3)]
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": i, "output_length": o}) + "\n"
            for t, i, o in rows
        )
    )
    wl = load_workload(str(path))
    assert [r.output_len for r in wl.requests] == [5, 3]
    assert wl.source["rows_skipped"] == {"zero_output": 1}
    assert load_workload(str(path), num_requests=2).requests[-1].output_len == 3


def test_a_trace_run_is_named_by_the_files_base_name(tmp_path):
    """A replay of /work/shared/traces/azure_llm_2023_conv.csv was titled and named
    `_work_shared_traces_azure_llm_2023_conv.csv` (its whole path, slashes made `_`)."""
    from cbbench.harness.cli import main
    from cbbench.harness.results.run_folder import load_run
    from cbbench.harness.servers.launcher import launch_reference_server

    deep = tmp_path / "data" / "traces"
    deep.mkdir(parents=True)
    (deep / "az.csv").write_text(AZURE)
    out = tmp_path / "run"
    with launch_reference_server(model="tiny", scheduler="continuous") as srv:
        argv = ["bench", "--base-url", srv.base_url, "--workload", str(deep / "az.csv")]
        assert main([*argv, "--out", str(out), "--no-live"]) == 0
    assert load_run(out).meta["name"] == "az.csv"
