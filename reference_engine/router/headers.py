"""Which of a client's request headers the router passes on to the replica (RFC 9110 7.6.1).

End-to-end headers go through unchanged: the session id (`x-session-id`, or whatever
`--session-header` names: a replica, a second router or SGLang's session routing reads it),
`x-request-id`, `anthropic-version` / `anthropic-beta`, the client's own `user-agent` and
`x-stainless-*`. Hop-by-hop headers do not (connection, keep-alive, transfer-encoding, te,
trailer, upgrade, proxy-*, and any header the client's `Connection` names), nor those that
describe the client's connection to the router: host and content-length (the upstream
client sets both), accept-encoding (the router relays a stream's raw bytes and passes no
content-encoding back).

Credentials: with a replica key (`--replica-api-key`, by default `--api-key`) the client's
`authorization` and `x-api-key` were for the router; the replicas get the router's key in
their place. Without one the client's credentials pass through and the replicas judge them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# the client's connection to the router, not the request: httpx sets its own
CONNECTION_BOUND = frozenset({"host", "content-length", "accept-encoding", "expect"})
CREDENTIALS = ("authorization", "x-api-key")


def forward_headers(
    client: Iterable[tuple[str, str]], replica_auth: Mapping[str, str]
) -> dict[str, str]:
    """The headers to send upstream: the client's end-to-end ones (names lower-cased; a
    repeated header joined with ", "), a JSON content type if it sent none, and the
    replica key (`replica_auth`: {"authorization": "Bearer KEY"} or empty) over its
    credentials."""
    pairs = [(k.lower(), v) for k, v in client]
    named = {
        t.strip().lower() for k, v in pairs if k == "connection" for t in v.split(",")
    }  # "Connection: close, x-foo": x-foo is hop-by-hop too
    out: dict[str, str] = {}
    for k, v in pairs:
        if k in HOP_BY_HOP or k in CONNECTION_BOUND or k in named:
            continue
        out[k] = f"{out[k]}, {v}" if k in out else v
    out.setdefault("content-type", "application/json")
    if replica_auth:
        for k in CREDENTIALS:
            out.pop(k, None)
        key = replica_auth["authorization"]
        out["authorization"] = key
        if any(k == "x-api-key" for k, _ in pairs):  # Anthropic's place for it: keep it there
            out["x-api-key"] = key.removeprefix("Bearer ")
    return out
