"""The CBBENCH_* on/off switches read one way: unset, empty, 0, false, no or off is "not set"."""

from __future__ import annotations

import os

FALSE_WORDS = frozenset({"", "0", "false", "no", "off"})


def env_flag(name: str) -> bool:
    """True when the switch `name` is set to anything but empty/0/false/no/off (any case).

    `CBBENCH_NO_CREAD=0` therefore keeps the compiled read path on, as a user expects;
    `CBBENCH_NO_CREAD=1` (or `true`, `yes`, `on`) turns it off.
    """
    return os.environ.get(name, "").strip().lower() not in FALSE_WORDS
