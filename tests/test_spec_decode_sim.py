"""Speculative decoding in the simulator: `cbbench sim` runs continuous batching with and
without speculation side by side; the speed-up sweep shrinks as the batch grows (draft steps
+ one verify step on the cost model); the offline real-model replay counts draft time."""

from __future__ import annotations

import time

import pytest
from cbbench.harness.cli import main
from cbbench.harness.studies.spec_sweep import SpecSweepOptions, spec_sweep
from cbbench.reference_engine.config.engine_config import EngineConfig, SpeculativeConfig
from cbbench.reference_engine.sim.simulate import MeasuredClock, replay_interleaved
from cbbench.workloads.spec import RequestSpec


def test_sim_runs_spec_beside_plain_continuous(capsys):
    rc = main(
        ["sim", "--workload", "uniform", "--num-requests", "8", "--batch-size", "4",
         "--scheduler", "static,continuous", "--speculative-method", "draft",
         "--speculative-model", "llama-3.2-1b", "--spec-acceptance-rate", "0.8"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    assert "continuous+spec" in out and "output tok/s vs continuous" in out
    assert "spec: draft acceptance" in out


def test_sim_spec_needs_continuous(capsys):
    rc = main(["sim", "--schedulers", "static", "--speculative-method", "ngram"])
    err = capsys.readouterr().err
    assert rc != 0 and "continuous scheduler only" in err


def test_speedup_shrinks_as_batch_grows():
    base = EngineConfig(
        model="llama-3-8b",
        dtype="bfloat16",
        executor="sim",
        speculative=SpeculativeConfig("draft", 4, model="llama-3.2-1b"),
    )
    opts = SpecSweepOptions(
        base, batch_sizes=(1, 256), acceptance_rates=(0.8, 1.0), prompt_len=64, output_len=32
    )
    small, big = spec_sweep(opts)
    assert small.speedup(0.8) > big.speedup(0.8)
    assert small.speedup(1.0) > small.speedup(0.8) > 1.0
    assert small.tokens_per_step[1.0] == pytest.approx(5.0, abs=0.2)


def test_measured_replay_side_by_side():
    """Offline real-model A/B (engines stepped in turn): same greedy tokens, every draft of
    the draft = target control accepted, fewer steps."""
    reqs = [RequestSpec(0, 8, 24)]
    plain, spec = replay_interleaved(
        reqs,
        [
            EngineConfig(model="tiny", max_model_len=64),
            EngineConfig(
                model="tiny",
                max_model_len=64,
                speculative=SpeculativeConfig("draft", 4, model="tiny"),
            ),
        ],
        temperature=0.0,
    )
    assert [r.output_token_ids for r in plain.requests] == [
        r.output_token_ids for r in spec.requests
    ]
    assert spec.spec_decode.num_accepted_tokens == spec.spec_decode.num_draft_tokens > 0
    assert len(spec.steps) < len(plain.steps) / 2


def test_measured_clock_counts_proposer_time():
    class Sleepy:
        def propose(self, chunks):
            time.sleep(0.02)

    clock = MeasuredClock(inner=None)
    clock.timed(Sleepy()).propose([])
    assert clock.now() >= 0.02
