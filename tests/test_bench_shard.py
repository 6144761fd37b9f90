"""One workload over several hosts on loopback: `cbbench bench --shard I/3 --start-at T` as
three concurrent processes against one server, then `cbbench merge`. Every request once,
sessions on one shard, the shards are the `--workers 3` split, one t0 on the wall clock, the
merged summary is `summarize` of the merged records and matches a `--workers 3` run on its
deterministic fields; merges of folders that are not one run's shards are refused."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from cbbench.harness.client.api import ClientConfig
from cbbench.harness.conclusions.window import add_window_summary, run_lead
from cbbench.harness.errors import CbbenchError
from cbbench.harness.load.options import LoadOptions
from cbbench.harness.load.runner import BenchConfig, _plans, run_bench
from cbbench.harness.load.shards import Shard, parse_shard, parse_start_at
from cbbench.harness.report import build_report
from cbbench.harness.results.merge import merge_runs
from cbbench.harness.results.run_folder import load_run
from cbbench.harness.results.summary import summarize
from rich.console import Console
from servers.fake import Behavior, FakeServerConfig, threaded

CLI = [sys.executable, "-m", "cbbench.harness.cli"]
SPEC = {
    "prompt": {"dist": "constant", "value": 16},
    "output": {"dist": "uniform", "min": 3, "max": 6},
    "session": {
        "turns": {"dist": "uniform", "min": 1, "max": 3},
        "think_ms": {"dist": "constant", "value": 2},
        "message": {"dist": "constant", "value": 8},
    },
}
N_REQ, RATE, CONC, SEED = 30, 6.0, 6, 5  # ~2 s: a client sample a second
# keys the runner (or merge) adds beside `summarize`'s, and those derived from the workers'
# self-check samples that requests.jsonl does not hold
RUNNER_KEYS = {"cancelled_in_flight", "connections", "timestamp_source", "client", "shards",
               "prefix_cache", "agent", "steady_window", "window_figures", "lead",
               "lead_note"}  # fmt: skip
CLIENT_SAMPLE_KEYS = {"client_bound", "client_bound_reason"}


def _spec(tmp: Path) -> Path:
    path = tmp / "sessions.json"
    path.write_text(json.dumps(SPEC), encoding="utf-8")
    return path


def _load(spec: Path) -> LoadOptions:
    return LoadOptions(
        workload=str(spec), seed=SEED, num_requests=N_REQ, rate=RATE, concurrency=CONC, warmup=2
    )


def _cfg(spec: Path, **kw) -> BenchConfig:
    wl = _load(spec).build_workload()
    return BenchConfig(base_url="", workload=wl, concurrency=CONC, warmup=2, live=False, **kw)


def test_shard_i_is_worker_i_of_the_same_split(tmp_path):
    spec = _spec(tmp_path)
    client = ClientConfig(base_url="http://127.0.0.1:9", model="m")
    by_workers = _plans(_cfg(spec, workers=3), client)
    shards = [_plans(_cfg(spec, shard=Shard(i, 3)), client)[0] for i in range(3)]
    assert [len(p) for p in ([*by_workers], shards)] == [3, 3]
    for w, s in zip(by_workers, shards, strict=True):
        assert [j.index for j in s.jobs] == [j.index for j in w.jobs]
        assert [j.index for j in s.warmup_jobs] == [j.index for j in w.warmup_jobs]
        assert s.concurrency == w.concurrency
    indices = sorted(j.index for s in shards for j in s.jobs)
    assert indices == list(range(N_REQ))  # every request on exactly one shard
    assert sum(s.concurrency for s in shards) == CONC  # 2 + 2 + 2
    where = {j.session_id: k for k, s in enumerate(shards) for j in s.jobs}
    for k, s in enumerate(shards):  # a session's turns all on one shard
        assert all(where[j.session_id] == k for j in s.jobs)
    # a shard with --workers 2 splits its part again, and still sends exactly its part
    two = _plans(_cfg(spec, shard=Shard(1, 3), workers=2), client)
    assert sorted(j.index for p in two for j in p.jobs) == sorted(j.index for j in shards[1].jobs)
    assert sum(p.concurrency for p in two) == shards[1].concurrency


def test_shard_and_start_at_parse():
    assert parse_shard("2/3") == Shard(2, 3) and str(parse_shard(" 0/1 ")) == "0/1"
    now = 1_800_000_000.0
    assert parse_start_at(str(now + 10), now) == now + 10
    assert parse_start_at("2027-01-15T08:00:10Z", now) == pytest.approx(now + 10)
    assert parse_start_at("2027-01-15T09:00:10+01:00", now) == pytest.approx(now + 10)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--shard", "3/3"], "--shard 3/3: I is 0-based, from 0 to 2"),
        (["--shard", "1"], "--shard 1: expected I/N"),
        (["--shard", "0/0"], "--shard 0/0: expected I/N with N >= 1"),
        (["--shard", "a/b"], "--shard a/b: expected I/N"),
        (["--start-at", "soon"], "--start-at soon: expected unix seconds or an ISO time"),
        (["--start-at", "2020-01-01T00:00:00Z"], "s in the past"),
        (["--start-at", str(time.time() + 7200)], "more than 3600 s"),
        (["--start-at", "2030-01-01T00:00:00"], "give the time zone"),
        (["--shard", "0/4", "--concurrency", "2"], "--concurrency 2 leaves a shard no slot"),
    ],
)
def test_bad_shard_flags_are_one_line(tmp_path, capsys, flags, message):
    code = main(
        ["bench", "--base-url", "http://127.0.0.1:9", "--workload", "seed-demo", "--no-live",
         "--out", str(tmp_path / "r"), *flags]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and message in err, err
    assert err.strip().count("\n") == 0 and "Traceback" not in err


def _bench_argv(url: str, spec: Path, out: Path, *extra: str) -> list[str]:
    return [
        *CLI, "bench", "--base-url", url, "--workload", str(spec), "--seed", str(SEED),
        "--num-requests", str(N_REQ), "--rate", str(RATE), "--concurrency", str(CONC),
        "--warmup", "2", "--no-live", "--no-server-metrics", "--no-gpu-metrics",
        "--slo", "ttft=1s", "--out", str(out), *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Three shards run at once against one server, started at one wall-clock time, and a
    `--workers 3` run of the same workload for comparison."""
    tmp = tmp_path_factory.mktemp("shards")
    spec = _spec(tmp)
    with threaded(FakeServerConfig(Behavior(itl_s=0.002))) as srv:
        start = time.time() + 10.0  # after three interpreters have started on 2 busy cores
        procs = [
            subprocess.Popen(
                _bench_argv(
                    srv.url, spec, tmp / f"s{i}", "--shard", f"{i}/3", "--start-at", f"{start:.6f}"
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for i in range(3)
        ]
        outs = [p.communicate(timeout=120) for p in procs]
        for p, (_, err) in zip(procs, outs, strict=True):
            assert p.returncode == 0, err[-2000:]
        cfg = _cfg(spec, workers=3, out_dir=tmp / "w3", slo={"ttft": 1.0})
        cfg.base_url = srv.url
        workers3 = run_bench(cfg, console=Console(file=open(tmp / "w3.txt", "w"), width=200))  # noqa: SIM115
    return {"tmp": tmp, "spec": spec, "start": float(f"{start:.6f}"), "w3": workers3}


def _merge_cli(out: Path, *dirs: Path, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    argv = [*CLI, "merge", "--out", str(out), *map(str, dirs), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_three_shards_merge_into_one_run(shards):
    tmp = shards["tmp"]
    dirs = [tmp / f"s{i}" for i in range(3)]
    parts = [load_run(d) for d in dirs]
    for i, run in enumerate(parts):
        assert run.meta["shard"]["index"] == i and run.meta["shard"]["count"] == 3
        assert run.meta["load"]["concurrency"] == 2  # its share of --concurrency 6
        assert run.meta["clock"]["start_at_unix_s"] == shards["start"]
        assert run.meta["clock"]["t0_unix_s"] == shards["start"]  # one t0 on the wall clock
        assert run.meta["clock"]["kernel"]["source"] in ("adjtimex", None)
    proc = _merge_cli(tmp / "merged", *reversed(dirs))  # any order
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "merged 3 shard(s)" in proc.stdout and "shard 2/3:" in proc.stdout
    merged = load_run(tmp / "merged")
    recs = [r for r in merged.records if not r.warmup]
    # every request exactly once, none lost; the warm-up copies once each too
    assert sorted(r.index for r in recs) == list(range(N_REQ))
    assert sorted(r.index for r in merged.records if r.warmup) == [0, 1]
    assert all(r.ok for r in merged.records), [r.error for r in merged.records if not r.ok][:3]
    # each shard sent what worker i of --workers 3 sent; its records are worker i's here
    w3 = shards["w3"].records
    for i, run in enumerate(parts):
        mine = sorted(r.index for r in run.records if not r.warmup)
        assert mine == sorted(r.index for r in w3 if r.worker == i and not r.warmup)
        assert mine == sorted(r.index for r in recs if r.worker == i)
        assert run.meta["shard"]["requests"] == len(mine)
    # sessions whole on one shard, turn after turn
    sessions: dict[str, list] = {}
    for r in recs:
        sessions.setdefault(r.session_id, []).append(r)
    for turns in sessions.values():
        assert len({r.worker for r in turns}) == 1
        turns.sort(key=lambda r: r.turn)
        assert all(b.sent_s >= a.end_s for a, b in zip(turns, turns[1:], strict=False))
    # open loop at the workload's times on the shared clock: first turns scheduled at their
    # arrival time, none sent before it
    arrivals = {r.index: r.arrival_s for r in _load(shards["spec"]).build_workload().requests}
    for r in recs:
        if r.turn == 1:
            assert r.scheduled_s == pytest.approx(arrivals[r.index], abs=1e-9)
            assert r.sent_s >= r.scheduled_s
    # the merged summary is `summarize` of the merged records
    summary = merged.meta["summary"]
    again = summarize(merged.records, None, {"ttft": 1.0})
    skip = RUNNER_KEYS | CLIENT_SAMPLE_KEYS
    assert {k: v for k, v in summary.items() if k not in skip} == {
        k: v for k, v in again.items() if k not in skip
    }
    # the steady window (bench --window steady, every shard's lead) is found on the merged
    # records as on one run's, so `gate` compares merged runs over their windows
    windowed: dict = {}
    add_window_summary(windowed, merged.records, "steady", {"ttft": 1.0})
    windowed = json.loads(json.dumps(windowed))  # as run.json holds it
    assert summary["lead"] == windowed["lead"] and summary.get("lead_note") == windowed.get(
        "lead_note"
    )
    assert summary["steady_window"] == windowed["steady_window"]
    assert summary["window_figures"] == windowed["window_figures"]
    assert all(run_lead(run.meta) == "steady" for run in parts)
    # with every worker's own samples, the client block too is what one process computes
    samples = [run.meta["shard"]["client_samples"] for run in parts]
    client = {
        "loop_lag_s": [x for cs in samples for x in cs["loop_lag_s"]],
        "cpu": [x for cs in samples for x in cs["cpu"]],
        "timestamp_source": samples[0]["timestamp_source"],
        "workers": {i: cs["workers"]["0"] for i, cs in enumerate(samples)},
    }
    full = summarize(merged.records, None, {"ttft": 1.0}, client)
    assert {k: summary[k] for k in CLIENT_SAMPLE_KEYS} == {k: full[k] for k in CLIENT_SAMPLE_KEYS}
    mine = {k: v for k, v in summary["client"].items() if k not in ("cpu_s", "workers")}
    assert mine == {k: v for k, v in full["client"].items() if k != "workers"}
    assert [{k: v for k, v in x.items() if k != "shard"} for x in summary["client"]["workers"]] == (
        full["client"]["workers"]
    )
    # ... and a --workers 3 run's on the deterministic fields
    one = shards["w3"].summary
    assert summary["counts"] == one["counts"]
    assert summary["total_output_tokens"] == one["total_output_tokens"]
    assert summary["total_input_tokens"] == one["total_input_tokens"]
    assert summary["sessions"]["sessions"] == one["sessions"]["sessions"]
    outcome = {r.index: (r.status, r.output_tokens_server, r.worker, r.turn) for r in w3}
    assert {r.index: (r.status, r.output_tokens_server, r.worker, r.turn) for r in recs} == {
        i: v for i, v in outcome.items()
    }
    # per-worker timing rows, one per shard, each naming its shard
    rows = summary["client"]["workers"]
    assert [(x["worker"], x["shard"]) for x in rows] == [(0, 0), (1, 1), (2, 2)]
    for x in rows:
        assert x["requests"] == sum(r.worker == x["worker"] for r in recs)
    assert summary["client"]["timing_bound_s"] == max(x["timing_bound_s"] for x in rows)
    assert [s["shard"] for s in summary["shards"]] == [0, 1, 2]
    assert all(s["shift_s"] == 0.0 and s["workers"] == [s["shard"]] for s in summary["shards"])
    assert merged.meta["load"]["workers"] == 3 and merged.meta["load"]["concurrency"] == CONC
    assert merged.meta["status"] == "complete" and "shard" not in merged.meta
    # every shard's client samples, tagged with the shard, workers renumbered
    client = [s for s in merged.timeseries if s.get("source") == "client"]
    had = {
        i for i, run in enumerate(parts) if any(s.get("source") == "client" for s in run.timeseries)
    }
    assert had and {s["shard"] for s in client} == had
    assert len(client) == sum(len(run.timeseries) for run in parts)
    assert all(s["worker"] == s["shard"] for s in client)
    # a merged folder is a run folder: the report reads it like any other
    # (named after its folder, as every run in a report is since issue 42's finding 13)
    assert "| merged |" in build_report([tmp / "merged"]).markdown()


def _tamper(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst)
    meta = json.loads((dst / "run.json").read_text())
    edit(meta)
    (dst / "run.json").write_text(json.dumps(meta))
    return dst


def test_bad_merges_are_refused(shards, tmp_path):
    tmp = shards["tmp"]
    s0, s1, s2 = (tmp / f"s{i}" for i in range(3))

    def refused(dirs, message, **kw):
        with pytest.raises(CbbenchError, match=message):
            merge_runs(tmp_path / "out", dirs, **kw)
        assert not (tmp_path / "out" / "requests.jsonl").exists()

    refused([s0, s1], r"missing shard\(s\) 2/3: .* --allow-missing")
    refused([s0, s1, s2, s1], r"shard 1/3 given twice")
    refused([s0, s1, tmp / "w3"], r"w3: not a shard run")
    other = _tamper(s2, tmp_path / "seed", lambda m: m["shard"].update(workload_digest="x"))
    refused([s0, s1, other], r"seed: workload digest 'x' differs")
    four = _tamper(s2, tmp_path / "four", lambda m: m["shard"].update(count=4))
    refused([s0, s1, four], r"four: shard count 4 differs from .*s0's 3")
    late = _tamper(s2, tmp_path / "late", lambda m: m["clock"].update(start_at_unix_s=1.0))
    refused([s0, s1, late], r"late: --start-at 1.0 differs")
    running = _tamper(s2, tmp_path / "running", lambda m: m.update(status="running"))
    refused([s0, s1, running], r"has not finished")
    dup = _tamper(s2, tmp_path / "dup", lambda m: None)
    with open(dup / "requests.jsonl", "a", encoding="utf-8") as fh:
        fh.write((s1 / "requests.jsonl").read_text().splitlines()[-1] + "\n")
    refused([s0, s1, dup], r"request \d+ is in both")
    # one line on the command line, exit 2; an output folder holding a run is refused
    proc = _merge_cli(tmp_path / "cli", s0, s1)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "missing shard(s) 2/3" in proc.stderr and "Traceback" not in proc.stderr
    with pytest.raises(CbbenchError, match="already holds a run"):
        merge_runs(tmp / "w3", [s0, s1, s2])
    # --allow-missing merges what is there and says what is not
    proc = _merge_cli(tmp_path / "partial", s0, s2, extra=("--allow-missing",))
    assert proc.returncode == 0, proc.stderr
    assert "merged without shard(s) 1/3" in proc.stderr
    part = load_run(tmp_path / "partial")
    assert part.meta["summary"]["shards_missing"] == [1]
    assert part.meta["merged"]["missing"] == [1]
    expected = {r.index for d in (s0, s2) for r in load_run(d).records if not r.warmup}
    assert {r.index for r in part.records if not r.warmup} == expected
    assert part.meta["summary"]["counts"]["total"] == len(expected)


def test_shards_started_apart_without_start_at_are_refused_with_their_offsets(shards, tmp_path):
    """Issue 51 #5: two shards started 3.7 s apart without --start-at were merged and each
    reported 'started 0.0 ms late'."""
    tmp = shards["tmp"]

    def unaligned(i: int, shift: float) -> Path:
        def edit(m: dict) -> None:
            m["clock"].update(start_at_unix_s=None, t0_unix_s=m["clock"]["t0_unix_s"] + shift)

        return _tamper(tmp / f"s{i}", tmp_path / f"u{i}", edit)

    dirs = [unaligned(0, 0.0), unaligned(1, 3.7), unaligned(2, 0.1)]
    with pytest.raises(
        CbbenchError, match=r"after the first shard: shard 1/3 \+3\.70 s.*--start-at"
    ):
        merge_runs(tmp_path / "out", dirs)
    proc = _merge_cli(tmp_path / "skewed", *dirs, extra=("--allow-start-skew",))
    assert proc.returncode == 0, proc.stderr
    assert "started after the first shard: shard 1/3 +3.70 s, shard 2/3 +0.10 s" in proc.stderr
    assert "shard 1/3: " in proc.stdout and "started +3.700 s after the first shard" in proc.stdout
    assert not [ln for ln in proc.stdout.splitlines() if ln.startswith("shard") and "ms late" in ln]
    assert load_run(tmp_path / "skewed").meta["merged"]["start_skew"].endswith("+0.10 s")


@pytest.mark.parametrize("workers", [1, 2])
def test_ctrl_c_while_waiting_for_start_at_stops_at_once(tmp_path, workers):
    """A start up to an hour ahead is waited for interruptibly: Ctrl-C ends the run before t0,
    nothing sent, run.json says interrupted."""
    spec = _spec(tmp_path)
    out = tmp_path / "r"
    with threaded(FakeServerConfig(Behavior())) as srv:
        argv = _bench_argv(srv.url, spec, out, "--shard", "0/2", "--workers", str(workers))
        proc = subprocess.Popen(
            [*argv, "--start-at", f"{time.time() + 600:.3f}"], stderr=subprocess.PIPE, text=True
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # run.json is written once the run starts
                if (out / "run.json").exists():
                    break
                time.sleep(0.05)
            time.sleep(1.0 + workers)  # warm-up done, waiting for t0 (spawned workers: later)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 130, err
    run = load_run(out)
    assert run.meta["status"] == "interrupted"
    assert [r for r in run.records if not r.warmup] == []


def test_a_host_ready_after_start_at_keeps_the_schedule(tmp_path):
    """The warm-up outlasts --start-at: t0 stays at T (the other hosts' t0), the lateness is
    recorded, and the overdue requests go at once, their send lag showing it."""
    wl = LoadOptions(workload="seed-demo", rate=50.0, seed=1).build_workload()
    with threaded(FakeServerConfig(Behavior(hang_s=0.6))) as srv:  # each answer 0.6 s late
        cfg = BenchConfig(
            base_url=srv.url, workload=wl, warmup=1, live=False, out_dir=tmp_path / "r",
            start_at=time.time() + 0.2,
        )  # fmt: skip
        res = run_bench(cfg, console=Console(file=open(tmp_path / "out.txt", "w")))  # noqa: SIM115
    clock = res.meta["clock"]
    assert clock["t0_unix_s"] == cfg.start_at
    assert clock["late_start_s"] >= 0.3  # the warm-up took 0.6 s of the 0.2 s left
    measured = [r for r in res.records if not r.warmup]
    assert sorted(r.index for r in measured) == list(range(len(wl)))
    for r in measured:  # on T's time line: scheduled at the arrival, sent once ready
        assert r.scheduled_s == pytest.approx(wl.requests[r.index].arrival_s, abs=1e-9)
        assert r.sent_s >= clock["late_start_s"] - 1e-3
        if r.scheduled_s < clock["late_start_s"]:  # overdue: late by at least the lateness
            assert r.send_lag_s >= clock["late_start_s"] - r.scheduled_s - 1e-3
