"""Incremental Server-Sent Events parser over raw bytes.

Feed it whatever the socket delivered (events may be split anywhere, several may arrive in
one read); it returns the `data` payloads of the events completed so far. Only `data` matters
to OpenAI-style streams: `event`, `id`, `retry` and comment lines are skipped. Lines end in
LF or CRLF; an event's several `data` lines are joined with LF, as the SSE spec says.
"""

from __future__ import annotations


class SSEParser:
    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf + data
        if b"\r" in data or self._buf.endswith(b"\r"):  # a CR at the end waits for its LF
            buf = buf.replace(b"\r\n", b"\n")
        if b"\n\n" not in buf:
            self._buf = buf
            return []
        *events, self._buf = buf.split(b"\n\n")
        out: list[bytes] = []
        for event in events:
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

    @property
    def pending(self) -> bytes:
        """Bytes of an event not yet terminated (non-empty at the end = a truncated stream)."""
        return self._buf.strip()
