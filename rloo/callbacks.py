"""Lightning callbacks: held-out evaluation before/after training, and a table of sample completions."""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path
from typing import Callable

import torch
from lightning import Callback

from rloo.data import left_pad
from rloo.rollout import SamplingConfig, chunked, reward_scores, sample_completions

Judge = Callable[[str, str, str], float]  # (prompt, completion_a, completion_b) -> 1 a wins, 0.5 tie, 0 b wins


@torch.no_grad()
def evaluate_policy(policy, reward_model, tokenizer, rows: list[dict], sampling: SamplingConfig, batch_size: int,
                    judge: Judge | None = None, device: torch.device | str = "cpu") -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Generate for each held-out row, score with the reward model, judge against the reference.

    Returns per-row tensors (score, length, eos, verdict: nan without judge) and the judged samples.
    """
    ids, mask = left_pad([row["prompt_ids"] for row in rows], tokenizer.pad_token_id)
    ids, mask = ids.to(device), mask.to(device)
    completion_ids, completion_mask, ended = sample_completions(policy, ids, mask, sampling, tokenizer.eos_token_id,
                                                                tokenizer.pad_token_id, batch_size)
    input_ids, attention_mask = torch.cat([ids, completion_ids], 1), torch.cat([mask, completion_mask], 1)
    scores = chunked(partial(reward_scores, reward_model), batch_size, input_ids, attention_mask)
    completions = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    verdicts = [float("nan")] * len(rows)
    if judge is not None:
        verdicts = [judge(row["prompt"], text, row["reference"]) for row, text in zip(rows, completions)]
    per_row = {"score": scores.float(), "length": completion_mask.sum(1).float(), "eos": ended.float(),
               "verdict": torch.tensor(verdicts, device=scores.device)}
    samples = [{"prompt": row["prompt"], "reference": row["reference"], "completion": text,
                "score": float(score), "verdict": verdict}
               for row, text, score, verdict in zip(rows, completions, scores.tolist(), verdicts)]
    return per_row, samples


def summarize_eval(per_row: dict[str, torch.Tensor]) -> dict[str, float]:
    """Means over rows; win rate counts a tie as half (only when a judge ran)."""
    summary = {"eval/score": per_row["score"].mean().item(), "eval/mean_length": per_row["length"].mean().item(),
               "eval/eos_frac": per_row["eos"].mean().item()}
    verdicts = per_row["verdict"]
    if not torch.isnan(verdicts).all():
        summary["eval/win_rate"] = verdicts.mean().item()
    return summary


class HeldOutEval(Callback):
    """Evaluates the policy on fixed held-out prompts at the start and end of training (greedy by default)."""

    def __init__(self, rows: list[dict], sampling: SamplingConfig, batch_size: int, judge: Judge | None,
                 before: bool = True, after: bool = True, log=print):
        self.rows, self.sampling, self.batch_size, self.judge = rows, sampling, batch_size, judge
        self.before, self.after, self.log_fn = before, after, log
        self.initial: dict[str, float] | None = None
        self.final: dict[str, float] | None = None
        self.final_samples: list[dict] = []

    def run(self, trainer, module) -> tuple[dict[str, float], list[dict]]:
        started = time.perf_counter()
        rank, world = trainer.global_rank, trainer.world_size
        shard = self.rows[rank::world]
        with trainer.precision_plugin.forward_context():
            per_row, samples = evaluate_policy(module.policy, module.reward_model, module.tokenizer, shard,
                                               self.sampling, self.batch_size, self.judge, module.device)
        if world > 1:  # shards differ by at most one row: pad with nan, gather, drop the nans
            size = -(-len(self.rows) // world)
            per_row = {k: torch.nn.functional.pad(v, (0, size - len(v)), value=float("nan")) for k, v in per_row.items()}
            gathered = {k: trainer.strategy.all_gather(v).flatten() for k, v in per_row.items()}
            keep = ~torch.isnan(gathered["score"])
            per_row = {k: v[keep] for k, v in gathered.items()}
        summary = summarize_eval(per_row)
        summary["eval/seconds"] = time.perf_counter() - started
        return summary, samples

    def _report(self, trainer, label: str, summary: dict[str, float]) -> None:
        for logger in trainer.loggers:
            logger.log_metrics({k: v for k, v in summary.items() if k != "eval/seconds"}, step=trainer.global_step)
        shown = ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in summary.items() if k != "eval/seconds")
        if trainer.is_global_zero:
            self.log_fn(f"eval ({label}, {len(self.rows)} held-out prompts): {shown}")

    def on_train_start(self, trainer, module) -> None:
        if self.before and self.initial is None:
            self.initial, _ = self.run(trainer, module)
            self._report(trainer, "initial policy", self.initial)

    def on_train_end(self, trainer, module) -> None:
        if self.after:
            self.final, self.final_samples = self.run(trainer, module)
            self._report(trainer, "final policy", self.final)
            for logger in trainer.loggers:
                if hasattr(logger, "log_table") and self.final_samples:
                    columns = list(self.final_samples[0])
                    logger.log_table("eval/samples", columns=columns,
                                     data=[[s[c] for c in columns] for s in self.final_samples[:64]])


class SampleTable(Callback):
    """Every `every` steps: a few rollout completions with score and advantage, to W&B and samples.jsonl."""

    def __init__(self, every: int, num_rows: int, path: Path):
        self.every, self.num_rows, self.path = every, num_rows, Path(path)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        rollout = module.last_rollout
        if self.every <= 0 or rollout is None or step % self.every != 0 or not trainer.is_global_zero:
            return
        tokenizer = module.tokenizer
        n = min(self.num_rows, rollout.scores.shape[0])
        prompts = tokenizer.batch_decode(rollout.prompt_ids[:n], skip_special_tokens=True)
        completions = tokenizer.batch_decode(rollout.completion_ids[:n], skip_special_tokens=True)
        rows = [[step, p, c, float(s), float(a)] for p, c, s, a in
                zip(prompts, completions, rollout.scores[:n].tolist(), rollout.advantages[:n].tolist())]
        columns = ["step", "prompt", "completion", "score", "advantage"]
        for logger in trainer.loggers:
            if hasattr(logger, "log_table"):
                logger.log_table("samples", columns=columns, data=rows, step=step)
        with self.path.open("a") as f:
            for row in rows:
                f.write(json.dumps(dict(zip(columns, row))) + "\n")
