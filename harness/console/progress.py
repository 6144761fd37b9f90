"""A rich progress bar for a long in-process loop (a replay): requests finished of total,
elapsed time; transient on a terminal; when output is piped (CI logs), a plain line every
PLAIN_EVERY_S seconds instead, so a long loop is never silent."""

from __future__ import annotations

import contextlib
import threading
import time
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

PLAIN_EVERY_S = 5.0


@contextlib.contextmanager
def _plain(console: Console, description: str, total: int | None, unit: str):
    """Piped: yields a dict to keep `done` / `description` in; prints them every PLAIN_EVERY_S
    seconds (nothing for a loop shorter than that)."""
    state: dict = {"done": 0, "total": total, "description": description}
    stop = threading.Event()
    t0 = time.monotonic()

    def lines() -> None:
        while not stop.wait(PLAIN_EVERY_S):
            of = f"/{state['total']}" if state["total"] else ""
            console.print(
                f"{state['description']}: {state['done']}{of} {unit}, "
                f"{time.monotonic() - t0:.0f} s",
                highlight=False, markup=False, soft_wrap=True,
            )  # fmt: skip

    thread = threading.Thread(target=lines, daemon=True, name="progress")
    thread.start()
    try:
        yield state
    finally:
        stop.set()
        thread.join(5)


@contextlib.contextmanager
def request_progress(
    console: Console, description: str, total: int
) -> Iterator[Callable[[int, int], None]]:
    """Yields `update(done, total)` (the replay's `on_progress`)."""
    if not console.is_terminal:
        with _plain(console, description, total, "requests") as state:
            yield lambda done, n: state.update(done=done, total=n)
        return
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


@contextlib.contextmanager
def step_progress(
    console: Console, description: str, total: int | None, unit: str = "steps"
) -> Iterator[Callable[..., None]]:
    """A bar over a few long steps (engines, grid points, runs): yields
    `update(done, description=None)`; `total` None shows a spinner and the elapsed time.
    Transient on a terminal, plain lines when output is piped, like request_progress."""
    if not console.is_terminal:
        with _plain(console, description, total, unit) as state:

            def plain_update(done: int, description: str | None = None) -> None:
                state["done"] = done
                if description is not None:
                    state["description"] = description

            yield plain_update
        return
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(description, total=total)

        def update(done: int, description: str | None = None) -> None:
            kw = {} if description is None else {"description": description}
            progress.update(task, completed=done, **kw)

        yield update
