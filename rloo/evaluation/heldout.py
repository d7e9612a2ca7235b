"""Held-out evaluation shared by the training callback and `python -m rloo.evaluate`: complete fixed prompts
(greedy by default), score them with the reward model, judge them pairwise against the references (or another
policy's completions), and summarise as a win rate with a 95% interval."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from rloo.data.padding import left_pad
from rloo.evaluation.intervals import PROPORTIONS, Z_95, proportion_interval, win_rate_summary
from rloo.evaluation.pass_at_k import majority_vote, pass_at_k
from rloo.generation.episodes import completion_token_ids, episode_returns, reward_completions
from rloo.generation.forward import reward_scores
from rloo.generation.rollout import PhaseTimer, chunked
from rloo.generation.settings import SamplingConfig
from rloo.judges import Judge, judge_pairs
from rloo.service.episodes import play_episodes

INVALID = -1.0  # outcome code of an invalid verdict in the per-row tensor (nan means: not judged)
# per-row values summarised alike
MEANS_WITH_INTERVALS = ("reward/", "pass@", "majority_vote", "accuracy", "replied", "truncated", "turns")
EPISODE_RECORD = {"turns": int, "replied": bool, "truncated": bool}  # an episode's fields in eval_samples.jsonl


@dataclass(frozen=True)
class VerifiableEval:
    """Evaluation for verifiable rewards (train.yaml's eval.samples_per_prompt and the keys below it): n samples per
    prompt at the rollout's settings, each correct where the reward functions' weighted sum reaches correct_at."""

    samples_per_prompt: int
    pass_k: tuple[int, ...]
    correct_at: float
    sampling: SamplingConfig  # the rollout's
    answer: Callable[[str], str | None] | None = None  # null: the completion, stripped


def reward_prompts(rows: list[dict]) -> list:
    """The prompts reward functions get for these rows, as in training: their chat messages where every row has
    them (TRL's conversational form), else the prompt texts."""
    if rows and all(row.get("messages") is not None for row in rows):
        return [row["messages"] for row in rows]
    return [row.get("prompt") for row in rows]


def sampled_correctness(
    policy,
    tokenizer,
    rows: list[dict],
    reward,
    verifiable: VerifiableEval,
    batch_size: int,
    device,
    columns: dict,
    environment=None,
) -> dict[str, torch.Tensor]:
    """pass@k (unbiased, Chen et al. 2021) for each k and majority-vote accuracy, one value per row, from n sampled
    completions of each row's prompt."""
    n = verifiable.samples_per_prompt
    repeated = [row for row in rows for _ in range(n)]
    done = complete(policy, tokenizer, repeated, verifiable.sampling, batch_size, device, environment)
    columns = {name: [value for value in values for _ in range(n)] for name, values in columns.items()}
    values = reward.function_values(
        done["prompts"], done["completions"], columns | done["environments"], done["completion_ids"]
    )
    values |= done["returns"]
    correct = reward.function_total(values) >= verifiable.correct_at
    correct = correct.reshape(len(rows), n).tolist()
    answer_of = verifiable.answer or (lambda text: text.strip())
    answers = [answer_of(text) for text in done["texts"]]
    out = {
        f"pass@{k}": torch.tensor([pass_at_k(n, sum(row), k) for row in correct], device=device)
        for k in verifiable.pass_k
    }
    out["majority_vote"] = torch.tensor(
        [float(majority_vote(answers[i * n : (i + 1) * n], correct[i])) for i in range(len(rows))], device=device
    )
    return out


@torch.no_grad()
def complete(
    policy,
    tokenizer,
    rows: list[dict],
    sampling: SamplingConfig,
    batch_size: int,
    device: torch.device | str = "cpu",
    environment=None,
) -> dict:
    """One episode of each row's prompt (rloo.generation.episodes: a plain completion, or with an `environment`
    (env=, an EnvironmentSpec), a multi-turn episode in it): texts (each whole text after the prompt), the reward
    functions' completions, the prompt/completion tensors in rollout layout, length (the model's tokens) and eos;
    with an environment also its return, turns, whether it replied, whether the episode was cut (truncated), its
    messages and info."""
    ids, mask = left_pad([row["prompt_ids"] for row in rows], tokenizer.pad_token_id)
    columns = [row.get("columns", {}) for row in rows]
    played = play_episodes(
        policy,
        tokenizer,
        environment,
        reward_prompts(rows),
        ids.to(device),
        mask.to(device),
        1,
        columns,
        sampling,
        batch_size,
        PhaseTimer(),
    )
    sampled, prompts, chat, environments = played.sampled, played.prompts, played.chat, played.environments
    texts = tokenizer.batch_decode(sampled.completion_ids, skip_special_tokens=True)
    done = {
        "texts": texts,
        "prompts": prompts,  # as the reward functions get them (with an environment's first observation)
        "completions": reward_completions(sampled, tokenizer, chat),
        "completion_ids": completion_token_ids(sampled),
        "input_ids": sampled.input_ids,
        "attention_mask": sampled.attention_mask,
        "length": sampled.completion_mask.sum(1).float(),
        "eos": sampled.ended.float(),
    }
    # what an environment adds (none for plain completions): each episode's return (the reward term env), its model
    # turns, whether the environment replied (a tool call) and whether max_turns or the budget cut it, its messages,
    # and the environment objects for reward functions that take `environments`
    episodes = sampled.episodes if environment is not None else []
    per_episode = {
        "turns": [float(e.turns) for e in episodes],
        "replied": [float(e.replied) for e in episodes],
        "truncated": [float(e.truncated) for e in episodes],
    }
    return done | {
        "returns": {"env": episode_returns(episodes)} if episodes else {},
        "episode": {key: torch.tensor(v, device=device) for key, v in per_episode.items() if episodes},
        "messages": [list(e.messages) for e in episodes],
        "environments": {"environments": [e.user_environment for e in environments]} if environments else {},
    }


@torch.no_grad()
def evaluate_policy(
    policy,
    tokenizer,
    rows: list[dict],
    sampling: SamplingConfig,
    batch_size: int,
    judge: Judge | None = None,
    reward_model=None,
    device: torch.device | str = "cpu",
    others: list[str] | None = None,
    reward=None,
    judge_timeout_s: float = 0,
    should_stop=None,
    verifiable: VerifiableEval | None = None,
    environment=None,
) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Complete, score and judge `rows`; the candidate is judged against `others` (default: the references).

    Returns per-row tensors (score: nan without a reward model; outcome: 1 / 0.5 / 0, -1 invalid, nan without a
    judge; length; eos; reward/<name> for each reward function of `reward`, a rloo.rewards.scoring.Reward, which gets
    the
    rows' columns as in training; with `verifiable`, accuracy of these completions and pass@k and majority_vote from
    sampled ones) and one record per row for the JSONL / W&B table. The judge runs under guard
    (rloo.judges.judge_pairs: `judge_timeout_s`, `should_stop` says SIGTERM came).
    """
    done = complete(policy, tokenizer, rows, sampling, batch_size, device, environment)
    n = len(rows)
    device = done["length"].device
    scores = None  # no reward model: no score
    if reward_model is not None:
        scores = chunked(partial(reward_scores, reward_model), batch_size, done["input_ids"], done["attention_mask"])
    prompts, references = [row["prompt"] for row in rows], [row["reference"] for row in rows]
    head_to_head = others is not None
    others = others if head_to_head else references
    verdicts = (
        judge_pairs(judge, prompts, done["texts"], others, judge_timeout_s, should_stop)
        if judge is not None
        else [None] * n
    )
    outcome = [float("nan") if v is None else INVALID if v.outcome is None else v.outcome for v in verdicts]
    per_row = {"length": done["length"], "eos": done["eos"], "outcome": torch.tensor(outcome, device=device)}
    per_row |= {} if scores is None else {"score": scores.float()}
    per_row |= done["episode"]  # an episode's turns, replied and truncated (none for plain completions)
    if reward is not None and (reward.functions or done["returns"]):
        columns = {name: [row["columns"][name] for row in rows] for name in rows[0].get("columns", {})}
        values = reward.function_values(
            done["prompts"], done["completions"], columns | done["environments"], done["completion_ids"]
        )
        values |= done["returns"]
        for name, value in values.items():
            per_row[f"reward/{name}"] = value.to(device)
        if verifiable is not None:
            per_row["accuracy"] = (reward.function_total(values) >= verifiable.correct_at).float().to(device)
            per_row.update(
                sampled_correctness(
                    policy, tokenizer, rows, reward, verifiable, batch_size, device, columns, environment
                )
            )
    available = list(rows[0].get("columns", {}))
    # the columns the reward functions read; an environment gets the whole row, so with one every column
    read = available if environment is not None else reward.columns_read(available) if reward is not None else []
    others = others if head_to_head else [None] * n
    samples = [sample_record(i, rows[i], done["texts"][i], verdicts[i], per_row, others[i], read) for i in range(n)]
    for record, messages in zip(samples, done.get("messages", [])):
        record["messages"] = messages  # an episode's turns with their roles: the model's and the environment's
    return per_row, samples


def strict_json(value):
    """A data value as strict JSON holds it: nan and inf as None, tuples as lists, anything JSON has no type for
    (a date, say) as its str."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return str(value)


def sample_record(i: int, row: dict, text: str, verdict, per_row: dict, opponent: str | None, read: list) -> dict:
    """Row i's record in eval_samples.jsonl: its prompt, reference (and opponent), completion, verdict, length and
    scores, and what explains them (the data columns `read`, an episode's turns)."""
    record = {
        "prompt": row["prompt"],
        "reference": row["reference"],
        **({"opponent": opponent} if opponent is not None else {}),
        "completion": text,
        "verdict": None if verdict is None else verdict.label,
        "outcome": None if verdict is None else verdict.outcome,
        "order": None if verdict is None else verdict.order,
        "judge_answer": None if verdict is None else (verdict.raw if verdict.error is None else verdict.error),
        "length": int(per_row["length"][i]),
        "score": finite_or_none(per_row["score"][i]) if "score" in per_row else None,  # the reward model's
        # each reward function's value by name (None: it returned None there, or failed)
        "rewards": {key[7:]: finite_or_none(v[i]) for key, v in per_row.items() if key.startswith("reward/")},
    }
    if "accuracy" in per_row:
        record["correct"] = bool(per_row["accuracy"][i])
    record |= {key: cast(per_row[key][i]) for key, cast in EPISODE_RECORD.items() if key in per_row}
    if read:  # the row's data columns the reward functions read (its answer, say): why it scored what it did
        record["columns"] = {name: strict_json(row["columns"][name]) for name in read}
    return record


def finite_or_none(value) -> float | None:
    """A value for a strict JSON record: a float, or None (JSON null) for nan or inf, which JSON has no word for."""
    value = float(value)
    return value if math.isfinite(value) else None


def summarize_eval(per_row: dict[str, torch.Tensor], prefix: str = "eval/") -> dict[str, float]:
    """Means over rows, and, where a judge ran, the win rate (ties half) with its 95% interval and the counts."""
    summary = {
        f"{prefix}mean_length": per_row["length"].mean().item(),
        f"{prefix}eos_frac": per_row["eos"].mean().item(),
    }
    for key in [k for k in per_row if k.startswith(MEANS_WITH_INTERVALS)]:  # mean and its 95% interval over rows
        values = per_row[key][torch.isfinite(per_row[key])].double()  # not a failure (nan) nor a None (-inf)
        if len(values):
            mean = values.mean().item()
            if key.startswith(PROPORTIONS):  # in [0, 1] at any n: Wilson's
                low, high = proportion_interval(mean, len(values))
            else:  # a reward function's values, any range: the normal interval of their mean
                half = Z_95 * values.std().item() / math.sqrt(len(values)) if len(values) > 1 else float("nan")
                low, high = mean - half, mean + half
            summary.update({f"{prefix}{key}": mean, f"{prefix}{key}_ci_low": low, f"{prefix}{key}_ci_high": high})
    for key in [k for k in per_row if k.startswith("reward/")]:  # a function that failed there (reward_errors=mask)
        if failed := int(torch.isnan(per_row[key]).sum()):
            summary[f"{prefix}{key}_failed"] = failed
    if "score" in per_row:  # the reward model's score: its mean over the rows it scored finitely, and how many
        scores = per_row["score"]
        finite = torch.isfinite(scores)
        if finite.any():
            summary[f"{prefix}score"] = scores[finite].mean().item()
        summary[f"{prefix}score_rows"] = int(finite.sum())
        if not finite.all():
            summary[f"{prefix}score_nonfinite"] = int((~finite).sum())
    outcome = per_row["outcome"]
    if not torch.isnan(outcome).all():
        judged = [None if o == INVALID else o for o in outcome[~torch.isnan(outcome)].tolist()]
        summary.update(
            {
                f"{prefix}{k}": v
                for k, v in win_rate_summary(judged).items()
                if not (isinstance(v, float) and math.isnan(v))
            }
        )
    return summary
