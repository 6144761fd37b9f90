"""Simulation: offline replay of a workload through the engine on the simulated executor
(`simulate`, `arrivals`), calibrating the cost model against the real engine
(`calibration`, `calibration_grid`) and checking it on held-out workloads (`validation`).

Layer: simulation (drives the engine; nothing in the engine imports it).
Imports: config, core, engine, execution, model, workloads.
"""
