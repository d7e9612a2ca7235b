"""python -m rloo.train: compose the config with Hydra, then one run (rloo.run.pipeline): build the pieces, fit, write
the run summary.

python -m rloo.train                                   # the embedded task, offline, CPU, minutes
python -m rloo.train model=pythia6.9b precision=bf16   # the published TL;DR recipe
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from rloo.run.cli import exit_on_config_error, fail, run_entry_point
from rloo.run.pipeline import print_summary, run  # noqa: F401 (print_summary: the summary lines, as before)
from rloo.utils.errors import (
    ConfigError,
    EnvironmentFailed,
    JudgeFailed,
    NoLearningSignal,
    NonFiniteError,
    ProducerFailed,
    RankLost,
    RewardFunctionError,
    RunIncomplete,
    WriteError,
)


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def hydra_main(cfg: DictConfig) -> float | None:
    """One run; returns what a sweeper ranks: the final win rate when a judge is set (None when it has none); with
    judge=none, the first reward function's held-out mean (eval/reward/<name>), else the reward model's score.
    Never one in place of the other."""
    from rloo.run.loggers import end_wandb_run

    try:
        summary = run(cfg)
    except BaseException as error:
        end_wandb_run(failed=True)  # before the error line: a sweep's next job starts its own W&B run
        if isinstance(error, ConfigError):
            return exit_on_config_error(error)
        stops = (
            WriteError,
            NonFiniteError,
            NoLearningSignal,
            RewardFunctionError,
            EnvironmentFailed,
            JudgeFailed,
            RunIncomplete,
            RankLost,
            ProducerFailed,
        )
        if isinstance(error, stops):
            return fail(error, 1)
        raise
    end_wandb_run(failed=False)
    return objective(summary)


def objective(summary: dict) -> float | None:
    """What a sweeper ranks a finished run by (see hydra_main)."""
    final = summary.get("final") or {}
    if summary["judge"] is not None:
        return final.get("eval/win_rate")
    rewards = [k for k in final if k.startswith("eval/reward/") and not k.endswith(("_ci_low", "_ci_high"))]
    return final.get(rewards[0]) if rewards else final.get("eval/score")


if __name__ == "__main__":
    run_entry_point(hydra_main, "train", train=True)
