"""The client layer: one request to an OpenAI-compatible server and what came back.

The raw HTTP/1.1 transport (`http1`, `h1conn`) and httpx behind one response handler
(`response`, with `fast_events`: the common SSE chunk by one msgspec typed decode when
msgspec is installed), the SSE parser (`sse`), the stream classifier every API's parser feeds
(`stream_kinds`: reasoning, answer, tool-call tokens; TTFO), the event loop (`aio`: uvloop
when installed), and `api.OpenAIClient`, which fills a `RequestRecord` per request. It knows
nothing of load: when to send is the load layer's business.

Layer: client.
Imports: results (the record it fills).
"""
