"""Issue #54's done-when check for guidellm, AIPerf and inference-perf, live: each tool and
`cbbench bench` run the same workload (64-token prompts, 32-token outputs, 4 in flight, 60
requests) against cbbench's scripted server on 127.0.0.1; each tool's result is imported
(`cbbench import --workload fixed-64-32`) and `cbbench report` puts them side by side. It
prints each tool's TTFT p50 as the tool computed it beside the report's, and the definitions
the report names.

    python tests/benchmarks/studies/exchange_tools.py --out /tmp/exchange \\
        [--tools /work/tools]   # guidellm, aiperf, inference-perf venvs: /work/tools/<name>

The tools are never cbbench dependencies: each lives in its own venv (`pip install guidellm`,
`aiperf`, `inference-perf`; inference-perf needs Python >= 3.12). A tokenizer is trained on
this repository's docs (no hub download) for the tools that need one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
N, CONC, ISL, OSL = 60, 4, 64, 32
WORKLOAD = f"fixed-{ISL}-{OSL}"


def sh(argv: list[str], log: Path, timeout: float = 600) -> None:
    with open(log, "w") as fh:
        subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout, check=True)


def tokenizer(out: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4000,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train([str(p) for p in (ROOT / "docs").glob("*.md")], trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--tools", type=Path, default=Path("/work/tools"))
    args = ap.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer(out / "tok")
    cfg = {"default": {"ttft_s": 0.05, "itl_s": 0.01, "tokens_per_chunk": 1}}
    server = subprocess.Popen(
        [sys.executable, "-m", "cbbench.harness.servers.fake_server", "--config", json.dumps(cfg)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        box: list[str] = []  # "cbbench fake-server: ready at URL", within 60 s or fail
        reader = threading.Thread(target=lambda: box.append(server.stdout.readline()), daemon=True)
        reader.start()
        reader.join(60)
        line = box[0] if box else ""
        if not line:
            raise SystemExit("exchange_tools: the fake server printed no ready line within 60 s")
        url = line.rsplit(" ", 1)[-1].strip()
        assert url.startswith("http://127.0.0.1:"), line
        runs = run_all(args.tools, out, url, tok)
    finally:
        server.terminate()
        server.wait(timeout=30)
    report(out, runs)
    return 0


def run_all(tools: Path, out: Path, url: str, tok: Path) -> dict[str, tuple[Path, float | None]]:
    """Each tool's run folder (imported) and the TTFT p50 the tool itself computed (s)."""
    runs: dict[str, tuple[Path, float | None]] = {}
    sh(
        ["cbbench", "bench", "--base-url", url, "--workload", f"prompt={ISL},output={OSL}"]
        + ["--endpoint", "chat"]
        + ["--concurrency", str(CONC), "--num-requests", str(N), "--seed", "1"]
        + ["--out", str(out / "cbbench"), "--no-live"],
        out / "cbbench.log",
    )
    runs["cbbench"] = (out / "cbbench", None)
    if (tools / "guidellm").exists():
        g = out / "guidellm"
        g.mkdir(exist_ok=True)
        sh(
            [str(tools / "guidellm/bin/guidellm"), "run"]
            + ["--backend", f"kind=openai_http,target={url},model=fake-model"]
            + ["--profile", f"kind=concurrent,streams={CONC}"]
            + ["--constraint", f"kind=max_requests,count={N}"]
            + ["--tokenizer", f"kind=hf_auto,model={tok}"]
            + ["--data", f"kind=synthetic_text,prompt_tokens={ISL},output_tokens={OSL}"]
            + ["--seed", "kind=static,value=1", "--output", f"kind=json,path={g}/benchmarks.json"]
            + ["--output", "kind=console", "--disable-progress"],
            out / "guidellm.log",
        )
        data = json.loads((g / "benchmarks.json").read_text())
        m = data["benchmarks"][0]["metrics"]["time_to_first_token_ms"]["successful"]
        runs["guidellm"] = (g / "benchmarks.json", m["median"] / 1e3)
    if (tools / "aiperf").exists():
        a = out / "aiperf"
        sh(
            [str(tools / "aiperf/bin/aiperf"), "profile", "--model", "fake-model", "--url", url]
            + ["--endpoint-type", "chat", "--streaming", "--tokenizer", str(tok)]
            + ["--concurrency", str(CONC), "--request-count", str(N)]
            + ["--synthetic-input-tokens-mean", str(ISL), "--synthetic-input-tokens-stddev", "0"]
            + ["--output-tokens-mean", str(OSL), "--random-seed", "1"]
            + ["--artifact-dir", str(a), "--ui-type", "none"],
            out / "aiperf.log",
        )
        agg = json.loads((a / "profile_export_aiperf.json").read_text())
        runs["aiperf"] = (a, agg["time_to_first_token"]["p50"] / 1e3)
    if (tools / "inference-perf").exists():
        i = out / "inference-perf"
        conf = out / "inference-perf.yml"
        conf.write_text(
            json.dumps(  # YAML is a superset of JSON
                {
                    "load": {"type": "constant", "stages": [{"rate": 10, "duration": 6}]},
                    "api": {"type": "completion", "streaming": True},
                    "server": {"type": "vllm", "model_name": "fake-model", "base_url": url},
                    "tokenizer": {"pretrained_model_name_or_path": str(tok)},
                    "data": {
                        "type": "random",
                        "input_distribution": dict(
                            min=ISL, max=ISL, mean=ISL, std_dev=0, total_count=N
                        ),
                        "output_distribution": dict(
                            min=OSL, max=OSL, mean=OSL, std_dev=0, total_count=N
                        ),
                    },
                    "report": {"request_lifecycle": {"summary": True, "per_request": True}},
                    "storage": {"local_storage": {"path": str(i)}},
                }
            )
        )
        sh([str(tools / "inference-perf/bin/inference-perf"), "-c", str(conf)], out / "ip.log")
        s = json.loads((i / "summary_lifecycle_metrics.json").read_text())
        runs["inference-perf"] = (i, s["successes"]["latency"]["time_to_first_token"]["median"])
    for name, (src, _) in list(runs.items())[1:]:
        sh(
            [
                "cbbench",
                "import",
                str(src),
                "--out",
                str(out / f"{name}-run"),
                "--workload",
                WORKLOAD,
            ],
            out / f"import-{name}.log",
        )
        runs[name] = (out / f"{name}-run", runs[name][1])
    return runs


def report(out: Path, runs: dict[str, tuple[Path, float | None]]) -> None:
    from cbbench.harness.report import build_report

    rep = build_report([str(p) for p, _ in runs.values()])
    (out / "report.md").write_text(rep.markdown())
    (out / "report.html").write_text(rep.html())
    print(f"{'run':16} {'tool TTFT p50':>14} {'report TTFT p50':>16} {'ratio':>8}")
    for (name, (_, own)), row in zip(runs.items(), rep.rows, strict=True):
        mine = row["ttft.p50"]
        ratio = f"{mine / own:.4f}" if own else "-"
        own_ms = f"{own * 1e3:.3f} ms" if own else "-"
        print(f"{name:16} {own_ms:>14} {mine * 1e3:>13.3f} ms {ratio:>8}")
    print("\n".join(ln for ln in rep.markdown().splitlines() if "definition differs" in ln))
    print(f"report: {out / 'report.html'}")


if __name__ == "__main__":
    sys.exit(main())
