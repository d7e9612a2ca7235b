"""The arguments TRL hands its reward functions beyond the data's columns, handed the same way here: a function gets
each one it names, or all of them where it takes **kwargs (TRL's `def reward(completions, **kwargs)`).

- `completion_ids`: each completion's token ids (a list of ints; an episode's: every token after the prompt);
- `trainer_state`: a TrainerState, the fields TRL's reward functions read of transformers' TrainerState
  (`global_step`, `epoch`, `max_steps`), for rewards shaped by training progress;
- `log_metric(name, value)`: a scalar, averaged over the calls of one rollout and logged under `name` beside rloo's
  own metrics (a name rloo logs itself is refused in one line);
- `log_extra(column, values)`: one value per completion, a column added to the rollout's samples (samples.jsonl and
  the W&B samples table).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from rloo.utils.errors import RewardFunctionError
from rloo.utils.numbers import finite_float, is_number, shown

ARGUMENTS = ("completion_ids", "trainer_state", "log_metric", "log_extra")


@dataclass(frozen=True)
class TrainerState:
    """Where training stands, as TRL's reward functions read it of transformers' TrainerState."""

    global_step: int  # optimiser steps taken (Lightning's global_step)
    epoch: float  # passes over the training prompts so far, fractional
    max_steps: int  # optimiser steps the run takes
    rollouts: int = 0  # rollouts trained on (rloo's unit: one batch of the train loop)
    episodes: int = 0  # completions trained on


class RewardLog:
    """What reward functions logged through `log_metric` and `log_extra` since the last `take`."""

    def __init__(self):
        self.metrics: dict[str, list[float]] = {}
        self.columns: dict[str, list] = {}

    def log_metric(self, name: str, value) -> None:
        """A scalar under `name` (TRL's `log_metric`); averaged over the calls of one rollout."""
        if not isinstance(name, str) or not name:
            raise RewardFunctionError(f"log_metric: the name {shown(name)} is not a non-empty string")
        if not is_number(value) or finite_float(value) is None:
            raise RewardFunctionError(f"log_metric({name!r}, {shown(value)}): the value is not a finite number")
        self.metrics.setdefault(name, []).append(float(value))

    def log_extra(self, column: str, values) -> None:
        """A column of the rollout's samples, one value per completion (TRL's `log_extra`)."""
        if not isinstance(column, str) or not column:
            raise RewardFunctionError(f"log_extra: the column name {shown(column)} is not a non-empty string")
        if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
            raise RewardFunctionError(f"log_extra({column!r}, ...): the values are {type(values).__name__}, not a list")
        self.columns.setdefault(column, []).extend(values.tolist() if hasattr(values, "tolist") else list(values))

    def take(self) -> tuple[dict[str, float], dict[str, list]]:
        """The metrics' means and the columns logged since the last take; the log empties."""
        metrics = {name: statistics.fmean(values) for name, values in self.metrics.items()}
        columns, self.metrics, self.columns = self.columns, {}, {}
        return metrics, columns


def trl_arguments(log: RewardLog, state: TrainerState | None, completion_ids: list[list[int]] | None) -> dict:
    """The TRL arguments a call of the reward functions offers (rloo.rewards.scoring.columns_asked_for picks a
    function's)."""
    offered = {"log_metric": log.log_metric, "log_extra": log.log_extra, "trainer_state": state}
    return offered | ({} if completion_ids is None else {"completion_ids": completion_ids})
