"""The prefix-cache flags, declared once: `--flush-cache`, `--prime`, `--session-header`
(cache.py does what they ask). Light to import: `--help` stays fast."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

DEFAULT_SESSION_HEADER = "x-session-id"


@dataclass
class CacheOptions:
    flush_cache: bool = False
    prime: bool = False
    session_header: str = DEFAULT_SESSION_HEADER  # "" = send none

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> CacheOptions:
        return cls(
            flush_cache=getattr(ns, "flush_cache", False),
            prime=getattr(ns, "prime", False),
            session_header=getattr(ns, "session_header", DEFAULT_SESSION_HEADER),
        )


def add_cache_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--flush-cache",
        action="store_true",
        help="empty the server's prefix cache before the run (POST /reset_prefix_cache, "
        "else /flush_cache): back-to-back runs do not share hits",
    )
    p.add_argument(
        "--prime",
        action="store_true",
        help="send each distinct shared prefix once, unmeasured, before the run",
    )
    p.add_argument(
        "--session-header",
        default=DEFAULT_SESSION_HEADER,
        metavar="NAME",
        help=f"header carrying a session's id on each of its requests (default "
        f"{DEFAULT_SESSION_HEADER}; '' sends none)",
    )
