"""`cbbench plan` (harness/planning/planner.py): the cheapest simulated configuration that
meets the SLOs, checked against a brute-force search of the same small space; parallel and
sequential searches agree; an interrupt keeps what was searched; bad input gets one line."""

from __future__ import annotations

import json

import pytest
from cbbench.harness.cli import main
from cbbench.harness.errors import CbbenchError
from cbbench.harness.planning import planner
from cbbench.harness.planning import space as plan_space
from cbbench.workloads import load_workload, with_arrivals

SPACE = "max_num_seqs=4,16;max_num_batched_tokens=512;replicas=1-4"


def options(**kw) -> planner.PlanOptions:
    base = dict(
        workload="chat", rate=40.0, slos=plan_space.parse_slos("ttft_p99=1500ms,tpot_p99=60ms"),
        hardware="a100", price_per_replica_hour=2.0, space=plan_space.parse_space(SPACE),
        num_requests=80,
    )  # fmt: skip
    return planner.PlanOptions(**{**base, **kw})


def test_slo_and_space_parsing():
    slos = plan_space.parse_slos("ttft_p99=2s, tpot_p50=100ms,e2e_max=30s")
    assert [(s.name, s.target_s) for s in slos] == [
        ("ttft_p99", 2.0), ("tpot_p50", 0.1), ("e2e_max", 30.0)]  # fmt: skip
    sp = plan_space.parse_space("replicas=2-6;scheduler=continuous,static;chunked_prefill=on,off")
    assert (sp.min_replicas, sp.max_replicas) == (2, 6)
    # static has no token budget or chunking: one entry per max_num_seqs
    assert sum(c["scheduler"] == "static" for c in sp.configs()) == len(sp.max_num_seqs)
    for bad in ("ttft=2", "ttft_p99", "queue_p99=1s", "ttft_p99=fast", "ttft_p42=1s"):
        with pytest.raises(CbbenchError):
            plan_space.parse_slos(bad)
    # bench's grammar (issue 51): a bare metric is every request within it, the max
    assert [(s.name, s.target_s) for s in plan_space.parse_slos("ttft=2s")] == [("ttft_max", 2.0)]
    for bad in ("max_num_seqs=x", "router=nearest", "colour=red", "chunked_prefill=maybe"):
        with pytest.raises(CbbenchError):
            plan_space.parse_space(bad)


def test_chosen_is_the_cheapest_that_meets_by_brute_force():
    opts = options()
    res = planner.plan(opts)
    assert res.chosen is not None and res.chosen.verdict == planner.MEETS
    wl = load_workload("chat", seed=0, num_requests=80)
    wl = with_arrivals(wl, "poisson", rate=opts.rate, seed=wl.seed)
    every = [
        planner.evaluate(opts, res.model, wl.requests, c, r, wl.prompt_seed, wl.prefix_block_size)
        for c in opts.space.configs()
        for r in range(1, 5)
    ]
    cheapest = min(p.cost_per_hour for p in every if p.verdict == planner.MEETS)
    assert res.chosen.cost_per_hour == cheapest
    # the search pruned: fewer points than the brute force, and each point's figures are
    # the brute force's for the same configuration and replicas
    assert len(res.points) < len(every)
    same = {(json.dumps(p.config, sort_keys=True), p.replicas): p.predicted for p in every}
    for p in res.points:
        assert p.predicted == pytest.approx(same[(json.dumps(p.config, sort_keys=True),
                                                  p.replicas)])  # fmt: skip
    # verdicts follow the interval: meets = its top within every target
    for p in every:
        tops_ok = all(p.high[s.name] <= s.target_s for s in opts.slos)
        assert (p.verdict == planner.MEETS) == tops_ok
        assert p.low[p.binding] <= p.predicted[p.binding] <= p.high[p.binding]
    f = res.frontier
    assert [p.cost_per_hour for p in f] == sorted(p.cost_per_hour for p in f)
    assert all(b.binding_ratio < a.binding_ratio for a, b in zip(f, f[1:], strict=False))


def test_parallel_search_agrees_with_sequential():
    seq, par = planner.plan(options()), planner.plan(options(jobs=2))
    assert par.chosen is not None and seq.chosen is not None
    assert (par.chosen.config, par.chosen.replicas) == (seq.chosen.config, seq.chosen.replicas)


