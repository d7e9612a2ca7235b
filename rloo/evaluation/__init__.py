"""Held-out evaluation (greedy and sampled, with intervals) and pass@k; the judges are rloo.judges."""
