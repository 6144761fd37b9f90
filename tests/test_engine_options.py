"""The engine options registry: one name, unit, default and help per engine flag on every
command; settings -> EngineConfig; the KV pool size means the same on both executors."""

from __future__ import annotations

import argparse

import pytest
from cbbench.harness.cli import build_parser, main
from cbbench.harness.errors import CbbenchError
from cbbench.reference_engine.config.engine_config import SCHEDULERS, EngineConfig
from cbbench.reference_engine.config.options import (
    FLAGS,
    SIM_DEFAULTS,
    add_engine_args,
    build_engine_config,
    engine_argv,
    engine_config_from_args,
    engine_flags,
)
from cbbench.reference_engine.engine.llm_engine import LLMEngine
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.scheduler import SCHEDULER_CLASSES

ENGINE_COMMANDS = ("serve", "sim", "run", "reproduce", "compare-engines", "calibrate")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _by_option(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {opt: a for a in p._actions for opt in a.option_strings}


def test_every_command_spells_every_engine_flag_the_same_way():
    names = {f.name: f for f in FLAGS.values()}
    negatives = {f"--no-{f.name[2:]}" for f in FLAGS.values() if f.kind == "bool"}
    aliases = {a: f for f in FLAGS.values() for a in f.aliases}
    seen_engine_flag = set()
    for cmd, p in _subparsers().items():
        if cmd not in ENGINE_COMMANDS:  # bench's --model is the served model's name
            continue
        for opt, action in _by_option(p).items():
            if "--schedulers" in action.option_strings:
                continue  # run/sim's list of policies to compare (--scheduler: its old spelling)
            f = names.get(opt) or aliases.get(opt)
            if opt in negatives:
                continue
            if f is None:
                # a command's own flag may not reuse an engine flag's dest under another name,
                # except run's --schedulers (a plural spelling of --scheduler)
                if action.dest in FLAGS and opt != "--schedulers":
                    pytest.fail(
                        f"{cmd} {opt}: dest {action.dest!r} belongs to {FLAGS[action.dest].name}"
                    )
                continue
            seen_engine_flag.add(cmd)
            where = f"cbbench {cmd} {opt}"
            assert action.dest == f.dest, where
            assert action.default is None, f"{where}: default must be None (= not given)"
            if opt in aliases:
                continue
            assert action.help.startswith(f.help), where  # one help text
            if f.unit:
                assert f"[{f.unit}]" in action.help, where  # the unit is said
            if (cmd, opt) == ("run", "--kv-cache-dtype"):
                # run's one list-valued engine flag: argparse cannot hold choices for a comma
                # list, so run validates each entry against the same declared choices
                from cbbench.harness.cli.run import kv_cache_dtypes

                assert action.choices is None and action.metavar == "DTYPE[,DTYPE...]", where
                assert kv_cache_dtypes(",".join(f.choices)) == list(f.choices), where
                with pytest.raises(CbbenchError, match="unknown 'int4'"):
                    kv_cache_dtypes("auto,int4")
            else:
                assert action.choices == f.choices, where
            if f.kind == "bool":
                assert isinstance(action, argparse.BooleanOptionalAction), where
    assert set(ENGINE_COMMANDS) <= seen_engine_flag


def test_full_engine_flag_set_on_serve_sim_run():
    subs = _subparsers()
    for cmd in ("serve", "sim", "run"):
        opts = _by_option(subs[cmd])
        missing = [f.name for f in FLAGS.values() if f.name not in opts]
        assert not missing, f"{cmd} lacks {missing}"
    # the ones that used to be missing
    assert {"--aging-rate", "--max-queue-size"} <= set(_by_option(subs["serve"]))
    assert "--max-waiting" in _by_option(subs["sim"])


def test_memory_flag_is_gib_in_help():
    assert FLAGS["kv_cache_memory_gb"].unit == "GiB"
    p = argparse.ArgumentParser()
    add_engine_args(p)
    assert "[GiB]" in p.format_help()


def test_scheduler_registry_is_one_list():
    assert tuple(SCHEDULER_CLASSES) == SCHEDULERS
    fields = {f for f in EngineConfig.__dataclass_fields__}
    assert set(SCHEDULERS) <= fields  # each policy's settings live under its name


def test_every_flag_round_trips_through_argv():
    """settings -> argv -> parse -> settings, for a value unlike the default of each flag."""
    values = {"int": 3, "float": 0.25, "ints": (1, 2), "bool": True}
    settings = {}
    for f in engine_flags():
        if f.kind == "str":
            settings[f.dest] = f.choices[-1] if f.choices else "x"
        else:
            settings[f.dest] = (not f.default) if f.kind == "bool" else values[f.kind]
    settings["scheduler"] = "dynamic"
    p = argparse.ArgumentParser()
    add_engine_args(p)
    ns = p.parse_args(engine_argv(settings))
    assert {d: getattr(ns, d) for d in settings} == settings


def test_b_is_the_default_size_of_every_policy():
    cfgs = {n: build_engine_config({"batch_size": 5}, scheduler=n) for n in SCHEDULERS}
    assert {n: c.max_batch_slots for n, c in cfgs.items()} == dict.fromkeys(SCHEDULERS, 5)
    cfg = build_engine_config({"batch_size": 5, "max_num_seqs": 7}, scheduler="continuous")
    assert cfg.max_batch_slots == 7
    # a budget below the slots is raised to them only when not given
    cfg = build_engine_config({"batch_size": 4096}, scheduler="continuous")
    assert cfg.continuous.max_num_batched_tokens == 4096
    with pytest.raises(EngineError, match="max_num_batched_tokens"):
        build_engine_config({"max_num_seqs": 64, "max_num_batched_tokens": 8})


def test_precedence_given_over_command_defaults_over_config():
    p = argparse.ArgumentParser()
    add_engine_args(p, defaults=SIM_DEFAULTS)
    cfg = engine_config_from_args(p.parse_args(["--model", "tiny"]))
    assert cfg.model == "tiny" and cfg.dtype == "auto" and cfg.static.batch_size == 32
    cfg = engine_config_from_args(p.parse_args([]), batch_size=4, hardware="steps")
    assert cfg.static.batch_size == 4 and cfg.hardware == "steps"
    assert "(default: llama-3-8b)" in p.format_help()


def test_deprecated_spelling_still_works(capsys):
    for argv in (["sim", "--no-chunked-prefill"], ["serve", "--no-chunked-prefill"]):
        ns = build_parser().parse_args(argv)
        assert ns.enable_chunked_prefill is False
    ns = build_parser().parse_args(["run", "--schedulers", "static"])
    assert ns.scheduler == "static"


def test_unknown_scheduler_is_one_line(capsys):
    assert main(["serve", "--scheduler", "fast"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fast" in err and "continuous" in err
    assert main(["serve", "--scheduler", "static,continuous"]) == 2
    assert "one policy" in capsys.readouterr().err


def test_kv_memory_sizes_the_same_pool_simulated_and_real():
    """--kv-cache-memory-gb is GiB on both paths: same model, dtype, value -> same blocks."""
    common = {"model": "tiny", "dtype": "float32", "kv_cache_memory_gb": 0.01, "block_size": 16}
    sim = LLMEngine.from_config(build_engine_config({**common, "executor": "sim"}))
    real = LLMEngine.from_config(build_engine_config({**common, "executor": "real"}))
    assert sim.block_manager.num_blocks == real.block_manager.num_blocks
    per_block = real.model_config.kv_bytes_per_token(4) * 16
    assert real.block_manager.num_blocks == int(0.01 * 2**30 // per_block)
