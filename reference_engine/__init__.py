"""cbbench.reference_engine: a PyTorch LLM engine whose batching policy is switchable.

Subpackages, bottom up:

    config      settings: EngineConfig and one sub-config per policy, the flag registry
    core        a request inside the engine (`sequence`), paged KV blocks (`block_manager`),
                the executor interface, outputs and stats
    model       architectures, HF loading, model config, RoPE, tokenizer, chat template
    execution   executors: the model runner (real), the simulated executor and its cost model;
                the sampler, CUDA graphs, CPU projections
    scheduler   the batching policies (static, dynamic, continuous) behind one interface
    spec_decode speculative decoding's proposers
    engine      LLMEngine: schedule -> execute -> update, sync or async
    sim         offline replay through the engine, calibration and its validation
    server      the OpenAI-compatible HTTP server and its engine process

Root modules: `errors`, `sampling_params` (any engine package may import them).
The engine stands alone: nothing here imports the harness.

Layer: reference engine.
Imports: kernels, workloads.
"""
