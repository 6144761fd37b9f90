"""Servers the harness starts: the scripted OpenAI-compatible server for tests and
`cbbench selftest` (`fake_server`, `fake_conn`), the launcher that starts any server as a
subprocess and talks to it over HTTP only (`launcher`), and the peer engines of
`cbbench compare-engines` (`peer_engines`).

Layer: servers (beside the load generator; neither imports the other).
Imports: client (the event loop and SSE framing), reference_engine.server.lifeline
(stdlib-only, shared: a launched child dies with its launcher).
"""
