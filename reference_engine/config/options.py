"""Engine command-line options, built from the config dataclasses (one registry, every command).

Each EngineConfig field (and each field of a policy's settings dataclass) that carries
`flag(...)` metadata becomes one flag with one name, one help text, one unit and one default on
every command that runs the engine (serve, sim, run, reproduce, compare-engines, calibrate):

    add_engine_args(parser)                    # every engine flag, defaults None (= not given)
    cfg = engine_config_from_args(ns)          # flags given > command defaults > EngineConfig
    cfgs = engine_configs_from_args(ns)        # one config per name in --scheduler a,b,c
    settings = engine_settings(ns)             # {dest: value} of the flags given
    argv = engine_argv(settings)               # the same settings as `cbbench serve` flags

Settings are a flat dict keyed by flag dest (`max_num_seqs`, `drain_timeout`, ...), the same
keys `build_engine_config` takes, so library code never builds argparse namespaces.

Adding a setting: add the field with `metadata=flag("--name", "help", unit=...)` to its
dataclass (config.py, policy_config.py, speculative_config.py); nothing here changes.
Adding a policy: its settings dataclass in policy_config.SCHEDULER_SETTINGS + an
EngineConfig field of that name + its class in scheduler/__init__.py (docs/architecture.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cbbench.reference_engine.config.engine_config import SCHEDULERS, EngineConfig
from cbbench.reference_engine.errors import EngineError

# dest of the flag that sets the hidden defaults a command carries (see add_engine_args)
_DEFAULTS_DEST = "_engine_defaults"
# B (--batch-size) is also the default of these, so one number compares the policies
B_FOLLOWERS = ("max_batch_size", "max_num_seqs")
# What a simulated comparison (sim, run --sim, reproduce) models unless told otherwise: a
# GPU-sized model at its own dtype, B = 32, a large step budget.
SIM_DEFAULTS: dict[str, Any] = {
    "model": "llama-3-8b",
    "dtype": "auto",
    "batch_size": 32,
    "max_num_batched_tokens": 8192,
    "executor": "sim",
    "device": "cpu",
}


@dataclass(frozen=True)
class EngineFlag:
    """One engine flag: where its value goes and how it reads."""

    name: str  # "--max-num-seqs"
    dest: str  # "max_num_seqs"
    section: str | None  # None: an EngineConfig field; else the sub-config ("continuous")
    field: str  # the dataclass field ("max_queue_wait_s")
    kind: str  # "int" | "float" | "str" | "bool" | "ints"
    default: Any  # the dataclass default
    help: str
    unit: str | None
    choices: tuple[str, ...] | None
    aliases: tuple[str, ...]
    metavar: str | None
    group: str  # --help section
    auto: str | None = None  # the bool field `auto` / `auto:N` turns on (flags.flag)

    def help_text(self, default: Any = dataclasses.MISSING) -> str:
        d = self.default if default is dataclasses.MISSING else default
        unit = f" [{self.unit}]" if self.unit else ""
        if self.unit == "s":
            unit += " (or with a unit: 50ms, 2s)"
        if self.kind == "bool":
            shown = "on" if d else "off"
        elif d is None or d == ():
            shown = None
        elif isinstance(d, tuple):
            shown = ",".join(str(x) for x in d)
        else:
            shown = str(d)
        text = f"{self.help}{unit}"
        return text if shown is None else f"{text} (default: {shown})"


def _kind(tp: Any) -> str:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        assert len(args) == 1, tp
        tp = args[0]
    if typing.get_origin(tp) is tuple:
        assert typing.get_args(tp)[0] is int, tp
        return "ints"
    kind = {bool: "bool", int: "int", float: "float", str: "str"}.get(tp)
    assert kind is not None, f"engine flag of unsupported type {tp}"
    return kind


def _dest(name: str) -> str:
    return name.lstrip("-").replace("-", "_")


def _walk(cls: type, section: str | None, group: str) -> Iterable[EngineFlag]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):  # a policy's settings (or another sub-config)
            doc = (tp.__doc__ or "").strip().split("\n")[0].split(":")[0].split(". ")[0].rstrip(".")
            title = f"{f.name} scheduler" if f.name in SCHEDULERS else f.name
            yield from _walk(tp, f.name, f"{title}: {doc}" if doc else title)
            continue
        meta = f.metadata.get("flag")
        if meta is None:
            continue
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        yield EngineFlag(
            name=meta["name"],
            dest=_dest(meta["name"]),
            section=section,
            field=f.name,
            kind=_kind(tp),
            default=default,
            help=meta["help"],
            unit=meta["unit"],
            choices=meta["choices"],
            aliases=tuple(meta["aliases"]),
            metavar=meta["metavar"],
            group=group,
            auto=meta.get("auto"),
        )


def engine_flags() -> tuple[EngineFlag, ...]:
    """Every engine flag, in --help order (read from the config dataclasses)."""
    flags = tuple(_walk(EngineConfig, None, "engine"))
    dests = [f.dest for f in flags]
    assert len(dests) == len(set(dests)), f"two engine fields share a flag: {dests}"
    return flags


FLAGS: dict[str, EngineFlag] = {f.dest: f for f in engine_flags()}


def _csv_ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def seconds_arg(text: str) -> float:
    """A duration flag: `50ms`, `0.05s`, `2m`; a bare number keeps the flag's unit, seconds."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(us|ms|s|m)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected a duration such as 50ms or 0.05s, got {text!r}")
    return float(m.group(1)) * _SECONDS[m.group(2) or "s"]


