"""`cbbench serve` flags -> EngineConfig, and bad flags as one line with exit code 2."""

from __future__ import annotations

import argparse

import pytest
from cbbench.harness.cli import main
from cbbench.harness.cli.serve import add_engine_args, engine_config_from_args
from cbbench.reference_engine.config.engine_config import EngineConfig


def parse(*argv: str) -> EngineConfig:
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    return engine_config_from_args(parser.parse_args(argv))


def test_unset_flags_keep_engine_defaults():
    assert parse() == EngineConfig()


def test_every_scheduler_flag_reaches_its_field():
    cfg = parse(
        "--model", "small", "--device", "cuda:1", "--dtype", "bfloat16", "--executor", "sim",
        "--hardware", "h200", "--seed", "7", "--scheduler", "dynamic",
        "--batch-size", "3", "--drain-timeout", "0.5",
        "--max-batch-size", "16", "--preferred-batch-sizes", "4,8", "--max-queue-delay", "0.02",
        "--max-num-seqs", "32", "--max-num-batched-tokens", "512", "--no-enable-chunked-prefill",
        "--policy", "priority", "--max-queue-wait", "2.5", "--max-prefills-per-step", "2",
        "--num-kv-blocks", "100", "--block-size", "32", "--enable-prefix-caching",
        "--max-model-len", "1024", "--max-waiting", "9",
    )  # fmt: skip
    assert (cfg.model, cfg.device, cfg.dtype, cfg.executor, cfg.hardware, cfg.seed) == (
        "small", "cuda:1", "bfloat16", "sim", "h200", 7,
    )  # fmt: skip
    assert cfg.scheduler == "dynamic"
    assert (cfg.static.batch_size, cfg.static.drain_timeout_s) == (3, 0.5)
    assert cfg.dynamic.max_batch_size == 16
    assert cfg.dynamic.preferred_batch_sizes == (4, 8)
    assert cfg.dynamic.max_queue_delay_s == 0.02
    c = cfg.continuous
    assert (c.max_num_seqs, c.max_num_batched_tokens, c.enable_chunked_prefill) == (32, 512, False)
    assert (c.policy, c.max_queue_wait_s, c.max_prefills_per_step) == ("priority", 2.5, 2)
    assert (cfg.num_kv_blocks, cfg.block_size, cfg.enable_prefix_caching) == (100, 32, True)
    assert (cfg.max_model_len, cfg.max_waiting) == (1024, 9)


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--scheduler", "static", "--batch-size", "0"], "batch_size"),
        (["--max-batch-size", "4", "--preferred-batch-sizes", "8"], "preferred_batch_sizes"),
        (["--port", "70000"], "--port"),
        (["--max-waiting", "0"], "max_waiting"),
        (["--api-rt-priority", "100"], "--api-rt-priority"),
        (["--api-rt-priority", "5", "--no-engine-process"], "--engine-process"),
    ],
)
def test_bad_values_are_one_line_and_exit_2(capsys, argv, words):
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("cbbench serve: error:") and words in err


def test_malformed_flag_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--preferred-batch-sizes", "4,x"])
    assert exc.value.code == 2
    assert "comma-separated integers" in capsys.readouterr().err


def test_api_rt_priority_puts_the_api_under_sched_rr_and_not_the_engine():
    """`cbbench serve --api-rt-priority 5`: the API process's threads run SCHED_RR, the engine
    process (started before) and processes started later keep SCHED_OTHER; it still serves."""
    import os

    import httpx
    from cbbench.harness.servers.launcher import launch_reference_server

    with launch_reference_server("tiny", extra_args=["--api-rt-priority", "5"]) as server:
        api = server.process.pid
        kids = [int(p) for p in os.listdir("/proc") if p.isdigit() and _ppid(int(p)) == api]
        r = httpx.post(server.base_url + "/v1/completions",
                       json={"model": "tiny", "prompt": "hi", "max_tokens": 3}, timeout=60)  # fmt: skip
        assert r.status_code == 200
        if os.geteuid() != 0:  # no permission: one line says so, the server runs as before
            assert os.sched_getscheduler(api) == os.SCHED_OTHER
            return
        threads = [int(t) for t in os.listdir(f"/proc/{api}/task")]
        policies = {os.sched_getscheduler(t) & ~os.SCHED_RESET_ON_FORK for t in threads}
        assert os.SCHED_RR in policies and os.sched_getparam(api).sched_priority == 5
        assert kids and all(os.sched_getscheduler(k) == os.SCHED_OTHER for k in kids)


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None
