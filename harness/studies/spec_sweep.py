"""Speculative decoding speed-up against batch size, in simulated time.

For each batch size B: B identical-shape requests arrive at once into a continuous engine
with max_num_seqs = B, replayed without speculation and with it at each acceptance rate
(the SimProposer's per-draft-token acceptance); the speed-up is the ratio of output
throughputs. Each speculative step costs k draft decode steps (the draft model's CostModel)
plus one target step over k + 1 tokens per sequence: nearly free while the target step is
memory-bound (small B), paid in full once it is compute-bound (large B), so the speed-up
shrinks as B grows. Every number is SIMULATED (reference_engine/execution/cost_model.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from cbbench.reference_engine.config.engine_config import EngineConfig, SpeculativeConfig
from cbbench.reference_engine.sim.simulate import replay
from cbbench.workloads.spec import RequestSpec


@dataclass
class SpecSweepOptions:
    base: EngineConfig  # model, hardware, dtype, KV settings; speculative method + model
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    acceptance_rates: tuple[float, ...] = (0.6, 0.8)
    prompt_len: int = 512
    output_len: int = 256


@dataclass
class SpecSweepRow:
    batch_size: int
    plain_tok_s: float  # output tokens per (simulated) second without speculation
    spec_tok_s: dict[float, float] = field(default_factory=dict)  # acceptance -> tok/s
    tokens_per_step: dict[float, float] = field(default_factory=dict)  # mean accepted length

    def speedup(self, rate: float) -> float:
        return self.spec_tok_s[rate] / self.plain_tok_s


def _config(base: EngineConfig, batch: int, spec: SpeculativeConfig) -> EngineConfig:
    k = spec.num_speculative_tokens if spec.enabled else 0
    cont = dataclasses.replace(
        base.continuous,
        max_num_seqs=batch,
        max_num_batched_tokens=max(base.continuous.max_num_batched_tokens, batch * (k + 1)),
    )
    return dataclasses.replace(
        base, scheduler="continuous", executor="sim", continuous=cont, speculative=spec
    )


def spec_sweep(opts: SpecSweepOptions) -> list[SpecSweepRow]:
    spec = opts.base.speculative
    assert spec.enabled, "a speculative method is needed"
    rows = []
    for b in opts.batch_sizes:
        reqs = [RequestSpec(i, opts.prompt_len, opts.output_len) for i in range(b)]
        plain = replay(reqs, _config(opts.base, b, SpeculativeConfig()))
        row = SpecSweepRow(b, plain.summary()["output_throughput"])
        for rate in opts.acceptance_rates:
            cfg = _config(opts.base, b, dataclasses.replace(spec, acceptance_rate=rate))
            s = replay(reqs, cfg).summary()
            row.spec_tok_s[rate] = s["output_throughput"]
            row.tokens_per_step[rate] = s["spec_mean_accepted_length"]
        rows.append(row)
    return rows


def print_sweep(opts: SpecSweepOptions, rows: list[SpecSweepRow], console) -> None:
    from rich.table import Table

    b, s = opts.base, opts.base.speculative
    draft = f"draft {s.model}" if s.method == "draft" else "n-gram lookup (no draft cost)"
    t = Table(
        title=f"SIMULATED: {b.model} + {draft}, k={s.num_speculative_tokens}, on "
        f"{b.hardware}; B requests of {opts.prompt_len} prompt + {opts.output_len} output "
        f"tokens at once — modelled step times, not measurements",
        title_style="bold yellow",
    )
    t.add_column("batch")
    t.add_column("no spec (tok/s)", justify="right")
    for r in opts.acceptance_rates:
        t.add_column(f"spec a={r:g} (tok/s)", justify="right")
        t.add_column(f"speed-up a={r:g}", justify="right")
        t.add_column(f"tok/step a={r:g}", justify="right")
    for row in rows:
        cells = [str(row.batch_size), f"{row.plain_tok_s:,.0f}"]
        for r in opts.acceptance_rates:
            cells += [
                f"{row.spec_tok_s[r]:,.0f}",
                f"{row.speedup(r):.2f}x",
                f"{row.tokens_per_step[r]:.2f}",
            ]
        t.add_row(*cells)
    from cbbench.harness.results.compare import emit_table

    emit_table(console, t)  # Markdown when piped: names whole
