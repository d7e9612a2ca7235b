"""A researcher's reward functions as TRL runs them: its extra arguments (completion_ids, trainer_state, log_metric,
log_extra), async functions; a failure named at the user's own line, with the traceback kept in train.log; and
evaluation guarding the functions as training does."""

import asyncio
import csv
import inspect
import json

import pytest

from rloo.rewards.scoring import Reward, RewardTerm
from rloo.rewards.trl_arguments import TrainerState
from rloo.utils.errors import RewardFunctionError
from tests import reward_functions

FAST = {"debug": "fast", "logger": "csv", "judge": "none"}


def line_of(function, text: str) -> int:
    """The line number of the first line of `function`'s source that contains `text`."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_trls_extra_arguments_reach_a_reward_function_and_what_it_logs_is_kept():
    reward_functions.SEEN.clear()
    reward = Reward([RewardTerm(1.0, "tests.reward_functions:trl_arguments")], "raise")
    reward.trainer_state = TrainerState(global_step=6, epoch=0.5, max_steps=12)
    scores = reward(["p", "q", "r"], ["a b", "c", "d e f"], None, {}, completion_ids=[[5, 6], [7], [1, 2, 3, 4]])
    assert scores.tolist() == [1.0, 0.0, 1.0]  # bools, cast as TRL casts them: even id counts score 1
    assert reward_functions.SEEN == [{"ids": [[5, 6], [7], [1, 2, 3, 4]], "step": 6, "epoch": 0.5}]
    metrics, columns = reward.log.take()
    assert metrics == {"my/ids_per_completion": pytest.approx(7 / 3)} and columns == {"n_ids": [2, 1, 4]}
    assert reward.log.take() == ({}, {})  # taken once: the next rollout starts empty


def test_an_async_reward_function_is_awaited_with_or_without_a_running_event_loop():
    reward = Reward([RewardTerm(2.0, "tests.reward_functions:async_length")], "raise")
    assert reward(["p", "q"], ["one two", "three"], None, {}).tolist() == [4.0, 2.0]

    async def in_a_notebook():  # a loop already runs in this thread, as in Jupyter
        return reward(["p"], ["a b c"], None, {}).tolist()

    assert asyncio.run(in_a_notebook()) == [6.0]


def test_a_failure_names_the_users_own_line_and_keeps_its_cause():
    reward = Reward([RewardTerm(1.0, "tests.reward_functions:key_error_in_a_helper")], "raise")
    with pytest.raises(RewardFunctionError) as caught:
        reward(["p"], ["x"], None, {})
    where = line_of(reward_functions._lookup, 'row["solution"]')
    assert str(caught.value) == (
        "reward function tests.reward_functions:key_error_in_a_helper raised at "
        f"tests/reward_functions.py:{where} in _lookup: KeyError: 'solution'"
    )
    assert isinstance(caught.value.__cause__, KeyError)  # the traceback train.log keeps reaches the helper


def test_log_metric_with_a_value_that_is_no_number_is_the_users_line():
    def logs_text(completions, log_metric, **kwargs):
        log_metric("acc", "high")
        return [0.0] * len(completions)

    reward = Reward([], "raise")
    reward.functions = {"mine:logs_text": logs_text}
    reward.terms = [RewardTerm(1.0, "mine:logs_text")]
    with pytest.raises(RewardFunctionError) as caught:
        reward(["p"], ["x"], None, {})
    where = line_of(logs_text, 'log_metric("acc"')
    assert str(caught.value) == (
        f"reward function mine:logs_text raised at tests/test_reward_conventions.py:{where} in logs_text: "
        "RewardFunctionError: log_metric('acc', 'high'): the value is not a finite number"
    )


def test_a_run_hands_trls_arguments_and_records_what_the_functions_log(embedded_task, tmp_path, monkeypatch):
    import rloo

    monkeypatch.setenv("RLOO_CACHE_DIR", str(embedded_task / "cache"))
    reward_functions.SEEN.clear()
    out = tmp_path / "run"
    functions = ["model", reward_functions.trl_arguments]
    summary = rloo.fit(FAST, reward=functions, output_dir=out)
    assert summary["status"] == "finished"
    # the initial evaluation, the three rollouts, the final evaluation: each call with where training stood
    assert [seen["step"] for seen in reward_functions.SEEN] == [0, 0, 1, 2, 3]
    training = reward_functions.SEEN[1:4]
    assert [seen["epoch"] for seen in training] == pytest.approx([0, 8 / 256, 16 / 256])  # 128 prompts, k=2
    rows = list(csv.DictReader((out / "csv" / "metrics.csv").open()))
    logged = [float(r["my/ids_per_completion"]) for r in rows if r.get("my/ids_per_completion")]
    assert len(logged) == 3 and all(1 <= v <= 8 for v in logged)  # response_length=8
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and all(isinstance(s["n_ids"], int) and 1 <= s["n_ids"] <= 8 for s in samples)


def test_a_metric_under_a_name_rloo_logs_is_refused(embedded_task, tmp_path, monkeypatch):
    import rloo

    monkeypatch.setenv("RLOO_CACHE_DIR", str(embedded_task / "cache"))
    with pytest.raises(RewardFunctionError, match=r"^log_metric\('objective/kl', \.\.\.\): rloo logs objective/kl"):
        rloo.fit(FAST | {"eval.before": "false"}, reward=["model", reward_functions.logs_kl], output_dir=tmp_path)


def test_a_failed_run_keeps_the_traceback_in_train_log(embedded_task, tmp_path, monkeypatch):
    import rloo

    monkeypatch.setenv("RLOO_CACHE_DIR", str(embedded_task / "cache"))
    out = tmp_path / "failed"
    with pytest.raises(RewardFunctionError) as caught:  # in the initial evaluation, before any rollout
        rloo.fit(FAST, reward=["model", reward_functions.key_error_in_a_helper], output_dir=out)
    where = line_of(reward_functions._lookup, 'row["solution"]')
    assert f"tests/reward_functions.py:{where} in _lookup: KeyError: 'solution'" in str(caught.value)
    log = (out / "train.log").read_text()
    assert "Traceback (most recent call last)" in log and f'reward_functions.py", line {where}, in _lookup' in log
    assert log.splitlines()[-1] == f"error: {caught.value}"
    assert json.loads((out / "summary.json").read_text())["error"] == str(caught.value)
    assert not (out / "checkpoints").exists() or not list((out / "checkpoints").glob("step*.ckpt"))


def test_evaluation_counts_a_masked_reward_failure_and_says_it(embedded_task, tmp_path, monkeypatch, capsys):
    import rloo

    monkeypatch.setenv("RLOO_CACHE_DIR", str(embedded_task / "cache"))
    settings = FAST | {"reward_errors": "mask", "total_episodes": "8"}
    summary = rloo.fit(settings, reward=["model", reward_functions.nan_for_odd_rows], output_dir=tmp_path / "run")
    rows = summary["initial"]
    assert rows["eval/reward/nan_for_odd_rows_failed"] == 4  # 8 held-out prompts, the odd rows nan
    log = (tmp_path / "run" / "train.log").read_text()
    assert (
        "eval (initial policy): reward/nan_for_odd_rows failed on 4 completions, left out of "
        "eval/reward/nan_for_odd_rows (reward_errors=mask): reward function "
        "tests.reward_functions:nan_for_odd_rows returned a value that is not finite in float32 for 4 of 8" in log
    )
