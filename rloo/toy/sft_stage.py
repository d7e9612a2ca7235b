"""Supervised fine-tuning of a causal LM on (prompt, reference): the loss is on completion tokens only.

Batches use the rollout layout (`rloo.generation.rollout`): prompts left-padded `[N, P]`, completions (reference
tokens + EOS) right-padded `[N, T]`, and log-probs come from `completion_logprobs`, so the positions the
SFT loss trains are exactly the ones RL later reads.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor

from rloo.algorithms.optim import adamw_with_schedule
from rloo.data.padding import left_pad
from rloo.generation.forward import completion_logprobs
from rloo.objectives import masked_mean


def pad_right(rows: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Token id lists -> ids `[N, T]`, mask `[N, T]`, padded on the right."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


def encode_completion(tokenizer, text: str) -> list[int]:
    """Completion tokens as the policy emits them: the text's tokens, then EOS."""
    return tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]


def encode_sft_examples(
    tokenizer, examples: list[dict], prompt_key: str = "prompt", reference_key: str = "reference"
) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, reference ids + EOS) per example; prompt and completion are tokenized apart, as in a rollout."""
    return [
        (
            tokenizer(ex[prompt_key], add_special_tokens=False)["input_ids"],
            encode_completion(tokenizer, ex[reference_key]),
        )
        for ex in examples
    ]


def collate_sft(pad_id: int):
    """A DataLoader collate_fn: (prompt ids, completion ids) pairs -> the rollout-layout batch dict."""

    def collate(rows):
        prompt_ids, prompt_mask = left_pad([p for p, _ in rows], pad_id)
        completion_ids, completion_mask = pad_right([c for _, c in rows], pad_id)
        return {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "completion_ids": completion_ids,
            "completion_mask": completion_mask,
        }

    return collate


def sft_loss(model, batch: dict[str, Tensor]) -> Tensor:
    """Mean negative log-likelihood per completion token (scalar)."""
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)  # [N, P+T]
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)  # [N, P+T]
    logprobs = completion_logprobs(
        model, input_ids, attention_mask, batch["completion_ids"], batch["completion_mask"], temperature=1.0
    )  # [N, T]
    return -masked_mean(logprobs, batch["completion_mask"])  # -1/|y| sum_t log pi(y_t | x, y_<t), over the batch


class SFTModule(L.LightningModule):
    def __init__(self, model, lr: float, warmup_ratio: float, weight_decay: float = 0.0):
        super().__init__()
        self.model = model
        self.lr, self.weight_decay, self.warmup_ratio = lr, weight_decay, warmup_ratio

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = sft_loss(self.model, batch)
        self.log("sft/loss", loss, prog_bar=True, batch_size=batch["prompt_ids"].shape[0])
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
