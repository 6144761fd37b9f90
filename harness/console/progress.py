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
        disable=not console.is_terminal,  # piped: not even a blank line
    ) as progress:
        task = progress.add_task(description, total=total)
        yield lambda done, n: progress.update(task, completed=done, total=n)


@contextlib.contextmanager
def step_progress(
    console: Console, description: str, total: int | None, unit: str = "steps"
) -> Iterator[Callable[..., None]]:
    """A bar over a few long steps (engines, grid points, runs): yields
    `update(done, description=None)`; `total` None shows a spinner and the elapsed time.
    Transient on a terminal, silent when output is piped, like request_progress."""
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,  # piped: not even a blank line
    ) as progress:
        task = progress.add_task(description, total=total)

        def update(done: int, description: str | None = None) -> None:
            kw = {} if description is None else {"description": description}
            progress.update(task, completed=done, **kw)

        yield update
