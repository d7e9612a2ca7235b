"""Pairwise judges: given a prompt and two completions, which is better (or a tie, or no valid answer).

Every judge returns one `Verdict` per pair, from the point of view of the first completion (the candidate):
win 1.0, tie 0.5, loss 0.0, invalid None. Judges that show the pair to a model randomise the A/B order
per pair from a recorded seed and undo the swap before returning.
"""

from rloo.judges.base import Judge, Verdict, judge_pairs, swap_orders

__all__ = ["Judge", "Verdict", "build_judge", "judge_pairs", "swap_orders"]


def build_judge(judge_cfg, reward_model: str | None = None, tokenizer: str | None = None) -> Judge | None:
    """The judge a `judge/` config describes (None for judge=none); loads nothing until `setup`.

    A reward-model judge without a path uses the run's own reward model (`reward_model`, `tokenizer`).
    """
    if not judge_cfg or judge_cfg.get("_target_") is None:
        return None
    from hydra.utils import instantiate

    from rloo.judges.reward_model import RewardModelJudge

    judge = instantiate(judge_cfg, _convert_="all")
    if isinstance(judge, RewardModelJudge) and judge.path is None:
        judge.path, judge.tokenizer_path = reward_model, judge.tokenizer_path or tokenizer
    return judge
