"""Comparability wherever two runs meet (results/comparability.py): `gate` refuses runs that
answer different questions, naming the differences on the terminal; `report` warns on the
terminal as well as in its files. Real runs of `cbbench bench` against a server on loopback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cbbench.harness.cli import main
from cbbench.harness.results.comparability import (
    CAUTION,
    INCOMPARABLE,
    INFO,
    among,
    differences,
)
from servers.fake import Behavior, FakeServerConfig, threaded


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A chat open-loop run, a completions closed-loop run, and a chat open-loop twin."""
    root = tmp_path_factory.mktemp("cmp")
    common = ["--num-requests", "24", "--workload", "chat", "--no-live", "--seed", "3"]
    shapes = {
        "chat-open": ["--endpoint", "chat", "--request-rate", "200"],
        "chat-open-2": ["--endpoint", "chat", "--request-rate", "200"],
        "completions-closed": ["--endpoint", "completions", "--concurrency", "4"],
    }
    with threaded(FakeServerConfig(Behavior(itl_s=0.0005))) as srv:
        for name, shape in shapes.items():
            argv = ["bench", "--base-url", srv.url, *shape, *common, "--out", str(root / name)]
            assert main(argv) == 0
    return {name: root / name for name in shapes}


def test_gate_refuses_chat_open_loop_vs_completions_closed_loop(runs, capsys) -> None:
    capsys.readouterr()
    argv = ["gate", "--baseline", str(runs["chat-open"]), "--candidate"]
    assert main([*argv, str(runs["completions-closed"])]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("cbbench gate: error: not comparable: ")
    assert "endpoint: baseline chat, candidate completions" in err
    assert "load mode: baseline open, candidate closed" in err
    assert "--allow-incomparable" in err
    assert "PASS" not in out  # no verdict on incomparable runs

    # told to go on, it judges them and says on stderr that they are not comparable
    rc = main([*argv, str(runs["completions-closed"]), "--allow-incomparable"])
    out, err = capsys.readouterr()
    assert rc in (0, 1)
    assert "not comparable, judged anyway (--allow-incomparable)" in err
    assert "endpoint: baseline chat, candidate completions" in err
    assert "rules" in out

    # comparable runs: no warning
    rc = main([*argv, str(runs["chat-open-2"])])
    out, err = capsys.readouterr()
    assert "not comparable" not in err and rc in (0, 1)


def test_report_warns_on_the_terminal_and_in_its_files(runs, tmp_path, capsys) -> None:
    html, md = tmp_path / "r.html", tmp_path / "r.md"
    argv = ["report", str(runs["chat-open"]), str(runs["completions-closed"])]
    assert main([*argv, "-o", str(html), "--markdown", str(md)]) == 0
    err = capsys.readouterr().err
    assert "cbbench report: warning: not comparable: endpoint differs" in err
    assert "load mode differs (chat-open: open, completions-closed: closed)" in err
    assert "Not comparable: endpoint differs" in html.read_text()
    assert "**Not comparable:** load mode differs" in md.read_text()


def _meta(**over) -> dict:
    meta = {
        "workload": {"name": "chat", "seed": 0, "num_requests": 50},
        "target": {"endpoint": "chat", "model": "m", "scheduler": "continuous"},
        "load": {"mode": "open", "rate": 4.0, "burstiness": 1.0, "stream": True},
    }
    for key, value in over.items():
        section, _, field = key.partition("__")
        meta[section] = {**meta[section], field: value}
    return meta


def test_each_difference_has_its_severity() -> None:
    assert differences(_meta(), _meta()) == []
    by = {d.aspect: d.severity for d in differences(_meta(), _meta(load__rate=8.0))}
    assert by == {"request rate": INCOMPARABLE}
    d = {x.aspect: x for x in differences(_meta(), _meta(target__model="other"))}
    assert d["model"].severity == INCOMPARABLE and d["model"].b == "other"
    assert differences(_meta(), _meta(workload__num_requests=60))[0].severity == CAUTION
    assert differences(_meta(), _meta(target__scheduler="static"))[0].severity == INFO
    assert differences(_meta(), _meta(load__stream=False))[0].aspect == "streaming"
    # closed loop: the concurrency matters, the (absent) rate does not
    closed = _meta(load__mode="closed", load__rate=None, load__concurrency=8)
    assert [x.aspect for x in differences(closed, {**closed, "load": {**closed["load"],
            "concurrency": 16}})] == ["concurrency"]  # fmt: skip
    # unknown (an older run.json without the field) is never a difference
    old = _meta()
    del old["target"]["endpoint"]
    assert differences(old, _meta(target__endpoint="completions")) == []
    # most severe first
    sev = [x.severity for x in differences(_meta(), _meta(target__scheduler="s", load__rate=1.0))]
    assert sev == [INCOMPARABLE, INFO]


def test_among_n_runs_leaves_out_what_is_meant_to_differ() -> None:
    runs = [("a", _meta()), ("b", _meta(load__rate=8.0)), ("c", _meta(target__endpoint="x"))]
    lines = among(runs)
    assert (INCOMPARABLE, "endpoint differs (a: chat, b: chat, c: x)") in lines
    assert (INCOMPARABLE, "request rate differs (a: 4, b: 8, c: 4)") in lines
    assert all("request rate" not in t for _, t in among(runs, skip=("request rate",)))
    assert json.dumps(among([("a", _meta())])) == "[]"


def test_the_model_is_the_checkpoint_the_server_names_not_its_served_name() -> None:
    """vLLM `--served-model-name tiny-llama` of /ckpt against cbbench serving /ckpt: the same
    model (vLLM's card says `root: /ckpt`); it was 'not comparable: model differs'. Two
    checkpoints served under one name are a caution (the same model copied to another path on
    another host is common), under two names not comparable."""
    vllm = _meta(target__model="tiny-llama")
    vllm["target"]["engine"] = {"owned_by": "vllm", "root": "/ckpt"}
    cb = _meta(target__model="/ckpt")
    cb["target"]["engine"] = {"owned_by": "cbbench"}
    assert "model" not in {d.aspect for d in differences(vllm, cb)}
    other = _meta(target__model="tiny-llama")
    other["target"]["engine"] = {"owned_by": "vllm", "root": "/other"}
    d = {x.aspect: x for x in differences(vllm, other)}
    assert d["model"].severity == CAUTION and (d["model"].a, d["model"].b) == ("/ckpt", "/other")
    renamed = _meta(target__model="llama")
    renamed["target"]["engine"] = {"owned_by": "vllm", "root": "/other"}
    assert {x.aspect: x for x in differences(vllm, renamed)}["model"].severity == INCOMPARABLE


def test_the_server_is_the_engine_not_the_http_frameworks_header() -> None:
    """vLLM and cbbench both answer `server: uvicorn`: a gate between them said nothing about
    comparing two engines. The engine (and version) from environment.server is the server."""
    vllm, cb = _meta(), _meta()
    for meta, name, version in ((vllm, "vllm", "0.32.0"), (cb, "cbbench", "0.1.0")):
        meta["target"]["engine"] = {"owned_by": name, "server": "uvicorn"}
        meta["environment"] = {"server": {"name": name, "version": version}}
    d = {x.aspect: x for x in differences(vllm, cb)}
    assert d["server"].severity == INFO and (d["server"].a, d["server"].b) == (
        "vllm 0.32.0", "cbbench 0.1.0")  # fmt: skip
    assert "server" not in {x.aspect for x in differences(vllm, vllm)}
    vllm["target"]["server_settings"] = {"enable_prefix_caching": True}
    cb["target"]["server_settings"] = {"enable_prefix_caching": False}
    d = {x.aspect: x for x in differences(vllm, cb)}
    assert d["prefix caching"].severity == INFO and (d["prefix caching"].a, d["prefix caching"].b) == ("on", "off")
