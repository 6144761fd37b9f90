"""Prefill/decode disaggregation's KV transfer: the payload a prefill worker ships (one
request's KV blocks in the cache's own storage dtype, so --kv-cache-dtype fp8/int8 halves or
quarters the bytes) and the one connector interface that moves it (vLLM keeps the same in
`vllm/distributed/kv_transfer/`). docs/disaggregation.md.

Layer: kv_transfer (beside core, below engine and server).
Imports: nothing.
"""
