"""The chunked body's common case for the raw client (`h1conn.Conn`): a read that is exactly
a run of whole chunks, unframed with a few C-level passes instead of a loop per chunk."""

from __future__ import annotations

from itertools import repeat

_HEX_GET = {b"%x" % n: n for n in range(4096)}.get  # a chunk's size line -> its size


def whole_chunks(data: bytes) -> tuple[bytes, bool] | None:
    """(the chunks' payload, whether the last chunk ended the body) when `data` is exactly a
    run of whole chunks, each `size CRLF payload CRLF` (the body's end: `0 CRLF CRLF`);
    None for anything else (extensions, trailers, CRLF in a payload, a partial chunk),
    which the state machine reads. A few C-level passes instead of a loop per chunk."""
    parts = data.split(b"\r\n")  # size, payload, size, payload, ..., b""
    if len(parts) % 2 == 0 or parts[-1]:
        return None
    sizes, payloads = parts[0:-1:2], parts[1::2]
    lens = list(map(len, payloads))
    got = list(map(_HEX_GET, sizes))  # a table for the usual spelling (lowercase, < 4 KiB)
    if got != lens:
        if None not in got:
            return None
        try:  # any other spelling: as int() reads it, as before the table
            if list(map(int, sizes, repeat(16, len(sizes)))) != lens:
                return None
        except ValueError:
            return None
    last = not sizes[-1].strip(b"0")  # "0" (or "000"): the last chunk, no trailers
    if b"" in payloads[:-1] or b"" in payloads[-1:] and not last:
        return None  # a 0-size chunk before the end: let the state machine decide
    return b"".join(payloads), last
