"""Exact text prompt lengths (issue 42, finding 8): `--endpoint chat --workload chat` on the
bundled engine sent prompts whose lengths differed from the server's counts in 39 of 40
requests (+268 tokens on average: one token per word assumed, the byte tokenizer spends four
or five). A server exposing `/tokenize` (vLLM, the reference engine) now gets text of the
exact length; a server without one gets a warning with the measured mismatch."""

from __future__ import annotations

import httpx
import pytest
from cbbench.harness.cli import main
from cbbench.harness.results.run_folder import load_run
from cbbench.harness.servers import fake_server
from cbbench.harness.servers.launcher import launch_reference_server
from servers.fake import FakeServerConfig, threaded

from tests.diagnose_support import hardware_file, sim_args

FLAGS = ["--no-live", "--no-server-metrics", "--no-gpu-metrics", "--concurrency", "8"]


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory):
    """One bundled engine (simulated, 1 ms steps) for the module's tests: they only read its
    token counts, which no earlier run changes."""
    hw = hardware_file(tmp_path_factory.mktemp("exact"), c0=0.001, c_seq=0.0)
    with launch_reference_server("tiny", "continuous", "cpu", sim_args(hw)) as srv:
        yield srv.base_url


def test_chat_prompts_on_the_bundled_engine_are_exact(engine_url, tmp_path, capsys) -> None:
    tok = httpx.post(engine_url + "/tokenize", json={"prompt": "the"}, timeout=10).json()
    assert tok["count"] == 3 and tok["max_model_len"] == 2048  # vLLM's shape, bytes here
    chat = ["bench", "--base-url", engine_url, "--endpoint", "chat", "--workload", "chat",
            "--num-requests", "40", "--out", str(tmp_path / "chat"), *FLAGS]  # fmt: skip
    assert main(chat) == 0
    text = ["bench", "--base-url", engine_url, "--text-prompts", "--workload", "mixed",
            "--num-requests", "24", "--out", str(tmp_path / "text"), *FLAGS]  # fmt: skip
    assert main(text) == 0
    assert "text prompts: exact lengths" in capsys.readouterr().err
    run = load_run(tmp_path / "chat")
    fit = run.meta["text_prompts"]
    assert fit["lengths"] == "exact"
    overhead = fit["fit"]["chat_overhead"]
    assert overhead is not None and overhead > 0  # the engine's chat template, measured
    recs = [r for r in run.records if not r.warmup]
    assert len(recs) == 40 and all(r.ok for r in recs)
    assert all(r.prompt_tokens_client == r.prompt_tokens_server for r in recs)
    assert all(r.prompt_tokens_server == r.prompt_len + overhead for r in recs)
    assert run.meta["summary"]["counts"]["prompt_token_mismatch"] == 0
    recs = load_run(tmp_path / "text").records  # completions with text: exactly prompt_len
    assert recs and all(r.ok and r.prompt_tokens_server == r.prompt_len for r in recs)


def test_a_server_without_tokenize_gets_the_measured_mismatch(tmp_path, capsys, monkeypatch):
    # a server that counts two tokens per word and has no /tokenize (404)
    monkeypatch.setattr(
        fake_server,
        "_prompt_len",
        lambda body: (
            2 * len(" ".join(str(m.get("content", "")) for m in body.get("messages", [])).split())
        ),
    )
    with threaded(FakeServerConfig()) as srv:
        argv = ["bench", "--base-url", srv.url, "--endpoint", "chat", "--workload", "uniform",
                "--num-requests", "10", "--out", str(tmp_path / "r"), *FLAGS]  # fmt: skip
        assert main(argv) == 0
    out = capsys.readouterr()
    assert "text prompts: approximate lengths" in out.err and "has no /tokenize" in out.err
    printed = out.out + out.err
    assert "warning: 10 prompts differ in length from the server's count" in printed
    run = load_run(tmp_path / "r")
    assert run.meta["text_prompts"]["lengths"] == "approximate"
    r = run.records[0]
    assert r.prompt_tokens_server == 2 * r.prompt_tokens_client
    assert run.meta["summary"]["prompt_token_mismatch_mean"] > 0


def test_responses_and_messages_prompts_on_the_bundled_engine_are_exact(
    engine_url, tmp_path, capsys
):
    # `--endpoint responses|messages` sent one-token-per-word text (+623 tokens on average on
    # the byte tokenizer, a third of the `mixed` requests past the 2,048-token context): only
    # chat asked the server's /tokenize for a fit
    for endpoint in ("responses", "messages"):
        argv = ["bench", "--base-url", engine_url, "--endpoint", endpoint,
                "--workload", "mixed", "--num-requests", "12",
                "--out", str(tmp_path / endpoint), *FLAGS]  # fmt: skip
        assert main(argv) == 0
    assert capsys.readouterr().err.count("text prompts: exact lengths") == 2
    for endpoint in ("responses", "messages"):
        run = load_run(tmp_path / endpoint)
        assert run.meta["text_prompts"]["lengths"] == "exact"
        overhead = run.meta["text_prompts"]["fit"]["chat_overhead"]
        recs = [r for r in run.records if not r.warmup]
        assert len(recs) == 12 and all(r.ok for r in recs), endpoint
        assert all(r.prompt_tokens_server == r.prompt_len + overhead for r in recs), endpoint
        assert run.meta["summary"]["counts"]["prompt_token_mismatch"] == 0
