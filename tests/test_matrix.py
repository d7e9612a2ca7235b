"""Every precision of conf/precision with every algorithm of conf/algo, on-policy and on the published 2 x 2
schedule: one rollout of the real run (rloo.run.pipeline.run, in-process) on tiny saved models, with finite metrics."""

import csv
import itertools
import math

import pytest

from rloo.run.cli import compose_train_config, group_options
from tests.e2e import one_rollout

SCHEDULES = {"on_policy": ["num_ppo_epochs=1", "num_mini_batches=1"], "2x2": ["num_ppo_epochs=2", "num_mini_batches=2"]}
ALGOS = group_options("algo")
PRECISIONS = group_options("precision")
MATRIX = list(itertools.product(PRECISIONS, ALGOS, SCHEDULES))


def run_one_rollout(assets, tmp_path, precision: str, algo: str, schedule: str) -> dict:
    # a rollout of whole groups of 2 whatever the algorithm's own k
    k = ["k=2"] if algo in ("reinforce", "vanilla_pg", "ppo") else []
    return one_rollout(assets, tmp_path / "run", f"precision={precision}", f"algo={algo}", *k, *SCHEDULES[schedule])


# what each algorithm logs beyond the shared metrics
OWN_METRICS = {"dpo": ("dpo/accuracy", "dpo/margin", "dpo/decided_frac"), "ppo": ("loss/value_avg", "value/mse")}


def check(summary: dict, tmp_path, algo: str, schedule: str) -> None:
    assert summary["status"] == "finished" and summary["rollouts"] == 1
    assert summary["algorithm"] == compose_train_config([f"algo={algo}"]).algorithm
    assert summary["optimizer_steps"] == (4 if schedule == "2x2" else 1)
    with open(tmp_path / "run" / "csv" / "metrics.csv") as f:
        row = next(r for r in csv.DictReader(f) if r.get("objective/scores"))
    for name in ("objective/scores", "loss/policy_avg", *OWN_METRICS.get(algo, ())):
        assert math.isfinite(float(row[name])), (name, row[name])


@pytest.mark.parametrize("precision, algo, schedule", MATRIX)
def test_each_precision_algorithm_and_schedule_runs_a_step(tiny_run_assets, tmp_path, precision, algo, schedule):
    check(run_one_rollout(tiny_run_assets, tmp_path, precision, algo, schedule), tmp_path, algo, schedule)
