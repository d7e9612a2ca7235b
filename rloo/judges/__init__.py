"""Pairwise judges: given a prompt and two completions, which is better (or a tie, or no valid answer).

Every judge returns one `Verdict` per pair, from the point of view of the first completion (the candidate):
win 1.0, tie 0.5, loss 0.0, invalid None. Judges that show the pair to a model randomise the A/B order
per pair from a recorded seed and undo the swap before returning.
"""

from rloo.judges.base import Judge, Verdict, swap_orders, win_rate_summary

__all__ = ["Judge", "Verdict", "swap_orders", "win_rate_summary"]
