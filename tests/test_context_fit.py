"""`bench` fits the workload to the server's max_model_len from /v1/models (issue 51 #16): it
sent the agent, reasoning and mooncake presets' too-long requests anyway and counted the
400s. A lone request whose output would overflow is clamped, one whose prompt cannot fit is
skipped, a session is cut at the turn that would overflow; the run says how many, and no
request fails for its length."""

from __future__ import annotations

import json

from cbbench.harness.cli import main
from cbbench.harness.load.context_fit import fit_to_context
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.workloads.spec import RequestSpec, Workload

from tests.server_support import serve


def test_requests_that_cannot_fit_are_clamped_or_skipped_and_counted(tmp_path, capsys) -> None:
    spec = tmp_path / "long.toml"  # prompts 40-200, outputs 8-120: some cannot fit 128
    spec.write_text(
        'name = "long"\nnum_requests = 12\nseed = 3\n'
        'prompt = { dist = "uniform", min = 40, max = 200 }\n'
        'output = { dist = "uniform", min = 8, max = 120 }\n'
    )
    out = tmp_path / "r"
    with serve(EngineConfig(model="tiny", max_model_len=128, executor="sim")) as (url, _):
        argv = ["bench", "--base-url", url, "--workload", str(spec), "--out", str(out)]
        rc = main([*argv, "--no-live", "--no-gpu-metrics", "--concurrency", "4"])
    text = capsys.readouterr().out
    meta = json.loads((out / "run.json").read_text())
    fit = meta["load"]["context_fit"]
    assert fit["max_model_len"] == 128 and fit["clamped"] > 0 and fit["skipped"] > 0, fit
    assert f"{fit['clamped']} outputs clamped" in text and f"{fit['skipped']} skipped" in text
    rows = [json.loads(x) for x in (out / "requests.jsonl").open()]
    assert len(rows) == 12 - fit["skipped"] and all(r["status"] == "ok" for r in rows), [
        r["error"] for r in rows if r["status"] != "ok"
    ]
    assert all(r["prompt_len"] + r["output_len"] <= 128 for r in rows)
    assert rc == 0


def turn(i: int, session: str, k: int, prompt: int, output: int) -> RequestSpec:
    return RequestSpec(i, prompt, output, session_id=session, turn=k)


def test_a_session_is_cut_at_the_turn_that_would_overflow() -> None:
    wl = Workload("s", 0, (
        turn(0, "a", 1, 40, 20), turn(1, "a", 2, 30, 20), turn(2, "a", 3, 30, 20),
        turn(3, "a", 4, 30, 20), turn(4, "b", 1, 10, 10), RequestSpec(5, 90, 50),
    ))  # fmt: skip
    fitted, fit = fit_to_context(wl, 128)
    # session a holds 60 tokens after turn 1, 110 after turn 2; turn 3 would start at 140:
    # skipped with turn 4; the lone request's output is clamped to 128 - 90 = 38
    assert [r.index for r in fitted.requests] == [0, 1, 4, 5]
    assert fitted.requests[-1].output_len == 38
    assert (fit.skipped, fit.clamped, fit.sessions_cut) == (2, 1, 1)
    same, none = fit_to_context(Workload("s", 0, (RequestSpec(0, 10, 10),)), 128)
    assert not none.changed and same.requests[0].output_len == 10


def test_a_workload_none_of_whose_requests_fits_is_one_clear_error() -> None:
    import pytest
    from cbbench.harness.errors import CbbenchError

    wl = Workload("huge", 0, (RequestSpec(0, 4000, 10), RequestSpec(1, 3000, 10)))
    with pytest.raises(CbbenchError, match="no request of huge fits the server's max_model_len"):
        fit_to_context(wl, 2048)
