"""`cbbench locust` on the Responses, Messages and embeddings endpoints, headless against the
reference engine's server on loopback: every request recorded once and ok, counts reconciled
with each API's usage, Locust's E2E count equal to the records'."""

from __future__ import annotations

import subprocess

import pytest
from cbbench.harness.results.run_folder import load_run
from cbbench.harness.servers.launcher import launch_reference_server

from tests.test_locust_run import PROC_TIMEOUT_S, _cmd, _common, _csv_rows, _free_port


@pytest.fixture(scope="module")
def server() -> str:
    with launch_reference_server(model="tiny", scheduler="continuous") as handle:
        yield handle.base_url


@pytest.mark.parametrize("endpoint", ["responses", "messages", "embeddings"])
def test_locust_user_on_every_endpoint(server, tmp_path, endpoint):
    n, out, prefix = 6, tmp_path / "run", tmp_path / "stats"
    argv = [*_common(server, n, out), "--endpoint", endpoint, "--embeddings-batch", "2"]
    argv += ["--closed-loop", "--headless", "-u", "2", "-r", "100", "-t", "40s"]
    argv += ["--csv", str(prefix), "--web-port", str(_free_port())]
    proc = subprocess.run(_cmd(*argv), capture_output=True, text=True, timeout=PROC_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = load_run(out)
    assert sorted(r.index for r in run.records) == list(range(n))
    for r in run.records:
        assert r.ok, r.error
        if endpoint == "embeddings":
            assert r.extra["inputs"] == 2 and r.e2e_s > 0 and r.prompt_tokens_server > 0
        else:
            assert r.output_tokens_client == r.output_tokens_server == r.output_len
            assert r.token_mismatch is None and r.ttft_s > 0
    assert int(_csv_rows(prefix)[("LLM", "E2E")]["Request Count"]) == n
