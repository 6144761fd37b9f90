"""`cbbench quality` through the real CLI entry: the rows equal the library's, every variant
stays within bounds ~10x what was measured on tiny (docs/quantization.md), bad flags are one
line and exit 2."""

from __future__ import annotations

import json

import pytest
from cbbench.harness.cli import main
from cbbench.reference_engine.execution.kv_quality import Variant, kv_quality, quality

# measured on tiny at the defaults (132 positions, logit scale 32): KL max bf16-KV 1.9e-5,
# int8-KV 1.8e-4, fp8-KV 4.0e-3 (E8M0 scales; 2.2e-4 / 2.2e-3 with the earlier fp16 scales),
# fp16 weights 2.4e-5, bf16 weights 1.7e-3; agreement 1.0 each, int8-KV 0.992, fp8-KV 0.977
KL_MAX = {("float32", "bf16"): 2e-4, ("float32", "int8"): 2e-3, ("float32", "fp8"): 2e-2,
          ("float16", "auto"): 2e-4, ("bfloat16", "auto"): 2e-2}  # fmt: skip


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("q") / "quality.json"
    argv = ["quality", "--kv-cache-dtype", "bf16,int8,fp8", "--dtype", "float16,bfloat16",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    return json.loads(out.read_text())


def test_rows_equal_the_library(rows: list[dict]) -> None:
    lib = quality("tiny", [Variant("float32", "int8"), Variant("bfloat16", "auto")])
    by = {(r["dtype"], r["kv_cache_dtype"]): r for r in rows}
    for r in lib:
        assert by[(r.dtype, r.kv_cache_dtype)] == r.to_dict()
    assert kv_quality("tiny", "int8").to_dict() == by[("float32", "int8")]


def test_variants_within_bounds(rows: list[dict]) -> None:
    assert {(r["dtype"], r["kv_cache_dtype"]) for r in rows} == set(KL_MAX)
    for r in rows:
        key = (r["dtype"], r["kv_cache_dtype"])
        assert r["greedy_agreement"] >= 0.95, key
        assert r["kl_max"] <= KL_MAX[key], key
        assert r["kl_mean"] <= r["kl_max"] and r["logprob_diff_mean"] <= r["logprob_diff_max"]
        assert r["top1_prob_mean"] > 0.3  # peaked: uniform over tiny's vocab would be 0.002
        assert r["kl_max"] > 0  # a variant differs from the reference at all


def test_table_prints_each_variant(capsys) -> None:
    assert main(["quality", "--kv-cache-dtype", "int8", "--num-seqs", "1", "--gen-len", "2"]) == 0
    out = capsys.readouterr().out
    assert "int8" in out and "greedy agree" in out and "logit scale 32" in out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--dtype", "bf16"], "--dtype: unknown dtype 'bf16'"),
        (["--kv-cache-dtype", "int4"], "--kv-cache-dtype: unknown dtype 'int4'"),
        (["--gen-len", "-1"], "--gen-len"),
        (["--logit-scale", "0"], "--logit-scale"),
        (["--out", "/nonexistent/dir/q.json", "--num-seqs", "1", "--gen-len", "0"], "--out"),
    ],
)
def test_bad_flags_one_line_exit_2(argv: list[str], needle: str, capsys) -> None:
    assert main(["quality", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([e for e in err if "error" in e]) == 1 and needle in err[-1]
