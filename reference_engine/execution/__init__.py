"""Executors: what computes a scheduled step. The real one (`model_runner`, with `sampler`,
`rejection_sampler`, `cuda_graphs`, `cpu_linear`) and the simulated one (`sim_executor`, a
virtual clock advanced by `cost_model`'s step time). Both sit behind `core.executor`.

Layer: execution.
Imports: core, kv_transfer, model, kernels.
"""
