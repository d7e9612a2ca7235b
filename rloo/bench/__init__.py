"""python -m rloo.bench: side-by-side cost measurements, each configuration in its own process.

presets.py   model architectures with random weights (no download) and the batch settings of each
worker.py    one configuration in one process: N training steps, timings and peak memory as JSON
peers.py     the same settings through TRL's trainers, when TRL is installed (the optional `bench` extra)
__main__.py  runs the workers, computes the ratios, writes results.json and results.md
"""
