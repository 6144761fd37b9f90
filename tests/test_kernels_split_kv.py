"""The torch backend's in-place split-KV decode (kernels/torch_split_kv.py) against the oracle
in kernels/reference.py, on block tables laid out as the block manager lays them out: each
prompt one run of consecutive pool blocks, decode blocks interleaved between sequences."""

from __future__ import annotations

import pytest
import torch
from cbbench.kernels import torch_split_kv
from cbbench.kernels.reference import (
    engine_block_tables,
    make_paged_case,
    ref_paged_decode_attention,
)
from cbbench.kernels.torch_backend import TorchAttentionBackend

pytestmark = pytest.mark.skipif(
    not torch_split_kv.available(), reason="needs torch's fused CPU attention with lse"
)
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def case(seq_lens, prompt_lens, block_size, num_kv_heads, group, dtype=torch.float32, seed=0):
    tables, used = engine_block_tables(seq_lens, prompt_lens, block_size)
    c = make_paged_case(seq_lens, [1] * len(seq_lens), block_size, num_kv_heads, group,
                        dtype=dtype, seed=seed)  # fmt: skip
    assert c["k_cache"].shape[0] >= used  # the pool is filled with random K/V everywhere
    return c["q"], c["k_cache"], c["v_cache"], tables, c["seq_lens"]


def backend(min_run_bytes=0):
    be = TorchAttentionBackend(torch.device("cpu"))
    be.paged_kernel = False  # the torch path (the C++ kernel is tested on its own)
    be.split_kv_min_run_bytes = min_run_bytes  # runs of 2+ blocks qualify at test sizes
    return be


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "seq_lens,prompt_lens,block_size,num_kv_heads,group",
    [
        ([70, 9, 33, 1, 48], [40, 9, 20, 1, 48], 8, 2, 4),  # runs, no runs, one token, exact
        ([129, 64, 100], [100, 30, 17], 16, 4, 1),  # no GQA
        ([40, 41], [33, 40], 1, 2, 8),  # block size 1: long runs of single tokens
        ([300, 260], [250, 250], 16, 1, 2),  # several runs to merge per sequence
    ],
)
def test_split_kv_decode_matches_oracle(
    seq_lens, prompt_lens, block_size, num_kv_heads, group, dtype
):
    q, kc, vc, bt, sl = case(seq_lens, prompt_lens, block_size, num_kv_heads, group, dtype)
    be = backend()
    out = be.paged_decode_attention(q, kc, vc, bt, sl, scale=0.3)
    assert be._plan is not None and be._plan.runs  # the in-place path really ran
    assert out.dtype == dtype and out.shape == q.shape
    ref = ref_paged_decode_attention(q, kc, vc, bt, sl, scale=0.3)
    torch.testing.assert_close(out.float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


def test_split_kv_reads_the_runs_in_place():
    """A change inside a run (read through a view, never copied) shows in that sequence."""
    q, kc, vc, bt, sl = case([60, 60], [50, 50], 8, 2, 2)
    be = backend()
    before = be.paged_decode_attention(q, kc, vc, bt, sl, scale=0.25)
    run = be._plan.runs[1]
    assert run[0] == 1  # sequence 1's prompt run
    vc[run[1] + 1] += 1.0
    after = be.paged_decode_attention(q, kc, vc, bt, sl, scale=0.25)
    torch.testing.assert_close(after[0], before[0])
    assert not torch.allclose(after[1], before[1])
    torch.testing.assert_close(after, ref_paged_decode_attention(q, kc, vc, bt, sl, 0.25))


def test_split_kv_replans_when_tables_change_in_place():
    """The per-step plan cache keys on the table tensors and their versions."""
    q, kc, vc, bt, sl = case([60, 45], [50, 40], 8, 2, 2)
    be = backend()
    be.paged_decode_attention(q, kc, vc, bt, sl, scale=0.25)
    first = be._plan
    bt[0, :7] = torch.tensor([20, 21, 22, 23, 24, 25, 26], dtype=torch.int32)
    out = be.paged_decode_attention(q, kc, vc, bt, sl, scale=0.25)
    assert be._plan is not first and be._plan.runs[0][1] == 20
    torch.testing.assert_close(out, ref_paged_decode_attention(q, kc, vc, bt, sl, 0.25))


def test_plan_split_keeps_runs_and_gathers_the_rest():
    # seq 0: blocks 5..9 one run, then 20 and 22 single, 23 last (partial); seq 1: no run
    tables = [[5, 6, 7, 8, 9, 20, 22, 23], [40, 2, 41]]
    plan = torch_split_kv.plan_split(tables, [60, 20], 8, 1, min_run_bytes=0)
    assert plan is not None
    assert plan.runs == [(0, 5, 5)]
    (group,) = plan.rest
    assert group.seqs.tolist() == [0, 1]
    assert group.ids.tolist() == [[20, 22, 23], [40, 2, 41]]
    # seq 0 sees 2 full gathered blocks + 4 tokens of its last; seq 1 all of its 20 tokens
    valid = (group.mask[:, 0, 0] == 0).sum(-1).tolist()
    assert valid == [2 * 8 + 60 - 7 * 8, 20]
    assert plan.seg.tolist() == [0, 1, 0]


def test_plan_split_declines_scattered_tables():
    """Under a quarter of the blocks in runs: the plain gather path is used."""
    tables = [[9, 3, 17, 4, 11, 1, 5, 30]]
    assert torch_split_kv.plan_split(tables, [64], 8, 1, min_run_bytes=0) is None
    be = backend()
    q, kc, vc, bt, sl = case([64, 64], [1, 1], 8, 2, 2)  # decode blocks interleaved
    be.paged_decode_attention(q, kc, vc, bt, sl, scale=0.25)
    assert be._plan is None


def test_plan_split_groups_the_rest_by_width_within_the_budget():
    # gathered widths 1, 4, 2, 4 blocks (runs of 4 read in place); 2 blocks of 1 byte K+V each
    tables = [[1, 2, 3, 4, 9], [10, 20, 30, 40], [11, 12, 13, 14, 50, 60], [70, 80, 90, 99]]
    lens = [40, 32, 48, 30]
    plan = torch_split_kv.plan_split(tables, lens, 8, 1, min_run_bytes=4, gather_bytes=16)
    assert plan is not None and [r[0] for r in plan.runs] == [0, 2]
    assert [g.seqs.tolist() for g in plan.rest] == [[1, 3], [0, 2]]
    assert [g.ids.shape[1] for g in plan.rest] == [4, 2]  # seq 0 pads to 2, not to 4
    assert plan.seg.tolist() == [1, 3, 0, 2, 0, 2]


def test_min_run_bytes_sets_the_run_threshold():
    tables, lens = [[1, 2, 3, 4, 9]], [40]
    assert torch_split_kv.plan_split(tables, lens, 8, 100, min_run_bytes=400).runs == [(0, 1, 4)]
    assert torch_split_kv.plan_split(tables, lens, 8, 100, min_run_bytes=401) is None
