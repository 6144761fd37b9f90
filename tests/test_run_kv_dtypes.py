"""`cbbench run --kv-cache-dtype auto,bf16,int8`: each scheduler once per KV dtype, side by side,
with the KV pool's blocks, the capacity, running sequences and preemptions (issue #29 D).

Through the real CLI entry (`cbbench.harness.cli.main`): simulated runs (`--sim h100`, in
process, virtual time) and one real `cbbench serve` per dtype (slow)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from cbbench.harness.report import build_report


def table(folder: Path) -> dict[str, dict[str, str]]:
    """comparison.md as {column: {row label: cell}}."""
    lines = [
        line
        for line in (folder / "comparison.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("|")
    ]
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines]
    header, body = rows[0], rows[2:]
    return {col: {r[0]: r[i] for r in body} for i, col in enumerate(header) if i > 0}


def row(cols: dict[str, dict[str, str]], prefix: str) -> dict[str, str]:
    """{column: cell} of the row whose label starts with `prefix`."""
    out = {}
    for col, cells in cols.items():
        (label,) = [k for k in cells if k.startswith(prefix)]
        out[col] = cells[label]
    return out


def mean_len(run_dir: Path) -> float:
    recs = [
        json.loads(line)
        for line in (run_dir / "requests.jsonl").read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    return sum(r["prompt_len"] + r["output_len"] for r in recs) / len(recs)


def blocks_of(run_dir: Path) -> tuple[int, int, int]:
    """(num_kv_blocks, block_size, max_model_len) from the run's run.json."""
    meta = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    info = ((meta.get("target") or {}).get("engine") or {}).get("cbbench")
    if info:  # a served run: the engine's describe() from /v1/models
        return info["num_kv_blocks"], info["block_size"], info["max_model_len"]
    return meta["num_kv_blocks"], meta["engine_config"]["block_size"], meta["max_model_len"]


SIM = [
    "run", "--sim", "h100", "--model", "tiny", "--schedulers", "continuous",
    "--kv-cache-memory-gb", "0.001", "--no-live",
]  # fmt: skip


def check_kv_rows(out: Path, names: list[str]) -> dict[str, dict[str, str]]:
    """One column per dtype in order; the blocks shown are run.json's; the capacity follows
    from them."""
    cols = table(out)
    assert list(cols) == names
    shown = row(cols, "KV blocks in the pool")
    cap = row(cols, "capacity, seqs")
    for name in names:
        blocks, bs, max_len = blocks_of(out / name)
        assert shown[name] == f"{blocks} x {bs}"
        at_mean = blocks // math.ceil(math.ceil(mean_len(out / name)) / bs)
        assert cap[name] == f"{at_mean} / {blocks // math.ceil(max_len / bs)}"
    return cols


def test_sim_one_column_per_kv_dtype(tmp_path: Path) -> None:
    out = tmp_path / "r"
    argv = [*SIM, "--num-requests", "32", "--batch-size", "32"]
    rc = main([*argv, "--kv-cache-dtype", "auto,bf16,int8", "--out", str(out)])
    assert rc == 0
    names = ["continuous", "continuous+bf16", "continuous+int8"]
    cols = check_kv_rows(out, names)
    assert row(cols, "KV cache dtype") == dict(zip(names, ["auto", "bf16", "int8"], strict=True))
    fp32, bf16, int8 = (blocks_of(out / n)[0] for n in names)
    assert int8 > bf16 > fp32  # tiny is fp32: the same memory holds more blocks per byte less
    assert int8 >= 1.8 * bf16 and bf16 >= 1.9 * fp32
    # KV-bound: 32 requests at once; fp32's pool preempts, int8's holds them all
    pre = {k: int(v) for k, v in row(cols, "preemptions").items()}
    assert pre["continuous"] > 0 and pre["continuous+int8"] < pre["continuous"]
    peak = {k: int(v.split(" / ")[0]) for k, v in row(cols, "running peak").items()}
    assert peak["continuous+int8"] >= peak["continuous"]
    # the HTML report's runs table has the same KV columns
    rep = build_report([str(out / n) for n in names])
    assert [r["num_kv_blocks"] for r in rep.rows] == [fp32, bf16, int8]
    assert [r["kv_cache_dtype"] for r in rep.rows] == ["auto", "bf16", "int8"]
    assert [r["preemptions"] for r in rep.rows] == [pre[n] for n in names]
    html = (out / "report.html").read_text(encoding="utf-8")
    for title in ("KV dtype", "KV blocks", "capacity (seqs of mean len)", "preemptions"):
        assert f"<th>{title}</th>" in html
    assert [r["kv_capacity"] for r in rep.rows] == [
        int(v.split(" / ")[0]) for v in row(cols, "capacity, seqs").values()
    ]


