"""Sampling and the forward passes: the sampler settings, the lean KV-cache decode and its static-shape
CUDA-graph form, the training forward, the fast paths' statement, and the one rollout every algorithm shares."""