_TYPES = {"int": int, "float": float, "str": str, "ints": _csv_ints}


def _flag_type(f: EngineFlag):
    if f.auto:
        return _int_or_auto
    if f.kind == "float" and f.unit == "s":
        return seconds_arg
    return _TYPES[f.kind]


def auto_ceiling(value: str, name: str) -> int | None:
    """`auto` -> None (the ceiling the flag would have without it), `auto:N` -> N."""
    head, _, tail = value.partition(":")
    if head == "auto" and (not _ or tail.strip().isdigit()):
        return int(tail) if _ else None
    raise EngineError(f"{name}: expected an integer, auto or auto:N, got {value!r}")


def _int_or_auto(text: str) -> int | str:
    """An int flag that also takes `auto` / `auto:N` (kept as text until the config)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        auto_ceiling(text, "value")
    except EngineError:
        raise argparse.ArgumentTypeError(
            f"expected an integer, auto or auto:N, got {text!r}"
        ) from None
    return text


def add_engine_args(
    parser: argparse.ArgumentParser,
    *,
    only: Iterable[str] | None = None,
    defaults: Mapping[str, Any] | None = None,
    help_defaults: Mapping[str, str] | None = None,
) -> None:
    """Add the engine flags (all, or the dests in `only`) to `parser`.

    Every flag's argparse default is None, so "not given" is visible; `defaults` are this
    command's own defaults (e.g. sim: llama-3-8b), shown in --help and applied by
    `engine_config_from_args` below the flags given; `help_defaults` only change what --help
    says (a default the command works out at run time, e.g. "cuda if present")."""
    defaults = dict(defaults or {})
    shown = {**defaults, **(help_defaults or {})}
    unknown = set(defaults) - set(FLAGS)
    assert not unknown, f"defaults for unknown engine flags: {unknown}"
    wanted = set(FLAGS) if only is None else set(only)
    assert wanted <= set(FLAGS), f"unknown engine flags: {wanted - set(FLAGS)}"
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in FLAGS.values():
        if f.dest not in wanted:
            continue
        if f.group not in groups:
            groups[f.group] = parser.add_argument_group(f.group)
        g = groups[f.group]
        help_text = f.help_text(shown.get(f.dest, dataclasses.MISSING))
        if f.kind == "bool":
            g.add_argument(
                f.name, dest=f.dest, action=argparse.BooleanOptionalAction, default=None,
                help=help_text,
            )  # fmt: skip
            for alias in f.aliases:  # a negative spelling: --no-chunked-prefill
                g.add_argument(
                    alias, dest=f.dest, action="store_false", default=None,
                    help=f"deprecated: use --no-{f.name[2:]}",
                )  # fmt: skip
            continue
        g.add_argument(
            f.name,
            *f.aliases,
            dest=f.dest,
            type=_flag_type(f),
            choices=f.choices,
            default=None,
            metavar=f.metavar,
            help=help_text,
        )
    parser.set_defaults(**{_DEFAULTS_DEST: defaults})


def engine_settings(ns: argparse.Namespace) -> dict[str, Any]:
    """{dest: value} of the engine flags given on the command line."""
    return {d: getattr(ns, d) for d in FLAGS if getattr(ns, d, None) is not None}


def inapplicable(settings: Mapping[str, Any], schedulers: Iterable[str]) -> list[str]:
    """Flags given that belong to a scheduler none of `schedulers` is ('--max-queue-delay is
    a dynamic scheduler setting'): said, not silently ignored. B (--batch-size) is every
    policy's default size, so it always applies."""
    chosen = set(schedulers)
    out = []
    for dest in settings:
        f = FLAGS.get(dest)
        if f is None or f.section not in SCHEDULERS or f.section in chosen or dest == "batch_size":
            continue
        out.append(
            f"{f.name} is a {f.section} scheduler setting: it does not apply to "
            f"--scheduler {','.join(sorted(chosen))}"
        )
    return out


def command_defaults(ns: argparse.Namespace) -> dict[str, Any]:
    return dict(getattr(ns, _DEFAULTS_DEST, None) or {})


def scheduler_names(
    text: str | None, default: Iterable[str] = SCHEDULERS, flag: str = "--scheduler"
) -> list[str]:
    """`--scheduler a,b` -> ["a", "b"] (EngineError naming the unknown ones and `flag`, the
    spelling the user typed)."""
    if text is None:
        return list(default)
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in SCHEDULERS]
    if bad or not names:
        raise EngineError(
            f"{flag}: unknown {', '.join(bad) or repr(text)} (choose from {', '.join(SCHEDULERS)})"
        )
    return list(dict.fromkeys(names))


