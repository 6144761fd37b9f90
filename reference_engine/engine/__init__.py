"""The engine loop: `llm_engine.LLMEngine` adds requests and steps (schedule -> execute ->
update); `update` applies a computed step to the sequences; `async_scheduling` builds step
N+1 while step N computes.

Layer: engine (on top of scheduler, execution and spec_decode).
Imports: config, core, execution, kv_transfer, model, scheduler, spec_decode.
"""
