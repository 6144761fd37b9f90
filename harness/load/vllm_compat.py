"""`vllm bench serve` spellings that `cbbench bench` accepts with vLLM's meaning:
`--goodput ttft:200 tpot:50 e2el:1000` (milliseconds), `--random-input-len` /
`--random-output-len` (fixed lengths, the same as `--workload prompt=N,output=M`),
`--ignore-eos` (see `ClientOptions`), and `--burstiness`, which shapes `--request-rate`'s gaps
and is refused without one. Light to import (`bench --help` reads its defaults)."""

from __future__ import annotations

from cbbench.harness.errors import CbbenchError

# vLLM's goodput keys -> ours (vLLM names end-to-end latency e2el)
GOODPUT_KEYS = {"ttft": "ttft", "tpot": "tpot", "e2el": "e2e", "e2e": "e2e"}
# vLLM's random dataset defaults, used for the length a user did not give
RANDOM_INPUT_LEN = 1024
RANDOM_OUTPUT_LEN = 128


def parse_goodput(items: list[str] | None) -> dict[str, float]:
    """['ttft:200', 'tpot:50'] -> {'ttft': 0.2, 'tpot': 0.05} (seconds). A bare number is in
    milliseconds, as in vLLM; a value with a unit (200ms, 2s) is read as written."""
    from cbbench.harness.results.summary import parse_duration  # numpy: not for --help

    out: dict[str, float] = {}
    for item in items or []:
        for part in item.split(","):  # vLLM takes spaces; a comma list is accepted too
            key, sep, value = part.partition(":")
            key = key.strip().lower()
            if not sep or key not in GOODPUT_KEYS:
                raise CbbenchError(
                    f"--goodput: {part!r}: expected KEY:MILLISECONDS with KEY one of "
                    f"{', '.join(GOODPUT_KEYS)} (e.g. --goodput ttft:200 tpot:50)"
                )
            value = value.strip()
            try:
                ms = float(value)
            except ValueError:
                if not value[-1:].isalpha() or not value[:1].isdigit():
                    raise CbbenchError(
                        f"--goodput {key}: {value!r} is not a number of milliseconds "
                        f"(e.g. {key}:200)"
                    ) from None
                out[GOODPUT_KEYS[key]] = parse_duration(value, f"--goodput {key}")
                continue
            if ms <= 0:
                raise CbbenchError(f"--goodput {key}: {value} must be > 0 ms")
            out[GOODPUT_KEYS[key]] = ms * 1e-3
    return out


def goodput_as_slo(items: list[str] | None, slo: str | None) -> tuple[str | None, str | None]:
    """sweep's and plan's `--goodput`, bench's meaning: vLLM's SLOs ('ttft:200 tpot:50', ms)
    -> ('ttft=200ms,tpot=50ms', None), the same targets in --slo's grammar. A lone share
    ('0.95', '95%': its meaning there before --goodput-share) -> (slo, '0.95'), read as
    --goodput-share with a note on stderr."""
    import sys

    if not items:
        return slo, None
    if len(items) == 1 and ":" not in items[0]:
        text = items[0].strip()
        try:
            float(text[:-1] if text.endswith("%") else text)
        except ValueError:
            pass
        else:
            print(f"note: --goodput takes SLOs (KEY:MS, e.g. ttft:200); the share is "
                  f"--goodput-share (read as --goodput-share {text})", file=sys.stderr)  # fmt: skip
            return slo, text
    if slo:
        raise CbbenchError("--slo and --goodput both set SLOs: give one of them")
    targets = parse_goodput(items)
    return ",".join(f"{k}={v * 1e3:g}ms" for k, v in targets.items()), None


def fixed_lengths_workload(
    workload: str | None, input_len: int | None, output_len: int | None
) -> str | None:
    """The workload `--random-input-len` / `--random-output-len` stand for (an inline
    `prompt=N,output=M` spec), or `workload` as given when neither is."""
    if input_len is None and output_len is None:
        return workload
    if workload is not None:
        raise CbbenchError(
            f"--random-input-len/--random-output-len fix the lengths of every request; they "
            f"replace --workload {workload}: give one or the other"
        )
    for flag, n in (("--random-input-len", input_len), ("--random-output-len", output_len)):
        if n is not None and n < 1:
            raise CbbenchError(f"{flag} must be >= 1, got {n}")
    prompt = RANDOM_INPUT_LEN if input_len is None else input_len
    output = RANDOM_OUTPUT_LEN if output_len is None else output_len
    return f"prompt={prompt},output={output}"


def check_burstiness(burstiness: float | None, rate: float | None) -> None:
    """--burstiness shapes the gaps of --request-rate's arrivals: without a rate it would be
    silently ignored, so it is refused."""
    if burstiness is not None and rate is None:
        raise CbbenchError(
            f"--burstiness {burstiness:g} shapes the gaps between --request-rate arrivals; "
            "give --request-rate too (as vLLM requires)"
        )