def build_engine_config(
    settings: Mapping[str, Any],
    defaults: Mapping[str, Any] | None = None,
    *,
    scheduler: str | None = None,
) -> EngineConfig:
    """The EngineConfig of `settings` over `defaults` over EngineConfig's own defaults.

    Keys are flag dests. B (`batch_size`) is also the default of `max_batch_size` and
    `max_num_seqs`; `max_num_batched_tokens` is raised to `max_num_seqs` when not given.
    `max_num_seqs="auto"` (or "auto:N") turns on the adaptive limit with ceiling B (or N)."""
    unknown = (set(settings) | set(defaults or {})) - set(FLAGS)
    if unknown:
        raise EngineError(f"unknown engine settings: {', '.join(sorted(unknown))}")
    merged = {**(defaults or {}), **{k: v for k, v in settings.items() if v is not None}}
    if scheduler is not None:
        merged["scheduler"] = scheduler
    if "batch_size" in merged:
        for dest in B_FOLLOWERS:
            if settings.get(dest) is None:
                merged[dest] = merged["batch_size"]
    auto_on: list[EngineFlag] = []  # `--max-num-seqs auto`: the int becomes the ceiling
    for dest, value in list(merged.items()):
        f = FLAGS[dest]
        if f.auto is not None and isinstance(value, str):
            ceiling = auto_ceiling(value, f.name)
            merged[dest] = ceiling if ceiling is not None else merged.get("batch_size", f.default)
            auto_on.append(f)
    if settings.get("max_num_batched_tokens") is None and "max_num_seqs" in merged:
        budget = merged.get("max_num_batched_tokens", FLAGS["max_num_batched_tokens"].default)
        merged["max_num_batched_tokens"] = max(budget, merged["max_num_seqs"])
    top: dict[str, Any] = {}
    subs: dict[str, dict[str, Any]] = {}
    for dest, value in merged.items():
        f = FLAGS[dest]
        if f.section is None:
            top[f.field] = value
        else:
            subs.setdefault(f.section, {})[f.field] = value
    for f in auto_on:
        (top if f.section is None else subs.setdefault(f.section, {}))[f.auto] = True
    hints = typing.get_type_hints(EngineConfig)
    for section, values in subs.items():
        top[section] = hints[section](**values)
    return EngineConfig(**top)


def engine_config_from_args(
    ns: argparse.Namespace, *, scheduler: str | None = None, **defaults: Any
) -> EngineConfig:
    """The EngineConfig the flags describe (EngineError on bad values): flags given >
    `defaults` (e.g. a workload preset's) > the command's defaults > EngineConfig's."""
    settings = engine_settings(ns)
    if scheduler is None and "scheduler" in settings:
        scheduler = scheduler_names(settings["scheduler"])
        if len(scheduler) != 1:
            raise EngineError(f"--scheduler: one policy here, got {settings['scheduler']!r}")
        scheduler = scheduler[0]
    settings.pop("scheduler", None)
    return build_engine_config(settings, {**command_defaults(ns), **defaults}, scheduler=scheduler)


def engine_argv(settings: Mapping[str, Any]) -> list[str]:
    """The settings as engine flags (e.g. for a `cbbench serve` child process)."""
    out: list[str] = []
    for dest, value in settings.items():
        if value is None:
            continue
        f = FLAGS[dest]
        if f.kind == "bool":
            out.append(f.name if value else f"--no-{f.name[2:]}")
        elif f.kind == "ints":
            out += [f.name, ",".join(str(x) for x in value)]
        else:
            out += [f.name, str(value)]
    return out


def engine_value(ns: argparse.Namespace, dest: str) -> Any:
    """One engine setting: as given, else the command's default, else EngineConfig's."""
    value = getattr(ns, dest, None)
    if value is not None:
        return value
    return command_defaults(ns).get(dest, FLAGS[dest].default)
