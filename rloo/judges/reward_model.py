"""A reward model as a judge: the completion with the higher score wins. It may differ from the training reward
model (a held-out or larger one), with its own tokenizer, so it reads text and tokenizes it itself."""

from __future__ import annotations

import math

import torch

from rloo.data.padding import left_pad
from rloo.judges.base import Judge, Verdict


class RewardModelJudge(Judge):
    """Scores prompt + completion (+ EOS, as reward models are trained) and compares the two scores.

    `path` null: the run's own reward model (filled in by `build_judge`); `tie_margin`: score differences up to it
    are ties.
    """

    name = "reward_model"

    def __init__(
        self,
        *,
        path: str | None,
        tokenizer: str | None,
        append_eos: bool,
        tie_margin: float,
        batch_size: int,
        dtype: str,
    ):
        # the settings are conf/judge/reward_model.yaml's (documented and defaulted there)
        self.path, self.tokenizer_path, self.append_eos = path, tokenizer, append_eos
        self.tie_margin, self.batch_size, self.dtype = tie_margin, batch_size, dtype
        self.model = self.tokenizer = None

    def setup(self, device="cpu") -> None:
        if self.model is not None:
            return
        from rloo.models.loading import load_reward_model, load_tokenizer

        self.tokenizer = load_tokenizer(self.tokenizer_path or self.path)
        self.model = load_reward_model(self.path, self.dtype, self.tokenizer).to(device)

    @torch.no_grad()
    def scores(self, prompts: list[str], completions: list[str]) -> torch.Tensor:
        from rloo.generation.forward import reward_scores

        eos = [self.tokenizer.eos_token_id] if self.append_eos and self.tokenizer.eos_token_id is not None else []
        texts = [p + c for p, c in zip(prompts, completions)]
        encoded = [ids + eos for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]
        device = next(self.model.parameters()).device
        out = []
        for start in range(0, len(encoded), self.batch_size):
            ids, mask = left_pad(encoded[start : start + self.batch_size], self.tokenizer.pad_token_id)
            out.append(reward_scores(self.model, ids.to(device), mask.to(device)).cpu())
        return torch.cat(out) if out else torch.empty(0)

    def judge(self, prompts: list[str], candidates: list[str], others: list[str]) -> list[Verdict]:
        self.setup()
        pairs = zip(self.scores(prompts, candidates).tolist(), self.scores(prompts, others).tolist())
        return [self.compare(mine, theirs) for mine, theirs in pairs]

    def compare(self, mine: float, theirs: float) -> Verdict:
        """A win, tie or loss by the score difference; a pair whose score is not finite (a reward model that
        overflowed or returned nan) is invalid, never a win or a loss."""
        if not (math.isfinite(mine) and math.isfinite(theirs)):
            return Verdict(None, raw=f"{mine} vs {theirs}", error=f"non-finite reward-model score ({mine} vs {theirs})")
        d = mine - theirs
        return Verdict(0.5 if abs(d) <= self.tie_margin else float(d > 0), raw=f"{d:+.4f}")
