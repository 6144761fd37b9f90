"""Named workloads: the seeds' scenarios and the two packaged real traces.

Each preset is a spec table (the same format as a spec file); synthetic ones have no arrival
times (closed loop: the harness caps concurrency or adds a rate), traces replay their own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cbbench.workloads.tracefile import PACKAGED_PREFIX


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    spec: dict
    has_arrivals: bool  # True: requests carry the trace's timestamps
    # The engine settings the preset was written for (engine flag dests, e.g. batch_size):
    # commands that run the reference engine use them unless a flag says otherwise.
    settings: dict = field(default_factory=dict)

    @property
    def default_count(self) -> int | None:
        return self.spec.get("num_requests")


# Prompts for the synthetic mixes: lognormal around 256 tokens, a chat-like spread.
_PROMPT = {"dist": "lognormal", "median": 256, "sigma": 0.6, "min": 16, "max": 2048}

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "seed-demo",
            "6 requests, outputs [10, 5, 8, 3, 12, 6], 32-token prompts, all at once",
            {
                "num_requests": 6,
                "prompt": {"dist": "constant", "value": 32},
                "output": {"dist": "sequence", "values": [10, 5, 8, 3, 12, 6]},
            },
            has_arrivals=False,
            # the seeds' timeline: B = 4, one time unit per engine step
            settings={"batch_size": 4, "hardware": "steps"},
        ),
        Preset(
            "run-demo",
            "`cbbench run`'s default: 256 requests, outputs lognormal (median 128, sigma 0.9, "
            "8-1024), prompts lognormal (median 64, 8-512), all at once",
            {
                "num_requests": 256,
                "prompt": {"dist": "lognormal", "median": 64, "sigma": 0.6, "min": 8, "max": 512},
                "output": {"dist": "lognormal", "median": 128, "sigma": 0.9, "min": 8, "max": 1024},
            },
            has_arrivals=False,
        ),
        Preset(
            "uniform",
            "200 requests, every prompt 256 and every output 256 tokens",
            {
                "num_requests": 200,
                "prompt": {"dist": "constant", "value": 256},
                "output": {"dist": "constant", "value": 256},
            },
            has_arrivals=False,
        ),
        Preset(
            "mixed",
            "200 requests, outputs uniform 10-1000, prompts lognormal (median 256, 16-2048)",
            {
                "num_requests": 200,
                "prompt": _PROMPT,
                "output": {"dist": "uniform", "min": 10, "max": 1000},
            },
            has_arrivals=False,
        ),
        Preset(
            "heavy-mixed",
            "200 requests, outputs uniform 1-4000, prompts lognormal (median 256, 16-2048)",
            {
                "num_requests": 200,
                "prompt": _PROMPT,
                "output": {"dist": "uniform", "min": 1, "max": 4000},
            },
            has_arrivals=False,
        ),
        Preset(
            "chat",
            "200 requests, short prompts (lognormal median 64, 4-1024), "
            "outputs lognormal (median 160, sigma 0.8, 8-2048)",
            {
                "num_requests": 200,
                "prompt": {"dist": "lognormal", "median": 64, "sigma": 0.8, "min": 4, "max": 1024},
                "output": {"dist": "lognormal", "median": 160, "sigma": 0.8, "min": 8, "max": 2048},
            },
            has_arrivals=False,
        ),
        Preset(
            "agent",
            "agent sessions: system prompt + tools, a task, 2-60 tool-calling steps (median "
            "12) with tool waits (median 1 s), a final answer; 400 requests (chat endpoint)",
            {"num_requests": 400, "agent": {}},
            has_arrivals=False,
        ),
        Preset(
            "agent-graph",
            "agent graphs: an orchestrator fans out to 2-6 parallel sub-agents (1-3 tool-calling "
            "steps each, tool waits median 0.5 s), a reducer joins their live answers; 200 "
            "calls (chat endpoint)",
            {"num_requests": 200, "agent_graph": {}},
            has_arrivals=False,
        ),
        Preset(
            "shared-prefix",
            "SGLang's generated shared prefix: 8 groups x 16 prompts, system prompt 768 + "
            "question 256 tokens (intended hit rate 75 % primed), outputs 64",
            {
                "shared_prefix": {
                    "groups": 8,
                    "prompts_per_group": 16,
                    "system_len": 768,
                    "question_len": 256,
                    "output_len": 64,
                }
            },
            has_arrivals=False,
        ),
        Preset(
            "reasoning",
            "200 requests, short prompts (lognormal median 128, 16-1024), reasoning-length "
            "outputs (lognormal median 1024, sigma 1.0, 32-7168: p90 ~3.7k, tail to 7k)",
            # thinking makes outputs long and heavy-tailed (docs/workloads.md); clipped so
            # prompt + output fit an 8k context (llama-3-8b, the simulator's default model)
            {
                "num_requests": 200,
                "prompt": {
                    "dist": "lognormal",
                    "median": 128,
                    "sigma": 0.8,
                    "min": 16,
                    "max": 1024,
                },
                "output": {
                    "dist": "lognormal",
                    "median": 1024,
                    "sigma": 1.0,
                    "min": 32,
                    "max": 7168,
                },
            },  # fmt: skip
            has_arrivals=False,
        ),
        Preset(
            "azure-conv",
            "Azure LLM inference trace 2023, conversation: 19,366 requests over one hour, replayed",
            {"trace": {"path": PACKAGED_PREFIX + "azure_llm_2023_conv.csv.gz", "format": "azure"}},
            has_arrivals=True,
        ),
        Preset(
            "mooncake-conv",
            "Mooncake FAST'25 conversation trace: 12,031 requests over one hour with prefix "
            "block ids, replayed",
            {
                "trace": {
                    "path": PACKAGED_PREFIX + "mooncake_conversation.jsonl.gz",
                    "format": "mooncake",
                }
            },
            has_arrivals=True,
        ),
        Preset(
            "mooncake-sessions",
            "mooncake-conv as conversations: requests chained into sessions by their block ids "
            "(8,196 sessions, 2,008 of them multi-turn), each turn sent after the last reply",
            {
                "trace": {
                    "path": PACKAGED_PREFIX + "mooncake_conversation.jsonl.gz",
                    "format": "mooncake",
                    "sessions": True,
                }
            },
            has_arrivals=True,
        ),
    )
}


def preset_settings(name: str) -> dict:
    """The engine settings a preset was written for ({} for anything else)."""
    preset = PRESETS.get(name)
    return dict(preset.settings) if preset else {}
