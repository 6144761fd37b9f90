"""`cbbench compare-engines` on the tiny model with 3 requests: the reference server and both
transformers modes run on the same saved model and prompts, and the ratios are printed."""

from __future__ import annotations

import json

from cbbench.harness.cli import main
from cbbench.harness.results.run_folder import load_run
from cbbench.harness.servers.peer_engines import Job, hf_continuous, hf_static, load_hf_model


def test_compare_engines_tiny(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")
    out = tmp_path / "cmp"
    argv = ["compare-engines", "--model", "tiny", "--num-requests", "3", "--max-batch", "2"]
    assert main([*argv, "--engines", "reference,hf-static,hf-continuous", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "vs hf-static" in text and "vs hf-continuous" in text
    doc = json.loads((out / "compare.json").read_text())
    res = doc["results"]
    assert set(res) == {"reference", "hf-static", "hf-continuous"}
    tokens = {k: v["output_tokens"] for k, v in res.items()}
    assert len(set(tokens.values())) == 1 and tokens["reference"] > 0  # same useful work
    assert all(v["tok_s"] > 0 for v in res.values())
    assert (out / "model" / "config.json").is_file()  # the one saved model all engines used
    run = load_run(out / "reference")
    measured = [r for r in run.records if not r.warmup]
    assert len(measured) == 3 and all(r.ok for r in measured)
    assert sum(r.output_tokens_server for r in measured) == tokens["reference"]
    warm = load_run(out / "reference-warmup").records  # the warm-up request: a run of its own
    assert len(warm) == 1 and warm[0].ok and len(run.records) == 3
    ref = res["reference"]  # the server's CPU in the measured run, split, warm-up apart
    assert ref["cpu_s"] == ref["engine_cpu_s"] + ref["api_cpu_s"]
    assert ref["engine_cpu_s"] > 0 and ref["warmup_engine_cpu_s"] > 0
    assert "warmup_api_cpu_s" in ref and ref["load_generator_cpu_s"] > 0
    # the measured run's steps (the server's /metrics): one a token at least, per request
    assert ref["engine_steps"] >= max(r.output_tokens_server for r in measured)
    assert ref["compute_thread"]["on_cpu_s"] > 0  # where its wall time went (schedstat)
    import os

    spare = sorted(os.sched_getaffinity(0) - {0})
    assert ref["host_cores"] == (spare or None)
    assert "measured: engine processes" in text and "warm-up request (not counted)" in text


def test_hf_modes_generate_exactly_the_asked_tokens(tmp_path):
    from cbbench.reference_engine.model.loader import save_random_model

    folder = save_random_model("tiny", tmp_path / "m", seed=1)
    model = load_hf_model(folder)
    jobs = [Job("a", [5, 6, 7], 4), Job("b", [8] * 9, 7), Job("c", [9, 10], 2)]
    assert hf_static(model, jobs, 2)[0] == 13
    assert hf_continuous(model, jobs, 2)[0] == 13  # raises if any came back short


def test_compare_engines_bad_engine(capsys):
    assert main(["compare-engines", "--engines", "reference,tgi"]) == 2
    err = capsys.readouterr().err
    assert "--engines" in err and "tgi" in err and "Traceback" not in err


def test_engine_cpu_counts_worker_processes():
    """vLLM computes in worker processes: their CPU time belongs to the engine's."""
    import subprocess
    import sys
    import time

    from cbbench.harness.studies.compare_engines import process_cpu_s

    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    parent = subprocess.Popen(["bash", "-c", f"{sys.executable} -c '{busy}'"])
    try:
        time.sleep(0.1)
        while parent.poll() is None and (process_cpu_s(parent.pid) or 0) < 0.3:
            time.sleep(0.05)
        assert parent.poll() is None, "the busy child ended before its CPU was seen"
        assert process_cpu_s(parent.pid) >= 0.3  # bash itself used almost none
    finally:
        parent.wait(30)


def test_missing_vllm_is_reported_and_the_others_still_compared(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")
    out = tmp_path / "cmp"
    argv = ["compare-engines", "--model", "tiny", "--num-requests", "2", "--max-batch", "2"]
    assert main([*argv, "--engines", "reference,vllm", "--vllm-python", "/bin/false",
                 "--out", str(out)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "vllm: not importable by /bin/false, skipped" in " ".join(text.split())
    assert set(json.loads((out / "compare.json").read_text())["results"]) == {"reference"}


def test_the_command_lists_the_studys_engines():
    from cbbench.harness.cli import compare_engines as cmd
    from cbbench.harness.studies import compare_engines as study

    assert cmd.ENGINES == study.ENGINES


def _find(obj, key):
    """The first value under `key` anywhere in a nested dict."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            if (found := _find(v, key)) is not None:
                return found
    return None


def test_compare_engines_dtype_reaches_the_reference_server(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "220")
    out = tmp_path / "cmp"
    argv = ["compare-engines", "--model", "tiny", "--num-requests", "2", "--max-batch", "2",
            "--engines", "reference", "--dtype", "bfloat16", "--kv-cache-dtype", "int8",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    assert "dtype bfloat16, reference KV int8" in capsys.readouterr().out  # the table's title
    doc = json.loads((out / "compare.json").read_text())
    assert (doc["dtype"], doc["kv_cache_dtype"]) == ("bfloat16", "int8")
    engine = load_run(out / "reference").meta["target"]["engine"]  # what the server said
    assert _find(engine, "dtype") == "bfloat16"
    assert _find(engine, "kv_cache_dtype") == "int8"


def test_vllm_gets_the_same_dtype(tmp_path):
    from cbbench.harness.servers.peer_engines import vllm_command

    cmd = vllm_command(tmp_path, 4, 128, 8000, dtype="bfloat16")
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16"
    assert vllm_command(tmp_path, 4, 128, 8000)[cmd.index("--dtype") + 1] == "float32"


def test_kv_cache_dtype_is_refused_for_vllm_and_bad_dtype_named(capsys):
    argv = ["compare-engines", "--model", "tiny", "--engines", "reference,vllm"]
    assert main([*argv, "--kv-cache-dtype", "int8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--kv-cache-dtype int8: applies to the reference engine only" in err[0]


def test_transformers_engines_load_the_asked_dtype(tmp_path):
    """hf-static / hf-continuous run at compare-engines' --dtype too, or the ratio mixes dtypes."""
    import torch
    from cbbench.reference_engine.model.loader import save_random_model

    folder = save_random_model("tiny", tmp_path / "m", seed=1)
    assert next(load_hf_model(folder, "bfloat16").parameters()).dtype == torch.bfloat16
    assert next(load_hf_model(folder).parameters()).dtype == torch.float32
    model = load_hf_model(folder, "bfloat16")
    assert hf_static(model, [Job("a", [5, 6, 7], 3)], 1)[0] == 3


def test_both_servers_get_the_same_budget_and_the_settings_are_said(tmp_path, capsys):
    from cbbench.harness.servers.peer_engines import vllm_command
    from cbbench.harness.studies.compare_engines import step_budget

    cmd = vllm_command(tmp_path, 8, 255, 8000, max_num_batched_tokens=step_budget())
    assert cmd[cmd.index("--max-num-batched-tokens") + 1] == str(step_budget()) == "2048"
    assert "--max-num-batched-tokens" not in vllm_command(tmp_path, 8, 255, 8000)
    # prefix caching as the reference's default (off) where compare-engines asks for it
    assert "--no-enable-prefix-caching" in vllm_command(tmp_path, 8, 255, 8000, prefix_caching=False)
    assert not any("prefix-caching" in a for a in vllm_command(tmp_path, 8, 255, 8000))
    out = tmp_path / "cmp"
    argv = ["compare-engines", "--model", "tiny", "--num-requests", "2", "--max-batch", "2",
            "--engines", "reference", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    said = "max_num_seqs 2, max_num_batched_tokens 2048"
    assert said in capsys.readouterr().out
    doc = json.loads((out / "compare.json").read_text())
    assert said in doc["settings"] and "1 compute thread(s) bound to core(s) 0-0" in doc["settings"]
    assert "prefix caching off" in doc["settings"]
    engine = load_run(out / "reference").meta["target"]["engine"]  # what the server said
    assert _find(engine, "max_num_batched_tokens") == 2048


def test_bind_engine_binds_the_servers_children_not_the_server(tmp_path):
    import contextlib
    import os
    import subprocess
    import sys

    from cbbench.harness.studies.compare_engines import bind_engine

    code = "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', " \
           "'import time; time.sleep(30)']); print(c.pid, flush=True); time.sleep(30)"
    from tests.process_support import readline_within

    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(readline_within(parent, 30.0, "the parent process"))
        cores = sorted(os.sched_getaffinity(0))
        bind_engine(parent.pid, {cores[0]})
        assert os.sched_getaffinity(child) == {cores[0]}
        assert os.sched_getaffinity(parent.pid) == set(cores)
    finally:
        parent.kill()
        parent.wait(10)
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, 9)
