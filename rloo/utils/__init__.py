"""Leaves every layer may use: errors, config-key fields, atomic writes, caches, memory, run-dir ownership,
resume and random states."""
