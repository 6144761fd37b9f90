"""`run_bench` against the reference engine's real server (subprocess, tiny random model):
token-id prompts, return_token_ids, usage and the `cbbench` response fields end up in the
records exactly."""

import io
from importlib.metadata import version

from cbbench.harness.load.runner import BenchConfig, run_bench
from cbbench.harness.servers.launcher import launch_reference_server
from cbbench.workloads import load_workload
from rich.console import Console


def test_bench_against_reference_engine(tmp_path):
    wl = load_workload("seed-demo", seed=0)
    with launch_reference_server(model="tiny", scheduler="continuous") as server:
        for endpoint in ("completions", "chat"):
            cfg = BenchConfig(
                base_url=server.base_url,
                workload=wl,
                endpoint=endpoint,
                concurrency=3,
                out_dir=tmp_path / endpoint,
                live=False,
            )
            res = run_bench(cfg, console=Console(file=io.StringIO()))
            recs = res.records
            assert len(recs) == 6 and all(r.ok for r in recs), [r.error for r in recs]
            for r in recs:
                assert r.output_tokens_client == r.output_tokens_server == r.output_len
                assert len(r.token_times_s) == r.output_len and len(r.itl_s) == r.output_len - 1
                assert r.server_queue_s is not None and r.server_queue_s >= 0
                assert r.extra["scheduler"] == "continuous"
                if endpoint == "completions":  # token-id prompts: exact on both sides
                    assert r.prompt_tokens_client == r.prompt_tokens_server == 32
            s = res.summary
            assert s["counts"]["short_outputs"] == 0 and s["counts"]["failed"] == 0
            if endpoint == "completions":
                assert s["counts"]["prompt_token_mismatch"] == 0
            assert res.meta["target"]["scheduler"] == "continuous"
            assert res.meta["target"]["model"] == "tiny"
            # the engine's self-description from /v1/models is kept with the run
            assert res.meta["target"]["engine"]["cbbench"]["attention_backend"] == "torch"
            # and its version: the report's provenance line said "(version not reported)"
            ident = res.meta["environment"]["server"]
            assert ident["name"] == "cbbench" and ident["version"] == version("cbbench")
