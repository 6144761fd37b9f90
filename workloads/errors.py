"""Errors a user can cause with a workload spec or trace file."""


class WorkloadError(ValueError):
    """Bad spec, unreadable trace, malformed row: the message names file and line."""