def test_interrupt_keeps_what_was_searched():
    calls = []

    def progress(done: int, total: int) -> None:
        calls.append(done)
        raise KeyboardInterrupt  # Ctrl-C after the first configuration

    res = planner.plan(options(), on_progress=progress)
    assert res.interrupted and res.searched == 1 and res.total == 2
    assert res.points and all(p.config == res.points[0].config for p in res.points)


def test_configurations_the_engine_refuses_are_skipped_and_said(capsys):
    # without chunked prefill the token budget must hold max_model_len: 512 cannot
    opts = options(space=plan_space.parse_space(SPACE + ";chunked_prefill=on,off"))
    res = planner.plan(opts)
    assert len(res.refused) == 2 and "chunked prefill" in res.refused[0]
    assert res.chosen is not None and res.chosen.config["chunked_prefill"]


def test_a_plan_per_rate(tmp_path, capsys):
    rc = main(["plan", "--rate", "10,40", "--slo", "ttft_p99=1500ms", "--hardware", "a100",
               "--price", "2", "--space", SPACE, "--num-requests", "60", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0
    chosen = [json.loads((tmp_path / f"rate-{r}" / "plan.json").read_text())["chosen"]
              for r in (10, 40)]  # fmt: skip
    assert chosen[0]["cost_per_hour"] <= chosen[1]["cost_per_hour"]
    assert capsys.readouterr().out.count("chosen:") == 2


def test_cli_prints_frontier_flags_and_writes_html(tmp_path, capsys):
    rc = main(["plan", "--rate", "40", "--slo", "ttft_p99=1500ms,tpot_p99=60ms", "--hardware",
               "a100", "--price", "2", "--space", SPACE, "--num-requests", "80", "--out",
               str(tmp_path)])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    assert "Pareto frontier" in out and "chosen:" in out
    # what every configuration shares is said once; the rows name what varies (seqs here)
    fixed = next(x for x in out.splitlines() if x.startswith("every configuration: "))
    assert "continuous" in fixed and "tokens=512" in fixed and "seqs=" not in fixed, fixed
    table = out[out.index("Pareto frontier") : out.index("chosen:")]
    assert "seqs=" in table and "tokens=512" not in table and "continuous" not in table
    assert "cbbench serve --model llama-3-8b --scheduler continuous --max-num-seqs" in out
    # a model id vLLM accepts: the preset's Hugging Face checkpoint (issue 51)
    assert "vllm serve meta-llama/Meta-Llama-3-8B-Instruct --max-num-seqs" in out
    # the chosen line whole (it wrapped mid-phrase at 80 columns: "(ttft_p99 \nmeets; ...")
    chosen = next(x for x in out.splitlines() if x.startswith("chosen: "))
    assert "; binding " in chosen and chosen.rstrip().endswith("]"), out
    doc = json.loads((tmp_path / "plan.json").read_text())
    assert doc["simulated"] and doc["chosen"]["verdict"] == "meets"
    page = (tmp_path / "plan.html").read_text()
    assert "<svg" in page and "<polyline" in page and "SIMULATED" in page
    # a legend for the verdict colours, the target line at 1 and the chosen point ringed
    for text in ("meets</text>", "too close to call</text>", "misses</text>",
                 'text-anchor="end">1</text>', 'r="9" fill="none"'):  # fmt: skip
        assert text in page, text


@pytest.mark.parametrize(
    "argv,says",
    [
        (["--slo", "ttft_p99=1ms", "--space", SPACE], "no configuration in the space meets"),
        (["--slo", "ttft_p99=1s", "--space", "max_num_seqs="], "the search space is empty"),
        (["--slo", "ttft_p99=1s", "--space", "replicas=4-2"], "the search space is empty"),
        (["--slo", "ttft_p99=1s", "--model", "tiny", "--hardware", "FIT"], "was fitted on"),
        (["--slo", "tpot_p42=1s"], "--slo"),
        (["--slo", "ttft_p99=1s", "--rate", "0"], "--rate must be > 0"),
        (["--slo", "ttft_p99=1s", "--rate", "fast"], "--rate: 'fast' is not a number"),
        # bench's vLLM-style --goodput is not plan's share; a percentage without the % sign
        (["--slo", "ttft_p99=1s", "--goodput-share", "ttft:200"], "put the targets in --slo"),
        (["--slo", "ttft_p99=1s", "--goodput-share", "95"], "did you mean 0.95?"),
        (["--slo", "ttft_p99=1s", "--hardware", "a100@0"], "after @ give a factor > 0"),
        (
            ["--slo", "ttft_p99=1s", "--space", "max_num_seqs=16;speculative=draft:nosuch:3"],
            "the engine refuses every configuration in the space",
        ),
    ],
)
def test_bad_input_gets_one_line(argv, says, tmp_path, capsys):
    fit = tmp_path / "fit.json"
    fit.write_text(json.dumps({"name": "cpu-fit", "peak_flops": 1e10, "mem_bw": 5e9,
                               "mem_gb": 2, "fit": {"model": "small"}}))  # fmt: skip
    argv = [str(fit) if a == "FIT" else a for a in argv]
    base = ["plan", "--rate", "40", "--hardware", "a100", "--price", "1", "--num-requests", "40"]
    rc = main(base + argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert says in err[0] and err[0].startswith("cbbench plan: error:")
    if "meets" in says:
        assert "widen the space" in err[0]


@pytest.mark.slow
def test_ctrl_c_keeps_what_was_searched(tmp_path):
    """A real SIGINT to `cbbench plan` mid-search: exit 130, plan.json with what was
    searched, marked interrupted."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "plan"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cbbench.harness.cli", "plan", "--rate", "40", "--slo",
         "ttft_p99=1500ms", "--hardware", "a100", "--price", "1", "--num-requests", "600",
         "--space", "max_num_seqs=4,8,16,32,64,128,256,512;replicas=1-64;"
         "max_num_batched_tokens=512,1024,2048,4096,8192,16384;chunked_prefill=on,off",
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        time.sleep(12)  # past start-up, inside the search (it takes minutes in all)
        assert proc.poll() is None, "the search ended before the interrupt"
        os.kill(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stdout
    doc = json.loads((out / "plan.json").read_text())
    assert doc["interrupted"] and doc["searched"] < doc["total"]
    assert "Traceback" not in stderr


def test_interval_bounds_are_simulated_so_queueing_widens_them():
    """The interval's top is the run simulated with every step (1 + high) times as long:
    far from saturation it is the proportional figure; near it queueing makes TTFT grow
    more than in proportion, as it would on a slower real server."""
    opts = options(rate=5.0)
    wl = load_workload("chat", seed=0, num_requests=200)
    c = opts.space.configs()[1]  # max_num_seqs 16: one replica near saturation at 5 req/s
    assert c["max_num_seqs"] == 16
    wl = with_arrivals(wl, "poisson", rate=opts.rate, seed=wl.seed)
    args = (wl.requests, c)
    idle, busy = (planner.evaluate(opts, "llama-3-8b", *args, r, wl.prompt_seed, wl.prefix_block_size)
                  for r in (4, 1))  # fmt: skip
    band = 1.0 + planner.UNMEASURED_BAND  # a100: never measured, error unknown
    ttft = "ttft_p99"
    assert idle.high[ttft] / idle.predicted[ttft] == pytest.approx(band, rel=0.05)
    assert busy.high[ttft] / busy.predicted[ttft] > 1.3 * band  # 1.56 when written
    assert busy.low[ttft] / busy.predicted[ttft] < 0.8 / band  # 0.54
    for p in (idle, busy):
        assert p.low[ttft] <= p.predicted[ttft] <= p.high[ttft]


def test_goodput_share_takes_a_share_or_a_percentage():
    from cbbench.harness.cli.plan import goodput_share

    assert goodput_share("0.95") == goodput_share("95%") == pytest.approx(0.95)
    assert goodput_share("1") == 1.0


def test_scaled_hardware_stretches_every_step():
    from cbbench.reference_engine.errors import EngineError
    from cbbench.reference_engine.execution.cost_model import CostModel, get_hardware
    from cbbench.reference_engine.model.config import resolve_model_config

    for name, model in (("h100", "llama-3-8b"), ("cpu-measured", "small")):
        mc = resolve_model_config(model)
        a = CostModel(mc, get_hardware(name), "bfloat16")
        b = CostModel(mc, get_hardware(f"{name}@1.25"), "bfloat16")
        for chunks in ([(0, 300, True)], [(900, 1, True)] * 7 + [(0, 64, True)]):
            assert b.step_time(chunks) == pytest.approx(1.25 * a.step_time(chunks), rel=1e-9)
    for bad in ("h100@0", "h100@-1", "h100@fast", "h100@inf"):
        with pytest.raises(EngineError, match="after @"):
            get_hardware(bad)


def test_speculative_decoding_is_in_the_space():
    """speculative=off,ngram:K,draft:MODEL:K: continuous configurations only; the simulator
    prices the verify step and models acceptance (--spec-acceptance-rate); at low load
    speculation cuts TPOT; the chosen flags carry it to cbbench serve and vLLM."""
    from cbbench.harness.planning import report as plan_report

    sp = plan_space.parse_space("scheduler=continuous,static;max_num_seqs=16;"
                                "speculative=off,ngram:4,draft:tiny:3")  # fmt: skip
    cfgs = sp.configs()
    assert sorted({c["speculative"] for c in cfgs if c["scheduler"] == "continuous"}) == [
        "draft:tiny:3", "ngram:4", "off"]  # fmt: skip
    assert [c["speculative"] for c in cfgs if c["scheduler"] == "static"] == ["off"]
    for bad in ("ngram", "ngram:0", "draft:4", "medusa:2"):
        with pytest.raises(CbbenchError, match="speculative"):
            plan_space.parse_space(f"speculative={bad}")
    opts = options(rate=2.0, spec_acceptance_rate=0.8,
                   space=plan_space.parse_space("max_num_seqs=16;max_num_batched_tokens=512;"
                                                "replicas=1-1;speculative=off,ngram:4"))  # fmt: skip
    wl = load_workload("chat", seed=0, num_requests=60)
    wl = with_arrivals(wl, "poisson", rate=opts.rate, seed=wl.seed)
    off, ngram = (planner.evaluate(opts, "llama-3-8b", wl.requests, c, 1, wl.prompt_seed,
                                   wl.prefix_block_size) for c in opts.space.configs())  # fmt: skip
    assert ngram.config["speculative"] == "ngram:4"
    assert ngram.predicted["tpot_p99"] < 0.7 * off.predicted["tpot_p99"]
    assert "--speculative-method ngram --num-speculative-tokens 4" in plan_report.serve_flags(
        ngram, "llama-3-8b")  # fmt: skip
    assert '"method": "ngram", "num_speculative_tokens": 4' in plan_report.vllm_flags(
        ngram, "llama-3-8b")  # fmt: skip
    assert "spec" not in plan_report.serve_flags(off, "llama-3-8b")


def test_a_workload_longer_than_the_model_is_one_clear_error_up_front(capsys):
    """chat's 2,048-token outputs do not fit tiny's 2,048-token context: the plan said only
    that the engine refused every configuration (after simulating); now it names the workload,
    the model's max_model_len and the longest request before any simulation, and
    --drop-too-long plans the rest."""
    wl = load_workload("chat", seed=0, num_requests=600)
    opts = options(model="tiny", num_requests=600)
    with pytest.raises(CbbenchError, match=r"--workload chat: 2 of 600 requests exceed --model "
                       r"tiny's max_model_len \(2048 tokens\).*--drop-too-long"):  # fmt: skip
        planner.plan(opts)
    kept, dropped = planner.fit_context(wl, "tiny", options(model="tiny", drop_too_long=True))
    assert dropped == 2 and len(kept) == 598
    assert all(r.prompt_len + r.output_len <= 2048 for r in kept.requests)
    assert planner.fit_context(wl, "llama-3-8b", opts) == (wl, 0)  # 8k context: all fit
    code = main(["plan", "--model", "tiny", "--workload", "chat", "--rate", "2", "--slo",
                 "ttft_p99=2s", "--hardware", "h100", "--price", "1"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "max_model_len (2048 tokens)" in err and "Traceback" not in err


@pytest.mark.parametrize("command", [
    ["plan", "--rate", "2", "--slo", "ttft_p99=2s", "--hardware", "h100", "--price", "1"],
    ["sim"],
    ["run"],  # measured: no server is started for nothing
])  # fmt: skip
def test_an_empty_workload_file_is_one_error_not_a_table_of_dashes(tmp_path, capsys, command):
    """plan said every configuration misses at an infinite TTFT, sim printed a table of
    dashes and `run` started three servers to send nothing, each exiting 0 but plan."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code = main([*command, "--workload", str(empty), *(["--out", str(tmp_path / "o")]
                                                        if command == ["run"] else [])])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and f"--workload {empty}: no requests" in err, err
    assert not (tmp_path / "o").exists()
