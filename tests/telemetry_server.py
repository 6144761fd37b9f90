"""A real loopback HTTP server that serves Prometheus text for the telemetry tests."""

from __future__ import annotations

import math
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "metrics"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


class MetricsServer:
    """Serves `text` at /metrics on 127.0.0.1 (ephemeral port); `text` can change any time."""

    def __init__(self, text: str, content_type: str = "text/plain; version=0.0.4") -> None:
        self.text = text
        self.content_type = content_type
        self.hits = 0
        self.release = threading.Event()  # set to unblock handlers when `hang` is on
        self.hang = False
        self.delay_s = 0.0  # each scrape answered this late (a slow exporter)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                outer.hits += 1
                if outer.hang:
                    outer.release.wait(10)
                if outer.delay_s:
                    time.sleep(outer.delay_s)
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                body = outer.text.encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", outer.content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (the timeout tests)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @property
    def url(self) -> str:
        return self.base_url + "/metrics"

    def __enter__(self) -> MetricsServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def set_value(text: str, name: str, value: float) -> str:
    """Replace the value of every sample line of `name` (any labels)."""
    pat = re.compile(rf"^({re.escape(name)}(?:\{{[^}}]*\}})?) \S+$", re.M)
    out, n = pat.subn(lambda m: f"{m.group(1)} {value!r}", text)
    assert n, f"no sample {name} in the text"
    return out


def observe(text: str, family: str, values: list[float]) -> str:
    """Add observations to histogram `family` in exposition text (buckets, _count, _sum)."""

    def bump_bucket(m: re.Match) -> str:
        le = m.group(2)
        bound = math.inf if le == "+Inf" else float(le)
        extra = sum(1 for v in values if v <= bound)
        return f"{m.group(1)} {float(m.group(3)) + extra!r}"

    bucket = re.compile(
        rf'^({re.escape(family)}_bucket\{{[^}}]*le="([^"]+)"[^}}]*\}}) (\S+)$', re.M
    )
    text, n = bucket.subn(bump_bucket, text)
    assert n, f"no histogram {family} in the text"
    for suffix, add in (("_count", len(values)), ("_sum", sum(values))):
        pat = re.compile(rf"^({re.escape(family + suffix)}(?:\{{[^}}]*\}})?) (\S+)$", re.M)
        text = pat.sub(lambda m, add=add: f"{m.group(1)} {float(m.group(2)) + add!r}", text)
    return text
