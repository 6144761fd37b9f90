"""Sweeps: one benchmark per load level into one folder (`levels`: the levels, saturation
watch; `runner`: the library call behind `cbbench sweep`), and the SLO capacity search
(`capacity`: the highest rate that keeps goodput, over levels judged by `capacity_level`;
`capacity_run`: the search on a server).

Layer: sweep (many runs of the load layer).
Imports: conclusions, load, results, telemetry.
"""
