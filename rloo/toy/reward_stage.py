"""Bradley-Terry reward-model training on (prompt, chosen, rejected).

Sequences use the rollout layout (prompt left-padded, completion + EOS right-padded) and are scored
with `rloo.generation.forward.reward_scores`, so the model is trained at the very token RL reads its score from.
"""

from __future__ import annotations

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor

from rloo.algorithms.optim import adamw_with_schedule
from rloo.data.padding import left_pad
from rloo.generation.forward import reward_scores
from rloo.toy.sft_stage import encode_completion, pad_right


def encode_pairs(tokenizer, pairs: list[dict]) -> list[tuple[list[int], list[int], list[int]]]:
    """(prompt ids, chosen ids + EOS, rejected ids + EOS) per pair."""
    return [
        (
            tokenizer(p["prompt"], add_special_tokens=False)["input_ids"],
            encode_completion(tokenizer, p["chosen"]),
            encode_completion(tokenizer, p["rejected"]),
        )
        for p in pairs
    ]


def collate_pairs(pad_id: int):
    """A DataLoader collate_fn: B pairs -> `[2B, P+T]` ids and mask, the B chosen rows first, then the B rejected."""

    def collate(rows):
        prompt_ids, prompt_mask = left_pad([p for p, _, _ in rows] * 2, pad_id)
        completion_ids, completion_mask = pad_right([c for _, c, _ in rows] + [r for _, _, r in rows], pad_id)
        return {
            "input_ids": torch.cat([prompt_ids, completion_ids], 1),
            "attention_mask": torch.cat([prompt_mask, completion_mask], 1),
        }

    return collate


def bradley_terry_loss(chosen_scores: Tensor, rejected_scores: Tensor) -> Tensor:
    """-mean log sigmoid(r_chosen - r_rejected) over pairs `[B]` -> scalar."""
    return -F.logsigmoid(chosen_scores - rejected_scores).mean()  # -log P(chosen > rejected) under Bradley-Terry


def pair_scores(reward_model, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    """Scores of the chosen `[B]` and rejected `[B]` halves of a `collate_pairs` batch."""
    scores = reward_scores(reward_model, batch["input_ids"], batch["attention_mask"])  # [2B]
    return scores.chunk(2)


class RewardModelModule(L.LightningModule):
    def __init__(self, model, lr: float, warmup_ratio: float, weight_decay: float = 0.0):
        super().__init__()
        self.model = model
        self.lr, self.weight_decay, self.warmup_ratio = lr, weight_decay, warmup_ratio

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        chosen, rejected = pair_scores(self.model, batch)
        loss = bradley_terry_loss(chosen, rejected)
        n_pairs = chosen.shape[0]
        self.log("reward/loss", loss, prog_bar=True, batch_size=n_pairs)
        self.log("reward/accuracy", (chosen > rejected).float().mean(), prog_bar=True, batch_size=n_pairs)
        return loss

    def configure_optimizers(self):
        return adamw_with_schedule(
            self.model.parameters(),
            self.lr,
            int(self.trainer.estimated_stepping_batches),
            self.warmup_ratio,
            "linear",
            self.weight_decay,
        )
