"""The OpenAI-compatible server: the FastAPI app (`app`, `serving`, `protocol`), the engine in
its own process behind IPC (`engine_core`, `core_client`, `ipc`, `async_engine`), request
bodies parsed off the event loop (`body`), Prometheus metrics (`metrics`), errors and guards.
`lifeline` (children die with their parent) is stdlib-only: the harness's workers use it too.
`quick_exit`: a finished server process ends without Python's slow teardown.

Layer: server (the top of the engine).
Imports: config, core, engine, kv_transfer, model.
"""
