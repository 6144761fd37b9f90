"""What every command's parser shares: errors in one line, and old spellings of a flag kept
working with a one-line notice naming the new one.

argparse's own `error` prints the whole usage before the message (52 lines for serve); here a
bad value is `cbbench serve: error: argument --port: invalid int value: 'x'` and one hint.
An old spelling is registered once, beside the flag (`old_spelling(parser, "--cv",
"--burstiness")`), and `main` says `cbbench workload: note: --cv is the old spelling of
--burstiness (still accepted)` when a command line uses it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line plus one hint (subparsers inherit it)."""

    def error(self, message: str) -> Any:  # argparse's signature: NoReturn
        self.exit(2, f"{self.prog}: error: {message}\n(`{self.prog} --help` lists every flag)\n")


def describe_commands(parser: argparse.ArgumentParser) -> None:
    """Every command (and action, `workload show`) without a description gets its one-line
    help as one, so `cbbench CMD --help` always says what CMD does."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {a.dest: a.help for a in action._choices_actions}
        for name, sub in action.choices.items():
            if not sub.description and helps.get(name):
                sub.description = helps[name][0].upper() + helps[name][1:] + "."
            describe_commands(sub)


# parser prog ("cbbench route") -> {old spelling: new spelling}
OLD_SPELLINGS: dict[str, dict[str, str]] = {}
# parser prog -> {old spelling: converter applied to its value when it differs in meaning}
_CONVERT: dict[str, dict[str, Callable[[Any], Any]]] = {}


def old_spelling(
    parser: argparse.ArgumentParser,
    old: str,
    new: str,
    convert: Callable[[Any], Any] | None = None,
) -> None:
    """Accept `old` as another name of the flag `new` (declared already); `convert` maps a
    value given under the old name to the new flag's meaning (e.g. a CV to a gamma shape)."""
    action = parser._option_string_actions[new]
    if convert is not None:  # its own action: the value is converted, the dest is shared
        parser.add_argument(old, dest=action.dest, type=_then(action.type, convert),
                            default=argparse.SUPPRESS, help=argparse.SUPPRESS)  # fmt: skip
    else:
        action.option_strings.append(old)
        parser._option_string_actions[old] = action
    OLD_SPELLINGS.setdefault(parser.prog, {})[old] = new


def _then(first: Callable[[str], Any] | None, convert: Callable[[Any], Any]) -> Callable:
    def parse(text: str) -> Any:
        return convert(first(text) if first else text)

    return parse


def old_spelling_notes(prog: str, argv: list[str]) -> list[str]:
    """One note per old spelling used in `argv` (`--old` or `--old=value`) of the command
    `prog` or one of its actions (`cbbench workload show`)."""
    used = dict.fromkeys(a.split("=", 1)[0] for a in argv if a.startswith("-"))
    notes = []
    for name, olds in OLD_SPELLINGS.items():
        if name != prog and not name.startswith(prog + " "):
            continue
        notes += [
            f"{prog}: note: {old} is the old spelling of {olds[old]} (still accepted)"
            for old in used
            if old in olds
        ]
    return list(dict.fromkeys(notes))


def print_old_spelling_notes(prog: str, argv: list[str]) -> None:
    for note in old_spelling_notes(prog, argv):
        print(note, file=sys.stderr)


class _Schedulers(argparse.Action):
    """--schedulers: the value, and which spelling was typed (an error names that one)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.scheduler_flag = option_string


def schedulers_flag(parser: argparse.ArgumentParser, help: str) -> None:
    """On a command that compares batching policies (run, sim), `--schedulers NAME[,NAME]` is
    the one spelling, with its own default in `help`; the engine's `--scheduler` (one policy,
    default continuous) becomes its old spelling there. Call after add_engine_args."""
    engine = parser._option_string_actions.pop("--scheduler")
    parser._remove_action(engine)
    for group in parser._action_groups:
        if engine in group._group_actions:
            group._group_actions.remove(engine)
    parser.add_argument("--schedulers", dest="scheduler", action=_Schedulers, default=None,
                        metavar="NAME[,NAME]", help=help)  # fmt: skip
    old_spelling(parser, "--scheduler", "--schedulers")
