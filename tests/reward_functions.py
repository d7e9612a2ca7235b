"""Reward functions that misbehave on purpose, for tests/test_guards.py (reward=tests.reward_functions:<name>)."""

import math


def raises(prompts, completions):
    raise ValueError("this reward function always fails")


def wrong_count(prompts, completions):
    return [0.0] * (len(completions) - 1)


def nan_for_odd_rows(prompts, completions):
    return [math.nan if i % 2 else float(len(c.split())) for i, c in enumerate(completions)]


def not_numbers(prompts, completions):
    return ["high"] * len(completions)


def length(prompts, completions):
    return [float(len(c.split())) for c in completions]


CALLS: list[dict] = []  # what answer_matches saw, for the test to compare with the data


def answer_matches(prompts, completions, answer):
    """1 where the completion contains the row's `answer` column, else 0: a correctness reward reading a column."""
    CALLS.append({"prompts": list(prompts), "answer": list(answer)})
    return [float(str(a) in c) for a, c in zip(answer, completions)]


def needs_a_missing_column(prompts, completions, solution):
    return [0.0] * len(completions)


def exits(prompts, completions):
    raise SystemExit(0)


def bools(prompts, completions):
    return [len(c) > 3 for c in completions]


def tensor_length(prompts, completions):
    import torch

    return torch.tensor([float(len(c.split())) for c in completions])


def hangs(prompts, completions):
    """Never returns: marks that it was entered (the file named by RLOO_TEST_HANG_MARK), then sleeps."""
    import os
    import time
    from pathlib import Path

    if os.environ.get("RLOO_TEST_HANG_MARK"):
        Path(os.environ["RLOO_TEST_HANG_MARK"]).touch()
    time.sleep(3600)


def constant(prompts, completions):
    return [1.0] * len(completions)


_faulty_calls = 0


def faulty_rank(prompts, completions):
    """0 for every completion (it adds nothing to the reward), except that the process whose LOCAL_RANK (0 where
    unset) is RLOO_TEST_FAULT_RANK, at its RLOO_TEST_FAULT_CALL-th call, does the fault RLOO_TEST_FAULT names:
    `kill` (SIGKILL to itself, as an OOM killer or a lost node would) or `hang` (creates RLOO_TEST_FAULT_FILE, then
    sleeps: a rank that hangs, or a step the test signals inside). Without RLOO_TEST_FAULT it is a plain 0."""
    import os
    import signal
    import time
    from pathlib import Path

    global _faulty_calls
    _faulty_calls += 1
    fault = os.environ.get("RLOO_TEST_FAULT")
    here = os.environ.get("LOCAL_RANK", "0") == os.environ.get("RLOO_TEST_FAULT_RANK", "0")
    if fault and here and _faulty_calls == int(os.environ.get("RLOO_TEST_FAULT_CALL", "2")):
        if fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        Path(os.environ["RLOO_TEST_FAULT_FILE"]).touch()
        time.sleep(600)
    return [0.0] * len(completions)


def reads_every_column(prompts, completions, **kwargs):
    """TRL's convention: every data column arrives by keyword."""
    return [float(len(kwargs)) for _ in completions]


_pause_calls = 0


def pauses(prompts, completions):
    """0 for every completion (it adds nothing to the reward), except that at its RLOO_TEST_PAUSE_CALL-th call each
    process touches `RLOO_TEST_PAUSE_FILE.<its rank>` and sleeps RLOO_TEST_PAUSE_S seconds: a point inside a rollout,
    on every rank, where a test sends a signal. Without RLOO_TEST_PAUSE_FILE it is a plain 0."""
    import os
    import time
    from pathlib import Path

    global _pause_calls
    _pause_calls += 1
    marker = os.environ.get("RLOO_TEST_PAUSE_FILE")
    if marker and _pause_calls == int(os.environ.get("RLOO_TEST_PAUSE_CALL", "2")):
        rank = os.environ.get("SLURM_PROCID") or os.environ.get("LOCAL_RANK") or "0"
        Path(f"{marker}.{rank}").touch()
        time.sleep(float(os.environ.get("RLOO_TEST_PAUSE_S", "3")))
    return [0.0] * len(completions)


def _lookup(row: dict) -> str:
    return row["solution"]  # a helper's KeyError: the frame the error line names


def key_error_in_a_helper(prompts, completions):
    return [float(_lookup({})) for _ in completions]


SEEN: list[dict] = []  # what trl_arguments saw


def trl_arguments(prompts, completions, completion_ids, trainer_state, log_metric, log_extra, **kwargs):
    """Every argument TRL hands a reward function beyond the columns: logs a metric and a column, returns bools."""
    SEEN.append({"ids": completion_ids, "step": trainer_state.global_step, "epoch": trainer_state.epoch})
    log_metric("my/ids_per_completion", sum(len(ids) for ids in completion_ids) / len(completion_ids))
    log_extra("n_ids", [len(ids) for ids in completion_ids])
    return [len(ids) % 2 == 0 for ids in completion_ids]


async def async_length(completions, **kwargs):
    import asyncio

    await asyncio.sleep(0)
    return [float(len(c.split())) for c in completions]


def logs_kl(completions, log_metric, **kwargs):
    log_metric("objective/kl", 1.0)
    return [0.0] * len(completions)


CALLS_SEEN = {"n": 0}


def fails_on_the_third_call(prompts, completions):
    """Scores two rollouts (no initial evaluation), then raises: a run that fails part-way."""
    CALLS_SEEN["n"] += 1
    if CALLS_SEEN["n"] >= 3:
        raise RuntimeError("the grader went away")
    return [float(len(c.split())) for c in completions]


PRODUCER_CALLS = [0]  # calls made in this process


def in_the_producer_from_the_fourth_call() -> bool:
    """In the producer process (rloo.service.producer), from its fourth rollout on; never in the learner."""
    import multiprocessing

    if multiprocessing.current_process().name != "rloo-producer":
        return False
    PRODUCER_CALLS[0] += 1
    return PRODUCER_CALLS[0] >= 4


def fails_in_the_producer_raise(prompts, completions):
    if in_the_producer_from_the_fourth_call():
        raise ValueError("this reward function fails in the producer")
    return length(prompts, completions)


def fails_in_the_producer_exit(prompts, completions):
    if in_the_producer_from_the_fourth_call():
        import os

        os._exit(3)
    return length(prompts, completions)
