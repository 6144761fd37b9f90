"""What the user sees while a run goes: the rich live view and the summary table (`live`), a
progress bar for long in-process loops (`progress`), how a run ended (`outcome`).

Layer: console (presentation of results, no I/O with servers).
Imports: results.
"""
