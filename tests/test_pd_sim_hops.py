"""A P/D simulation priced as a real deployment is (#56): the hardware fit's measured KV
hand-off is `sim`'s and `plan`'s default link, named in their output; the decode worker's
KV import costs its step loop time; a from-run fit's request overhead (one server's front
end) is paid on each server hop unless the measured hand-off already holds it. Every
figure is SIMULATED."""

from __future__ import annotations

import json

import pytest
from cbbench.harness.cli import main
from cbbench.harness.errors import CbbenchError
from cbbench.harness.planning.space import parse_space
from cbbench.reference_engine.config.engine_config import EngineConfig
from cbbench.reference_engine.errors import EngineError
from cbbench.reference_engine.execution.cost_model import HardwareSpec, get_hardware
from cbbench.reference_engine.execution.kv_import import IMPORT_FIXED_S, import_rate
from cbbench.reference_engine.execution.kv_link import get_link
from cbbench.reference_engine.router.pd_sim import simulate_pd
from cbbench.reference_engine.sim.pd_link import resolve_link
from cbbench.workloads.spec import RequestSpec

LINK = "bandwidth_gbps=0.2,latency_ms=40"


def fitted(tmp_path, **fit) -> str:
    """A from-run-like fit: 20 ms a step, 10 ms request overhead, `fit` added."""
    spec = HardwareSpec("fit-x", 1.0, 1.0, 80.0, flops_efficiency=1.0, bw_efficiency=1.0,
                        linear={"c0": 0.02},
                        fit={"method": "from-run", "model": "small", "request_overhead_s": 0.01,
                             "request_overhead_per_in_flight_s": 0.0, **fit})  # fmt: skip
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(spec.to_dict()), encoding="utf-8")
    return str(path)


def _pd_sim(tmp_path, hw: str, *extra: str) -> tuple[str, dict]:
    out = tmp_path / "out"
    rc = main(["sim", "--workload", "chat", "--num-requests", "12", "--rate", "2",
               "--hardware", hw, "--model", "small", "--max-model-len", "2048",
               "--prefill-replicas", "1", "--decode-replicas", "1", "--out", str(out), *extra])  # fmt: skip
    assert rc == 0
    return out.name, json.loads((out / "pd_compare.json").read_text())


def test_sim_takes_the_fits_measured_hand_off_and_says_so(tmp_path, capsys):
    hw = fitted(tmp_path, kv_link=LINK)
    _, fit_run = _pd_sim(tmp_path, hw)
    out = capsys.readouterr().out
    assert f"KV link: {LINK} (measured hand-off, fit.kv_link of fit-x)" in out
    assert "request overhead paid once" in out
    assert fit_run["disaggregated"]["link"] == LINK
    _, given = _pd_sim(tmp_path, hw, "--kv-link", "same-node")  # an explicit link wins
    out = capsys.readouterr().out
    assert "KV link: same-node (given); the fit's request overhead paid on both server hops" in out
    assert given["disaggregated"]["link"] == "same-node"
    # 40 ms + 4 MB at 0.2 GB/s vs NVLink, less the decode hop's 10 ms: TTFT far longer
    assert (fit_run["disaggregated"]["ttft_s"]["p50"]
            > given["disaggregated"]["ttft_s"]["p50"] + 0.04)  # fmt: skip
    assert main(["sim", "--workload", "chat", "--num-requests", "3", "--hardware", "h100",
                 "--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link", "fit"]) != 0  # fmt: skip
    assert "carries no fit.kv_link" in capsys.readouterr().err


def test_plan_space_takes_the_fits_link_by_default_and_by_name(tmp_path):
    hw = get_hardware(fitted(tmp_path, kv_link=LINK))
    assert parse_space("kv_link=fit").kv_link == ["fit"]
    with pytest.raises(CbbenchError, match="kv_link"):
        parse_space("kv_link=bogus")
    default = parse_space("mode=disaggregated").configs()[0]["kv_link"]
    assert resolve_link(default, hw).spec == LINK and resolve_link(default, hw).measured
    assert resolve_link(default, get_hardware("h100")).spec == "same-node"
    assert not resolve_link("cross-node", hw).measured
    with pytest.raises(EngineError, match="no fit.kv_link"):
        resolve_link("fit", get_hardware("h100"))


def test_plan_prints_the_link_its_disaggregated_points_used(tmp_path, capsys):
    hw = fitted(tmp_path, kv_link=LINK)
    rc = main(["plan", "--workload", "chat", "--rate", "2", "--slo", "ttft_p99=30s",
               "--hardware", hw, "--model", "small", "--num-requests", "12", "--price", "3", "--space",
               "mode=disaggregated;prefill=1;decode=1..2;replicas=1-3;max_num_seqs=16;"
               "max_num_batched_tokens=512"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"KV link: {LINK} (measured hand-off, fit.kv_link of fit-x)" in out


def _burst(cfg: EngineConfig, link: str = "same-node", **kw):
    """One long decode stream, then a burst of eight 1024-token prompts to import."""
    reqs = [RequestSpec(0, 16, 200, arrival_s=0.0)]
    reqs += [RequestSpec(i, 1024, 2, arrival_s=0.5) for i in range(1, 9)]
    return simulate_pd(reqs, cfg, 1, 1, get_link(link), token_times=True, **kw)


def test_a_burst_of_imports_delays_the_decode_workers_steps(tmp_path):
    slow = 1e8  # 100 MB/s: each import's copy-in is bytes / 1e8 on the decode worker's loop
    hw = fitted(tmp_path, device="cpu", kv_import_bytes_s=slow)
    cfg = EngineConfig(model="small", executor="sim", hardware=hw, max_model_len=2048)
    res = _burst(cfg)
    stream = res.requests[0]
    gaps = [b - a for a, b in zip(stream.token_times_s, stream.token_times_s[1:], strict=False)]
    per_import = IMPORT_FIXED_S + res.requests[1].kv_bytes / slow
    # the 8 imports land on the stream's steps: the gaps they share hold their copy-in
    assert sum(gaps) == pytest.approx(0.02 * len(gaps) + 8 * per_import, rel=0.02)
    assert max(gaps) >= 0.02 + per_import
    assert import_rate(get_hardware(hw)) == (slow, "the fit's kv_import_bytes_s")
    h100 = get_hardware("h100")  # a GPU preset prices one HBM copy: read and write each byte
    assert import_rate(h100)[0] == pytest.approx(h100.mem_bw * h100.bw_efficiency / 2)


def test_the_decode_hop_pays_the_decode_servers_front_end(tmp_path):
    hw = fitted(tmp_path)
    cfg = EngineConfig(model="small", executor="sim", hardware=hw, max_model_len=2048)
    over = {"c_req": 0.01, "c_req_load": 0.002}
    one = _burst(cfg)
    two = _burst(cfg, decode_overhead=over)
    for a, b in zip(one.requests[1:], two.requests[1:], strict=True):
        extra = b.phases()["kv_transfer_s"] - a.phases()["kv_transfer_s"]
        # 10 ms + 2 ms x the decode server's outstanding requests (1..8 at the burst)
        assert 0.012 - 1e-9 <= extra <= 0.01 + 0.002 * 9 + 1e-9
    m = resolve_link(None, get_hardware(fitted(tmp_path, kv_link=LINK)))
    assert m.decode_overhead(over) is None  # the measured hand-off holds it
    assert resolve_link("same-node", get_hardware(hw)).decode_overhead(over) == over
