"""A local causal LM as a judge: show it the comparison prompt and compare its next-token probabilities of the two
labels. No sampling, no parsing, so it never answers invalidly; the A/B order is randomised as for the API judge."""

from __future__ import annotations

import torch

from rloo.data.padding import left_pad
from rloo.judges.base import Judge, Verdict, swap_orders
from rloo.judges.prompts import TLDR_COMPARISON_NEXT_TOKEN, render_comparison


class HFJudge(Judge):
    name = "hf"

    def __init__(
        self,
        *,
        path: str,
        tokenizer: str | None,
        labels: tuple[str, str],
        seed: int,
        batch_size: int,
        dtype: str,
        prompt_template: str = TLDR_COMPARISON_NEXT_TOKEN,
    ):
        # the settings are conf/judge/hf.yaml's (documented and defaulted there)
        self.path, self.tokenizer_path, self.labels = path, tokenizer, tuple(labels)
        self.prompt_template, self.seed, self.batch_size, self.dtype = prompt_template, seed, batch_size, dtype
        self.model = self.tokenizer = None
        self.label_ids: list[int] = []

    def setup(self, device="cpu") -> None:
        if self.model is not None:
            return
        from transformers import AutoModelForCausalLM

        from rloo.models.loading import DTYPES, freeze, load_tokenizer

        self.tokenizer = load_tokenizer(self.tokenizer_path or self.path)
        self.label_ids = []
        for label in self.labels:
            ids = self.tokenizer(label, add_special_tokens=False)["input_ids"]
            if len(ids) != 1:
                raise ValueError(
                    f"judge.labels: {label!r} is {len(ids)} tokens for {self.tokenizer_path or self.path}; "
                    "each label must be one token"
                )
            self.label_ids.append(ids[0])
        self.model = freeze(AutoModelForCausalLM.from_pretrained(self.path, dtype=DTYPES[self.dtype])).to(device)

    @torch.no_grad()
    def label_logprobs(self, texts: list[str]) -> torch.Tensor:
        """log p(label A), log p(label B) as the next token after each text, `[N, 2]`, normalised over the two."""
        from rloo.generation.sampling import position_ids_for

        device = next(self.model.parameters()).device
        encoded = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        out = []
        for start in range(0, len(encoded), self.batch_size):
            ids, mask = left_pad(encoded[start : start + self.batch_size], self.tokenizer.pad_token_id)
            ids, mask = ids.to(device), mask.to(device)
            logits = (
                self.model(
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=position_ids_for(mask),
                    logits_to_keep=1,
                    use_cache=False,
                )
                .logits[:, -1]
                .float()
            )
            out.append(logits[:, self.label_ids].log_softmax(-1).cpu())
        return torch.cat(out) if out else torch.empty(0, 2)

    def judge(self, prompts: list[str], candidates: list[str], others: list[str]) -> list[Verdict]:
        self.setup()
        swapped = swap_orders(self.seed, prompts, candidates, others)
        texts = [
            render_comparison(self.prompt_template, p, *((o, c) if s else (c, o)))
            for p, c, o, s in zip(prompts, candidates, others, swapped)
        ]
        verdicts = []
        for (lp_a, lp_b), s in zip(self.label_logprobs(texts).tolist(), swapped):
            lp_candidate, lp_other = (lp_b, lp_a) if s else (lp_a, lp_b)
            outcome = 0.5 if lp_candidate == lp_other else float(lp_candidate > lp_other)
            verdicts.append(Verdict(outcome, s, raw=f"p(A)={torch.tensor(lp_a).exp():.4f}"))
        return verdicts
