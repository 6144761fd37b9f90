"""Errors a user can cause; the CLI prints them as one line and exits non-zero."""


class CbbenchError(Exception):
    """Bad flag, unreadable result folder, unreachable server: says what and where."""
