"""A rich progress bar for a long in-process loop (a replay): requests finished of total,
elapsed time; transient on a terminal, silent when output is piped."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)


@contextlib.contextmanager
def request_progress(
    console: Console, description: str, total: int
) -> Iterator[Callable[[int, int], None]]:
    """Yields `update(done, total)` (the replay's `on_progress`)."""
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("requests"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(description, total=total)
        yield lambda done, n: progress.update(task, completed=done, total=n)
