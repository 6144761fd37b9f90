"""The step jitter is a decode-only step's (issue #56): `calibrate --from-run` keeps a
measured one-step gap as a jitter sample only where no other request's measured prefill
window (its send -> its first token) overlaps it, whatever the replay placed there. A
chunk the replay misplaced (the server's front end slower than the fit's mean) would
otherwise count as jitter and price its tail into every simulated step."""

from __future__ import annotations

from types import SimpleNamespace

from cbbench.reference_engine.sim.run_fit import Observed, ObservedRun
from cbbench.reference_engine.sim.run_fit_terms import jitter_ratios

STEP = 0.01


def step(j: int, items: list, prefill: bool = False):
    work = SimpleNamespace(num_tokens=16 if prefill else len(items), num_seqs=len(items))
    return (j * STEP, (j + 1) * STEP, work, items)


def test_a_gap_another_requests_measured_prefill_overlaps_is_no_jitter_sample():
    # A: prefilled at step 0, then 10 one-step decode gaps; its 5th came out 5x slow,
    # while B was being prefilled on the server (B's send -> first token inside that gap);
    # the replay put B's prefill 10 steps later, far beyond the chunk margin
    gaps = [STEP] * 10
    gaps[4] = 5 * STEP
    a = Observed(0.0, 16, 11, STEP, STEP + sum(gaps), itl_s=tuple(gaps))
    b = Observed(0.06, 16, 1, 0.03, 0.03)
    steps = [step(0, [("a", True)], prefill=True)]
    steps += [step(j, [("a", True)]) for j in range(1, 11)]
    steps += [step(j, []) for j in range(11, 20)] + [step(20, [("b", True)], prefill=True)]
    sims = [SimpleNamespace(request_id="a"), SimpleNamespace(request_id="b")]
    run = ObservedRun("r", [a, b])
    ratios = jitter_ratios(run, [True, True], steps, sims, margin=2)
    assert len(ratios) == 7  # gaps 3..10 clear of A's own chunk, less the one B overlaps
    assert max(ratios) < 1.01
    # no B in the run: the slow gap is a sample (a server's own stall is jitter)
    alone = jitter_ratios(ObservedRun("r", [a]), [True], steps, sims[:1], margin=2)
    assert len(alone) == 8 and max(alone) > 4.9
