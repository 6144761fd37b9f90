"""The metadata that makes a config field a command-line flag: `field(default=..., metadata=
flag("--name", "help"))`. options.py reads it from every engine settings dataclass
(config.py, policy_config.py, speculative_config.py): one field = one flag."""

from __future__ import annotations

from typing import Any


def flag(
    name: str,
    help: str,
    *,
    unit: str | None = None,
    choices: tuple[str, ...] | None = None,
    aliases: tuple[str, ...] = (),
    metavar: str | None = None,
    auto: str | None = None,
) -> dict[str, Any]:
    """Field metadata naming the field's command-line flag (see options.py).

    `unit` is said in --help ("GiB", "s"); `aliases` are older spellings that keep working
    (deprecated); a bool field becomes `--name/--no-name`; `auto` names a bool field of the
    same dataclass that the word `auto` (or `auto:N`) turns on for this int flag, the int
    then being the ceiling (N, else what the flag would be without the word)."""
    return {
        "flag": {
            "name": name,
            "help": help,
            "unit": unit,
            "choices": choices,
            "aliases": aliases,
            "metavar": metavar,
            "auto": auto,
        }
    }
