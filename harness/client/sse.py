"""Incremental Server-Sent Events parser over raw bytes.

Feed it whatever the socket delivered (events may be split anywhere, several may arrive in
one read); it returns the `data` payloads of the events completed so far. Only `data` matters
to OpenAI-style streams: `event`, `id`, `retry` and comment lines are skipped. Lines end in
LF or CRLF; an event's several `data` lines are joined with LF, as the SSE spec says.

Linear in the bytes fed, however an event is split: reads of an unfinished event are kept as
they came (a list, no copy) and only the new read is searched for the end of an event, so a
64 MB `data:` line arriving in 64 KiB reads costs one join, not a thousand growing copies.
"""

from __future__ import annotations


class SSEParser:
    __slots__ = ("_parts", "_cr")

    def __init__(self) -> None:
        self._parts: list[bytes] = []  # reads of the unfinished event, as they came
        self._cr = False  # the last read ended in CR: its LF may come next

    def feed(self, data: bytes) -> list[bytes]:
        if self._cr:
            data = b"\r" + data
            self._cr = False
        if data.endswith(b"\r"):  # a CR at the end waits for its LF
            data, self._cr = data[:-1], True
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        parts = self._parts
        if not parts and data[-2:] == b"\n\n" and data[:6] == b"data: ":
            # the common case: whole one-line `data: ` events; a line break other than the
            # two ending each event (another field, a comment, a multi-line event) -> below
            out = data[6:-2].split(b"\n\ndata: ")
            if data.count(b"\n") == 2 * len(out):
                return out
        end = data.rfind(b"\n\n")
        if end < 0:
            # an event may end across the boundary: "...\n" + "\n..."
            if parts and data[:1] == b"\n" and parts[-1][-1:] == b"\n":
                end = -1
            else:
                if data:
                    parts.append(data)
                return []
        if parts:
            parts.append(data[: end + 2] if end >= 0 else b"\n")
            done = b"".join(parts)
            parts.clear()
        else:
            done = data[: end + 2]
        rest = data[end + 2 :]
        if rest:
            parts.append(rest)
        return _events(done)

    @property
    def partial(self) -> bool:
        """Bytes of an unfinished event are held (they join the next read's first event)."""
        return bool(self._parts) or self._cr

    @property
    def pending(self) -> bytes:
        """Bytes of an event not yet terminated (non-empty at the end = a truncated stream)."""
        return b"".join(self._parts).strip()


def _events(buf: bytes) -> list[bytes]:
    """The data payloads of `buf`, a run of complete events (it ends in a blank line)."""
    out: list[bytes] = []
    for event in buf.split(b"\n\n")[:-1]:
        if event.startswith(b"data:") and b"\n" not in event:  # the common case: one line
            out.append(event[6:] if event[5:6] == b" " else event[5:])
            continue
        lines = [
            line[6:] if line[5:6] == b" " else line[5:]
            for line in event.split(b"\n")
            if line.startswith(b"data:")
        ]
        if lines:
            out.append(b"\n".join(lines))
    return out
