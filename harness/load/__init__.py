"""The load generator: which request goes when. Typed load options (`options`), prompts of
exact token length (`prompts`, `chat_template`), requests built ahead of their send time
(`lookahead`), multi-turn sessions (`sessions`), the per-worker schedule of sends, open or
closed loop (`loadgen`), N worker processes (`workers`), the N-way split and shared start of
workers and hosts (`shards`), GC control in the measured phase (`heap`), and one benchmark
run end to end (`runner`).

Layer: load (above the client, below sweeps, probe and Locust).
Imports: client, conclusions, console, results, telemetry, workloads, reference_engine.server.lifeline (stdlib-only, shared).
"""
