"""The engine's core types: one request inside the engine (`sequence`), paged KV-cache
bookkeeping (`block_manager`), the scheduler/executor boundary (`executor`), what a step
reports (`outputs`, `spec_decode_stats`).

Layer: engine core (data and interfaces; no torch model, no policy).
Imports: nothing.
"""
