"""The raw client's cost per response, offline: recorded reads of the zero-delay fake server's
stream (as `cbbench selftest --compare locust` gets them) fed through `Conn.feed`, the response
handler, `finish` and the record's JSON line, with the compiled read path (cread.py) and with
the Python path, alternating in one process (CPU time, min of repeats: a shared host's noise
only adds).

    python -m tests.benchmarks.studies.client_read_path [--tokens 16] [--repeats 40]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: servers, read_paths

from cbbench.harness.client import h1conn, response  # noqa: E402
from cbbench.harness.client.api import ClientConfig, OpenAIClient  # noqa: E402
from cbbench.harness.results.records import RequestRecord  # noqa: E402
from cbbench.harness.results.run_folder import _json_bytes  # noqa: E402
from read_paths import FeedConn  # noqa: E402
from servers.fake import Behavior, FakeServerConfig, threaded  # noqa: E402


def record_reads(tokens: int, n: int = 40) -> list[bytes]:
    """The reads of one response as the client got them (the most common split of n)."""
    got: list[list[bytes]] = []
    feed = h1conn.Conn.feed

    def spy(self, data, t):  # noqa: ANN001, ANN202
        got[-1].append(bytes(data))
        return feed(self, data, t)

    async def go(url: str) -> None:
        client = OpenAIClient(ClientConfig(base_url=url, model="m"), time.monotonic_ns())
        try:
            for i in range(n):
                got.append([])
                rec = RequestRecord(id=f"c{i}", index=i, prompt_len=16, output_len=tokens)
                await client.send(rec, list(range(16)))
                assert rec.ok, rec.error
        finally:
            await client.aclose()

    h1conn.Conn.feed = spy
    try:
        with threaded(FakeServerConfig(Behavior())) as srv:
            asyncio.run(go(srv.url))
    finally:
        h1conn.Conn.feed = feed
    splits = collections.Counter(len(r) for r in got[n // 4 :])
    k = splits.most_common(1)[0][0]
    return next(r for r in got[n // 4 :] if len(r) == k)


def per_response_us(reads: list[bytes], compiled: bool, n: int = 2000) -> float:
    response.use_compiled_read(compiled)
    loop = asyncio.new_event_loop()
    conn = FeedConn(h1conn.PoolStats())
    try:
        t0 = time.process_time()
        for i in range(n):
            rec = RequestRecord(id="c", index=i, prompt_len=16, output_len=16)
            r = response.Response(rec, True, False)
            conn._reset(r, loop)
            r.sent(1_000)
            for j, raw in enumerate(reads):
                conn.feed(raw, 2_000 + j * 1_000)
            r.end(9_000)
            response.finish(rec, r, 0, 10_000)
            _json_bytes(rec.to_dict())
        return (time.process_time() - t0) / n * 1e6
    finally:
        loop.close()
        response.use_compiled_read(True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=40)
    args = ap.parse_args()
    if not response.use_compiled_read(True):
        print("the compiled read path is not available here", file=sys.stderr)
        return 1
    reads = record_reads(args.tokens)
    whole = b"".join(reads)
    cut = whole.index(b"\r\n\r\n") + 4
    splits = {
        f"as recorded ({len(reads)} reads)": reads,
        "head, then the body": [whole[:cut], whole[cut:]],
        "one read": [whole],
    }
    print(
        f"a {args.tokens}-token response of {len(whole)} bytes; CPU us per response, "
        f"min of {args.repeats}:"
    )
    for name, split in splits.items():
        best = {True: float("inf"), False: float("inf")}
        for _ in range(args.repeats):
            for compiled in (False, True):
                best[compiled] = min(best[compiled], per_response_us(split, compiled, 500))
        py, c = best[False], best[True]
        print(
            f"  {name}: Python path {py:.1f}, compiled {c:.1f} ({(py - c) / py * 100:.0f} % less)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