def test_sim_one_dtype_keeps_plain_names(tmp_path: Path) -> None:
    out = tmp_path / "r"
    rc = main([*SIM, "--num-requests", "4", "--kv-cache-dtype", "int8", "--no-report",
               "--out", str(out)])  # fmt: skip
    assert rc == 0
    cols = check_kv_rows(out, ["continuous"])
    assert row(cols, "KV cache dtype") == {"continuous": "int8"}


def test_sim_static_slots_follow_the_dtypes_pool(tmp_path: Path) -> None:
    """Static batching reserves max_model_len per slot: B shrinks to what each pool holds,
    the capacity at max_model_len (fp32: 1 slot, int8: 3)."""
    out = tmp_path / "r"
    rc = main([*SIM, "--schedulers", "static", "--num-requests", "8", "--kv-cache-dtype",
               "auto,int8", "--no-report", "--out", str(out)])  # fmt: skip
    assert rc == 0
    cols = check_kv_rows(out, ["static", "static+int8"])
    peak = {k: int(v.split(" / ")[0]) for k, v in row(cols, "running peak").items()}
    at_max = {k: int(v.split(" / ")[1]) for k, v in row(cols, "capacity, seqs").items()}
    assert peak == at_max and peak["static+int8"] > peak["static"]


def test_bad_kv_dtype_in_list_is_one_line(tmp_path: Path, capsys) -> None:
    rc = main([*SIM, "--kv-cache-dtype", "auto,int4", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1, err
    assert "--kv-cache-dtype" in err and "int4" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_served_runs_one_per_kv_dtype(tmp_path: Path, capsys) -> None:
    """Two real servers (auto, int8) on 127.0.0.1, 4 short requests each (~30 s here)."""
    wl = tmp_path / "wl.json"
    wl.write_text(json.dumps({
        "name": "kv-small", "num_requests": 4,
        "prompt": {"dist": "constant", "value": 32}, "output": {"dist": "constant", "value": 16},
    }), encoding="utf-8")  # fmt: skip
    out = tmp_path / "r"
    rc = main([
        "run", "--model", "tiny", "--device", "cpu", "--schedulers", "continuous",
        "--workload", str(wl), "--kv-cache-dtype", "auto,int8", "--kv-cache-memory-gb",
        "0.001", "--no-live", "--no-report", "--out", str(out),
    ])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    cols = check_kv_rows(out, ["continuous", "continuous+int8"])
    assert blocks_of(out / "continuous+int8")[0] >= 3.5 * blocks_of(out / "continuous")[0]
    assert row(cols, "requests ok") == {"continuous": "4/4", "continuous+int8": "4/4"}
    assert row(cols, "preemptions") == {"continuous": "0", "continuous+int8": "0"}


def test_kv_dtype_label_names_what_auto_stores() -> None:
    from cbbench.harness.results.compare import kv_dtype_label

    assert kv_dtype_label({"kv_cache_dtype": "auto", "dtype": "bfloat16"}) == "auto (bfloat16)"
    assert kv_dtype_label({"kv_cache_dtype": "auto", "dtype": "auto"}) == "auto"
    assert kv_dtype_label({"kv_cache_dtype": "int8", "dtype": "float32"}) == "int8"
    assert kv_dtype_label({}) is None and kv_dtype_label(None) is None
