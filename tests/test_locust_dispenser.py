"""Request dispensing across Locust workers (no request twice, none skipped within an epoch),
schedules, cycling, settings through the environment, and `cbbench locust` argument errors."""

import json

import pytest
from cbbench.harness import cli
from cbbench.harness.cli.locust import locust_command
from cbbench.harness.errors import CbbenchError
from cbbench.harness.locust import LOCUSTFILE
from cbbench.harness.locust.dispenser import Dispenser, Plan
from cbbench.harness.locust.settings import (
    ENV_VAR,
    LocustSettings,
    load_workload_for,
    workload_digest,
)
from cbbench.workloads import load_workload, with_arrivals
from hypothesis import given, settings
from hypothesis import strategies as st


def _drain(d: Dispenser) -> list:
    out = []
    while (t := d.take()) is not None:
        out.append(t)
    return out


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), workers=st.integers(1, 6))
def test_slots_partition_the_workload(n, workers):
    wl = load_workload("seed-demo", num_requests=n)
    shares = []
    for k in range(workers):
        d = Dispenser(wl, schedule=False)
        d.assign(Plan(k, workers))
        shares.append([t.index for t in _drain(d)])
        assert d.exhausted
    taken = [i for share in shares for i in share]
    assert sorted(taken) == list(range(n))  # every request once, across all workers


def test_a_restarted_epoch_never_repeats_an_index():
    wl = load_workload("seed-demo", num_requests=10)
    d = Dispenser(wl, schedule=False, cycle=True)
    d.assign(Plan(1, 2))
    first = [d.take().index for _ in range(3)]  # positions 1, 3, 5
    assert first == [1, 3, 5]
    d.assign(Plan(0, 3, base=d.taken_max + 1))
    second = [d.take() for _ in range(5)]
    assert [t.position for t in second] == [6, 9, 12, 15, 18]
    assert [t.index for t in second] == [6, 9, 12, 15, 18]  # laps continue the numbering
    assert [t.lap for t in second] == [0, 0, 1, 1, 1]
    assert second[2].turns == (wl.requests[2],)


def test_schedule_orders_by_arrival_and_cycles_by_span():
    wl = with_arrivals(load_workload("seed-demo", num_requests=5), "constant", rate=10.0)
    d = Dispenser(wl, schedule=True, cycle=True)
    d.assign(Plan(0, 1, shift_s=0.5))
    tickets = [d.take() for _ in range(7)]
    dues = [t.due_s for t in tickets]
    assert dues == sorted(dues)
    assert dues[0] == pytest.approx(0.5 + wl.requests[0].arrival_s)
    assert dues[5] - dues[0] == pytest.approx(d.span) and d.span == pytest.approx(0.5)
    closed = Dispenser(wl, schedule=False)
    closed.assign(Plan(0, 1))
    assert closed.take().due_s is None


def test_closed_dispenser_hands_out_nothing():
    d = Dispenser(load_workload("seed-demo"), schedule=False)
    assert d.take() is None  # no plan yet
    d.assign(Plan(0, 1))
    assert d.take() is not None
    d.close()
    assert d.take() is None and not d.is_open


def test_settings_round_trip_and_same_workload_as_bench():
    s = LocustSettings(base_url="http://127.0.0.1:1", workload="mixed", num_requests=7, rate=3.0)
    back = LocustSettings.from_env({ENV_VAR: s.to_env()})
    assert back == s
    a, b = load_workload_for(s), load_workload_for(back)
    assert workload_digest(a) == workload_digest(b) and len(a) == 7 and a.open_loop
    other = LocustSettings(**{**json.loads(s.to_env()), "seed": 1})
    assert workload_digest(load_workload_for(other)) != workload_digest(a)


def test_settings_errors_name_the_variable():
    with pytest.raises(CbbenchError, match=ENV_VAR):
        LocustSettings.from_env({})
    with pytest.raises(CbbenchError, match="bad keys"):
        LocustSettings.from_env({ENV_VAR: json.dumps({"base_url": "x", "nope": 1})})


def _args(argv):
    return cli.build_parser().parse_args(["locust", *argv])


def test_locust_command_line():
    args = _args(["--base-url", "http://h:1", "--headless", "-u", "3", "-t", "5s", "--master"])
    cmd = locust_command(args, str(LOCUSTFILE), "http://h:1")
    assert cmd[1:5] == ["-m", "locust", "-f", str(LOCUSTFILE)]
    for part in (["--headless"], ["-u", "3"], ["-t", "5s"], ["--master"]):
        assert any(cmd[i : i + len(part)] == part for i in range(len(cmd))), part
    assert cmd[cmd.index("--master-bind-host") + 1] == "127.0.0.1"
    assert cmd[cmd.index("--web-host") + 1] == "127.0.0.1"
    worker = locust_command(
        _args(["--base-url", "u", "--worker", "--master-host", "10.0.0.2", "--", "-L", "DEBUG"]),
        "f",
        "u",
    )
    assert worker[-2:] == ["-L", "DEBUG"] and "--web-port" not in worker
    assert worker[worker.index("--master-host") + 1] == "10.0.0.2"
    with pytest.raises(CbbenchError, match="exclude"):
        locust_command(_args(["--master", "--worker"]), "f", "u")
    with pytest.raises(CbbenchError, match="fewer users than the 3 workers"):
        locust_command(_args(["--processes", "3", "-u", "2"]), "f", "u")


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "--base-url is required"),
        (["--base-url", "http://127.0.0.1:9", "--workload", "no-such-preset"], "no-such-preset"),
        (["--base-url", "http://127.0.0.1:9", "--extra-body", "[1]"], "--extra-body"),
        (["--base-url", "http://127.0.0.1:9", "--pacing", "soon"], "--pacing"),
    ],
)
def test_user_errors_are_one_line(argv, message, capsys):
    assert cli.main(["locust", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and "Traceback" not in err
