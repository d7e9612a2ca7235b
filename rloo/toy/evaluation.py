"""Measurements of the embedded task's bootstrap artifacts: oracle win rate of a greedy policy, reward-model
pair accuracy, and how the reward model's scores track the oracle's."""

from __future__ import annotations

import torch

from rloo.evaluation.heldout import complete
from rloo.generation.forward import reward_scores
from rloo.generation.rollout import chunked
from rloo.generation.settings import SamplingConfig
from rloo.toy.reward_stage import collate_pairs, encode_pairs, pair_scores
from rloo.toy.sft_stage import collate_sft, encode_sft_examples
from rloo.toy.task import ideal_summary, oracle_judge, oracle_score


@torch.no_grad()
def pair_accuracy(reward_model, tokenizer, pairs: list[dict], batch_size: int = 256) -> float:
    """Fraction of pairs where the chosen completion outscores the rejected one."""
    reward_model.eval()
    rows, collate = encode_pairs(tokenizer, pairs), collate_pairs(tokenizer.pad_token_id)
    wins = [
        torch.gt(*pair_scores(reward_model, collate(rows[s : s + batch_size]))) for s in range(0, len(rows), batch_size)
    ]
    return float(torch.cat(wins).float().mean())


def _ranks(x: torch.Tensor) -> torch.Tensor:
    """Ranks with ties given their average rank, as Spearman's rho needs."""
    ranks = torch.empty_like(x)
    ranks[x.argsort()] = torch.arange(len(x), dtype=x.dtype)
    _, group = x.unique(return_inverse=True)
    return torch.zeros_like(x).index_add_(0, group, ranks)[group] / torch.bincount(group).to(x.dtype)[group]


def _pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x - x.mean(), y - y.mean()
    return float((x * y).sum() / (x.norm() * y.norm()).clamp_min(1e-12))


@torch.no_grad()
def evaluate(
    policy, reward_model, tokenizer, validation: list[dict], heldout_pairs: list[dict] | None, max_new_tokens: int
) -> dict:
    """Greedy policy vs the references under the oracle; with a reward model, its accuracy on held-out pairs
    and how well it tracks the oracle on the greedy completions and the references."""
    prompts, references = [ex["prompt"] for ex in validation], [ex["reference"] for ex in validation]
    policy.eval()
    rows = [{"prompt_ids": ids} for ids in tokenizer(prompts, add_special_tokens=False)["input_ids"]]
    greedy = SamplingConfig.greedy_decoding(max_new_tokens, stop_at_eos=True, lean_decode=True)
    done = complete(policy, tokenizer, rows, greedy, batch_size=256)
    texts, ended = done["texts"], done["eos"]
    report = {
        "sft_win_rate_vs_reference": sum(map(oracle_judge, prompts, texts, references)) / len(prompts),
        "sft_ended_with_eos": float(ended.float().mean()),
        "sft_oracle_score": sum(map(oracle_score, prompts, texts)) / len(prompts),
        # the ceiling: the ideal summary of every prompt against its reference (ties with it count 0.5)
        "ideal_win_rate_vs_reference": sum(map(oracle_judge, prompts, map(ideal_summary, prompts), references))
        / len(prompts),
    }
    if reward_model is None:
        return report
    reward_model.eval()
    report["rm_heldout_accuracy"] = pair_accuracy(reward_model, tokenizer, heldout_pairs)
    refs = collate_sft(tokenizer.pad_token_id)(encode_sft_examples(tokenizer, validation))
    score = lambda ids, mask: reward_scores(reward_model, ids, mask)  # noqa: E731
    rm_sft = chunked(score, 256, done["input_ids"], done["attention_mask"])
    rm_ref = chunked(
        score,
        256,
        torch.cat([refs["prompt_ids"], refs["completion_ids"]], 1),
        torch.cat([refs["prompt_mask"], refs["completion_mask"]], 1),
    )
    oracle_sft, oracle_ref = (
        torch.tensor([oracle_score(p, c) for p, c in zip(prompts, cs)]) for cs in (texts, references)
    )
    rm, oracle = torch.cat([rm_sft, rm_ref]), torch.cat([oracle_sft, oracle_ref]).to(rm_sft.dtype)
    report["rm_oracle_pearson"] = _pearson(rm, oracle)
    report["rm_oracle_spearman"] = _pearson(_ranks(rm), _ranks(oracle))
    # within a prompt, as the judge compares: does the RM pick the oracle's winner of (greedy SFT, reference)?
    decided = (oracle_sft - oracle_ref).abs() > 1e-9
    agree = (rm_sft > rm_ref) == (oracle_sft > oracle_ref)
    report["rm_agrees_with_oracle_sft_vs_reference"] = float(agree[decided].float().mean()) if decided.any() else None
    return report
