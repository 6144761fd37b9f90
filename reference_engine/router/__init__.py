"""The global scheduler across engine replicas: routing policies (`round_robin`,
`least_outstanding`, `kv_aware`, `prefix_affinity`, one file each behind `policy.RoutingPolicy`),
prompt-prefix hashing (`prefix`), the OpenAI-compatible router server that fronts replicas
by URL (`upstream`, `app`, `metrics`, `serve`) and the same policies over N simulated
engines on one virtual clock (`cluster_sim`).

Layer: router (beside the server, at the top of the engine).
Imports: config, core, engine, execution, kv_transfer, model, server, sim, workloads.
"""
