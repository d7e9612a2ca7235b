"""What a bad reward, a failing judge, bad data or a broken cache do to a run: a one-line error and a non-zero
exit, or a guarded skip that is counted; never a non-finite policy or a success with another metric."""

import csv
import inspect
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from rloo.objectives import leave_one_out_advantages, masked_leave_one_out_advantages
from rloo.rewards.scoring import (
    MODEL,
    Interrupted,
    Reward,
    RewardTerm,
    call_reward_function,
    load_function,
    parse_reward,
)
from rloo.utils.errors import ConfigError
from tests import reward_functions
from tests.e2e import FAST, HANG_GUARD_S, ROOT, train, train_error


def last_line(result):
    return result.stderr.strip().splitlines()[-1]


def metric_column(run_dir, name):
    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        return [float(r[name]) for r in csv.DictReader(f) if r.get(name)]


# ---- the math of masking -------------------------------------------------------------------------------------
def test_masked_leave_one_out_by_hand():
    rewards = torch.tensor([1.0, 2.0, 6.0, 100.0, 3.0, 5.0, 0.0, 0.0])
    valid = torch.tensor([True, True, True, False, True, False, False, False])
    advantages = masked_leave_one_out_advantages(rewards, 4, valid)
    # group 1: valid 1, 2, 6 -> A = 1 - 4, 2 - 3.5, 6 - 1.5; the invalid one 0. group 2: one valid -> all 0
    assert advantages.tolist() == [-3.0, -1.5, 4.5, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_masked_leave_one_out_equals_the_plain_one_when_all_are_valid():
    rewards = torch.randn(12, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(
        masked_leave_one_out_advantages(rewards, 3, torch.ones(12, dtype=torch.bool)),
        leave_one_out_advantages(rewards, 3),
    )


# ---- reward= parsing and reward functions ------------------------------------------------------------------
def test_reward_expressions_parse_into_weighted_terms():
    assert parse_reward("model") == [RewardTerm(1.0, MODEL)]
    assert parse_reward("model + 0.5*rloo.toy.rule_rewards:topic_recall") == [
        RewardTerm(1.0, MODEL),
        RewardTerm(0.5, "rloo.toy.rule_rewards:topic_recall"),
    ]
    assert parse_reward("-2e-1 * a.b:c") == [RewardTerm(-0.2, "a.b:c")]
    for bad in ("", "modle", "model + model", "0.5*", "a.b:c:d"):
        with pytest.raises(ConfigError, match="reward="):
            parse_reward(bad)
    for weight in ("-1e309", "1e39"):  # inf as a float, and past float32's range
        with pytest.raises(ConfigError, match=rf"the weight {weight} of m:f is not finite in float32"):
            parse_reward(f"model + {weight}*m:f")


def where(function, text: str) -> str:
    """`tests/reward_functions.py:<line> in <name>`: the line of `function` that holds `text`, as a failure names it."""
    lines, first = inspect.getsourcelines(function)
    line = first + next(i for i, source in enumerate(lines) if text in source)
    return f"tests/reward_functions.py:{line} in {function.__name__}"


RAISES = where(reward_functions.raises, "raise ValueError")
EXITS = where(reward_functions.exits, "SystemExit")


@pytest.mark.parametrize(
    "function, message",
    [
        (reward_functions.raises, f"raised at {RAISES}: ValueError: this reward function always fails"),
        (reward_functions.wrong_count, "returned 2 values for 3 completions"),
        (
            reward_functions.nan_for_odd_rows,
            "returned a value that is not finite in float32 for 1 of 3 completions (first: nan at 1)",
        ),
        (lambda completions, **kw: np.mean([1.0, 2.0]), "returned a 0-d float64 ("),
        (lambda completions, **kw: np.array(1.5), "returned a 0-d ndarray (array(1.5)), not one number per"),
        (lambda completions, **kw: torch.tensor(0.5), "returned a 0-d Tensor (tensor(0.5000)), not one number per"),
        (lambda completions, **kw: [10**400, 1, 2], "returned a value that is not finite in float32 for 1 of 3"),
        (
            lambda completions, **kw: [1.0, 1e39, 2],
            "returned a value that is not finite in float32 for 1 of 3 completions (first: 1e+39 at 1)",
        ),
        (lambda completions, **kw: {"a": 1}, "returned dict ({'a': 1}), not one number per completion"),
        (
            reward_functions.not_numbers,
            "returned str values ('high'), not numbers (a string is not a score: return float(...), "
            "or None where it does not apply)",
        ),
        (reward_functions.exits, f"raised at {EXITS}: SystemExit: 0"),
    ],
)
def test_a_misbehaving_function_is_named_with_what_it_did(function, message):
    values, error = call_reward_function("tests.reward_functions:f", function, ["p"] * 3, ["a b", "c", "d e f"])
    assert error.startswith(f"reward function tests.reward_functions:f {message}"), error
    assert "\n" not in error
    assert values.shape == (3,)


def test_a_tensor_of_numbers_is_a_valid_result():
    values, error = call_reward_function("f", reward_functions.tensor_length, ["p"] * 2, ["a b", "c"])
    assert error is None and values.tolist() == [2.0, 1.0]
    mixed = lambda completions, **kw: [np.float32(0.5), torch.tensor(2.0), 3]  # noqa: E731 (0-d values are numbers)
    assert call_reward_function("f", mixed, ["p"] * 3, ["a", "b", "c"])[0].tolist() == [0.5, 2.0, 3.0]
    # bools count as 0 and 1, as TRL casts them: a list, NumPy's bools, a bool array or tensor
    completions = ["a b", "c", "d e f e"]
    assert call_reward_function("f", reward_functions.bools, ["p"] * 3, completions)[0].tolist() == [0.0, 0.0, 1.0]
    for form in (np.array, torch.tensor, lambda v: [np.bool_(x) for x in v]):
        values, error = call_reward_function(
            "f", lambda completions, **kw: form([True, False, True]), ["p"] * 3, completions
        )
        assert error is None and values.tolist() == [1.0, 0.0, 1.0]


def test_a_keyboard_interrupt_inside_a_function_still_stops_the_run():
    def interrupted(prompts, completions):
        raise KeyboardInterrupt

    for timeout_s in (0, 5):
        with pytest.raises(KeyboardInterrupt):
            call_reward_function("f", interrupted, ["p"], ["a"], timeout_s=timeout_s)


def test_a_hanging_function_fails_at_its_timeout_and_stops_waiting_on_sigterm():
    import time

    def slow(prompts, completions):
        time.sleep(300)

    # bounds on a hang, not on speed: far above any delay a loaded machine adds, far below the 300 s sleep
    started = time.monotonic()
    values, error = call_reward_function("tests.x:slow", slow, ["p"], ["a"], timeout_s=0.5)
    assert error == "reward function tests.x:slow raised TimeoutError: no result after 0.5 s (reward_timeout_s)"
    assert values.isnan().all() and time.monotonic() - started < 60
    stop_after = time.monotonic() + 0.3
    with pytest.raises(Interrupted):
        call_reward_function("f", slow, ["p"], ["a"], timeout_s=240, should_stop=lambda: time.monotonic() > stop_after)
    assert time.monotonic() - started < 120


def test_a_reward_module_that_fails_as_it_imports_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "broken_reward.py").write_text("raise RuntimeError('no grader binary on this machine')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        load_function("broken_reward:score")
    assert str(caught.value) == (  # the module's own line, its full path where it lies outside the working dir
        f"reward: importing 'broken_reward' for 'broken_reward:score' raised at {tmp_path / 'broken_reward.py'}:1 in "
        "<module>: RuntimeError: no grader binary on this machine"
    )


def test_a_weighted_sum_of_the_model_and_a_function_and_masking():
    reward = Reward([RewardTerm(1.0, MODEL), RewardTerm(0.5, "tests.reward_functions:length")], on_error="raise")
    total = reward(["p", "p"], ["a b", "c d e f"], model_scores=torch.tensor([1.0, -1.0]))
    assert total.tolist() == [1.0 + 0.5 * 2, -1.0 + 0.5 * 4]
    masked = Reward([RewardTerm(1.0, "tests.reward_functions:nan_for_odd_rows")], on_error="mask")
    values = masked(["p"] * 4, ["a", "b c", "d", "e"], model_scores=None)
    assert values[0] == 1.0 and math.isnan(values[1]) and values[2] == 1.0 and math.isnan(values[3])
    assert masked.last_errors and "nan_for_odd_rows" in masked.last_errors[0]


# ---- runs ------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "function, settings, what",
    [
        ("raises", [], f"raised at {RAISES}: ValueError: this reward function always fails"),
        ("exits", [], f"raised at {EXITS}: SystemExit: 0"),  # SystemExit(0) inside a reward function is no success
        ("hangs", ["reward_timeout_s=1"], "raised TimeoutError: no result after 1 s (reward_timeout_s)"),
    ],
)
def test_a_reward_function_that_fails_stops_the_run_in_one_line(finished_run, function, settings, what):
    base, _ = finished_run
    reward = f"reward=tests.reward_functions:{function}"
    result = train(base / f"fn-{function}", base / "cache", reward, "eval.before=false", *settings)
    assert result.returncode == 1, result.stderr[-3000:]
    assert last_line(result) == f"error: reward function tests.reward_functions:{function} {what}"


@pytest.mark.slow
def test_masking_a_function_that_always_fails_stops_after_max_bad_steps(finished_run):
    base, _ = finished_run
    reward = "reward=tests.reward_functions:raises"
    result = train(base / "fn-mask-all", base / "cache", reward, "reward_errors=mask", "max_bad_steps=2")
    assert result.returncode == 1, result.stderr[-3000:]
    assert last_line(result).startswith("error: 2 rollouts in a row (max_bad_steps=2) had non-finite scores")


@pytest.mark.slow
def test_sigterm_while_a_reward_function_hangs_ends_the_run_within_seconds(finished_run, monkeypatch):
    import signal
    import time

    from tests.test_interrupt import finish, start, wait_for

    base, _ = finished_run
    run, mark = base / "fn-hang-sigterm", base / "hang-entered"
    monkeypatch.setenv("RLOO_TEST_HANG_MARK", str(mark))
    process = start(
        run, base / "cache", "reward=tests.reward_functions:hangs", "eval.before=false", "reward_timeout_s=1800"
    )
    wait_for(mark.exists, process)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    returncode, output = finish(process)
    assert returncode == 128 + signal.SIGTERM, output[-3000:]
    assert time.monotonic() - sent < 600  # the reward timeout is 1800 s: it did not wait for it (a hang bound)
    assert json.loads((run / "summary.json").read_text())["status"] == "interrupted"


def test_a_reward_function_that_does_not_import_is_refused_before_loading(embedded_task):
    base = embedded_task
    error = train_error(base / "fn-missing", base / "cache", "reward=model + 0.5*tests.reward_functions:nope")
    assert error == "error: reward: tests.reward_functions has no function 'nope'"


@pytest.mark.slow
def test_masked_completions_leave_the_baseline_and_are_counted(finished_run):
    base, _ = finished_run
    run = base / "fn-masked"
    result = train(
        run,
        base / "cache",
        "reward=tests.reward_functions:nan_for_odd_rows",
        "reward_errors=mask",
        "logger=csv",
        "eval.before=false",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert metric_column(run, "reward/masked") == [4.0, 4.0, 4.0]  # half of each 8-completion rollout
    assert metric_column(run, "guard/skipped_steps") == [0.0, 0.0, 0.0]
    assert all(math.isfinite(v) for v in metric_column(run, "loss/policy_avg"))


@pytest.mark.slow
def test_a_rule_based_reward_on_the_embedded_task_trains(finished_run):
    base, _ = finished_run
    run = base / "rule-reward"
    result = train(
        run,
        base / "cache",
        "reward=rloo.toy.rule_rewards:topic_recall",
        "logger=csv",
        "total_episodes=960",
        "k=4",
        "rollout_batch_size=16",
        "micro_batch_size=16",
        "generation_batch_size=16",
        "lr=3e-3",
        "kl_coef=0.01",
        "eval.before=false",
        "eval.after=false",
        "sample_every=0",
        "checkpoint_every=0",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    recall = metric_column(run, "reward/topic_recall")
    assert len(recall) == 60
    first, last = sum(recall[:10]) / 10, sum(recall[-10:]) / 10
    assert last > first + 0.05, (first, last)  # about -0.42 -> -0.25 where it was written


@pytest.fixture(scope="module")
def nan_reward_model(finished_run):
    """The bootstrap's reward model with a nan score head: every score is nan."""
    from transformers import AutoModelForSequenceClassification

    base, _ = finished_run
    source = next((base / "cache").glob("toy-*/reward_model"))
    model = AutoModelForSequenceClassification.from_pretrained(source)
    with torch.no_grad():
        model.score.weight.fill_(float("nan"))
    model.save_pretrained(base / "nan-rm")
    return base / "nan-rm"


@pytest.mark.slow
def test_a_nan_reward_model_stops_the_run_after_max_bad_steps_without_saving_nan(finished_run, nan_reward_model):
    base, _ = finished_run
    run = base / "nan-stop"
    result = train(
        run,
        base / "cache",
        f"model.reward_model={nan_reward_model}",
        "max_bad_steps=2",
        "logger=csv",
        "eval.before=false",
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert last_line(result).startswith("error: 2 rollouts in a row (max_bad_steps=2) had non-finite scores")
    assert not (run / "policy").exists()
    saved = torch.load(run / "checkpoints" / "interrupted.ckpt", weights_only=True)["state_dict"]
    assert all(torch.isfinite(v).all() for v in saved.values())
    assert json.loads((run / "summary.json").read_text())["status"] == "failed"


@pytest.mark.slow
def test_a_reward_with_no_spread_stops_the_run_after_max_no_signal_steps(finished_run):
    """algo=dapo with a constant reward: every group is dropped, every round, and the rollout filled with them; each
    rollout is said and counted, and max_no_signal_steps in a row stop the run in one line, exit 1, with a whole
    checkpoint and a summary that says why."""
    base, _ = finished_run
    run = base / "no-signal"
    result = train(
        run,
        base / "cache",
        "algo=dapo",
        "reward=tests.reward_functions:constant",
        "max_no_signal_steps=2",
        "logger=csv",
        "eval.before=false",
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert last_line(result).startswith(
        "error: 2 rollouts in a row (max_no_signal_steps=2) had no prompt whose 2 completions differ in score"
    )
    assert "no learning signal in rollout 1: no prompt's 2 completions differ in score" in result.stderr + result.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["no_signal_rollouts"] == 2
    assert f"error: {summary['error']}" == last_line(result) == (run / "train.log").read_text().splitlines()[-1]
    assert (run / "checkpoints" / "interrupted.ckpt").is_file()


@pytest.mark.slow
def test_skipped_updates_are_counted_and_leave_the_weights_as_they_were(finished_run, nan_reward_model):
    base, _ = finished_run
    run = base / "nan-skip"
    result = train(
        run,
        base / "cache",
        f"model.reward_model={nan_reward_model}",
        "max_bad_steps=5",
        "logger=csv",
        "eval.before=false",
        "num_ppo_epochs=2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert metric_column(run, "guard/skipped_steps") == [2.0, 4.0, 6.0]  # both updates of each of 3 rollouts
    policy = load_file(run / "policy" / "model.safetensors")
    initial = load_file(next((base / "cache").glob("toy-*/policy/model.safetensors")))
    assert all(torch.equal(policy[k], initial[k]) for k in initial)


@pytest.mark.slow
def test_a_judge_outage_fails_the_run_and_reports_no_win_rate(finished_run, server):
    base, _ = finished_run
    url, state = server
    state.respond = lambda i, body, headers: (503, {}, json.dumps({"error": {"message": "overloaded"}}), 0.0)
    run = base / "judge-outage"
    result = train(
        run,
        base / "cache",
        "eval_every=0",
        "eval.before=false",
        "judge=openai",
        f"judge.base_url={url}",
        "judge.model=test",
        "judge.cache_dir=null",
        "judge.max_retries=0",
        "eval.num_prompts=4",
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "gave no verdict for 4 of 4 pairs" in last_line(result)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and "eval/win_rate" not in summary["final"]
    assert (run / "policy" / "config.json").exists()


@pytest.mark.slow
def test_a_bad_job_fails_alone_in_a_multirun(tmp_path, finished_run):
    base, _ = finished_run
    env = {**os.environ, "RLOO_CACHE_DIR": str(base / "cache"), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rloo.train",
            "--multirun",
            *FAST,
            "logger=csv",
            "eval.before=false",
            "eval.after=false",
            "k=2,3",
            f"hydra.sweep.dir={tmp_path}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert result.returncode != 0
    assert "error: rollout_batch_size=8 is not allowed: a multiple of k=3" in result.stderr
    good = [d for d in tmp_path.iterdir() if d.name.startswith("0_")]
    assert good and json.loads((good[0] / "summary.json").read_text())["status"] == "finished"


# ---- data and models, before anything loads ------------------------------------------------------------------
@pytest.mark.parametrize(
    "content, message",
    [
        ("", "is empty: no prompts"),
        ('{"prompt": "a"}\n{oops\n', "cannot be read as jsonl: line 2 is not JSON"),
        ('{"prompt": 3}\n', "data.train.prompt_column='prompt' at row 0 of"),
        (
            '{"prompt": "a", "prompt": "b"}\n',
            "cannot be read as jsonl: ArrowInvalid: JSON parse error: Column(/prompt) ",
        ),
        ('{"prompt": [{"role": "user", "content": 123}]}\n', "message 0's content is int '123': text, or a list"),
        ('{"text": "a"}\n', "data.train.prompt_column='prompt' is not a column of"),
        ('{"prompt": "' + "word " * 200 + '"}\n', "data.max_prompt_length=64 drops every prompt of data.train"),
    ],
)
def test_data_errors_are_one_line_before_any_model_loads(embedded_task, tmp_path, content, message):
    base = embedded_task
    path = tmp_path / "train.jsonl"
    path.write_text(content)
    assert message in train_error(
        tmp_path / "run", base / "cache", f"data.train.path={path}", "data.train.reference_column=null"
    )


def test_undecodable_bytes_and_blank_prompts_are_one_line_before_any_model_loads(embedded_task, tmp_path):
    base, path = embedded_task, tmp_path / "train.jsonl"
    settings = (f"data.train.path={path}", "data.train.reference_column=null")
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n')
    error = train_error(tmp_path / "run", base / "cache", *settings)
    assert error == f"error: data.train.path={str(path)!r} is not UTF-8 text: line 2 has byte 0xe9 at column 16; " + (
        "save it as UTF-8"
    )
    path.write_text('{"prompt": ""}\n{"prompt": "  "}\n{"prompt": null}\n')
    error = train_error(tmp_path / "run2", base / "cache", *settings)
    assert error.startswith(f"error: data.train: every prompt of {path} is empty (3 rows of blank 'prompt')")


@pytest.mark.slow
def test_blank_prompts_are_dropped_and_counted_in_the_log_and_summary(finished_run, tmp_path):
    base, _ = finished_run
    toy = next((base / "cache").glob("toy-*/data/train.jsonl"))
    rows = toy.read_text().splitlines()[:32] + ['{"prompt": "", "reference": " x"}', '{"prompt": "  \\n"}'] * 2
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(rows) + "\n")
    run = tmp_path / "run"
    result = train(run, base / "cache", f"data.train.path={path}", "data.train.reference_column=null", "logger=csv")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "data: train: 32 prompts from" in result.stderr + result.stdout
    assert "4 empty dropped" in result.stderr + result.stdout
    counts = json.loads((run / "summary.json").read_text())["data"]["train"]
    assert counts["prompts"] == 32 and counts["empty_dropped"] == 4


def test_a_causal_lm_given_as_reward_model_is_refused_before_loading(embedded_task):
    base = embedded_task
    policy = next((base / "cache").glob("toy-*/policy"))
    assert "is a GPTNeoXForCausalLM, not a sequence classifier" in train_error(
        base / "wrong-rm", base / "cache", f"model.reward_model={policy}"
    )


def test_a_corrupted_cache_artifact_is_detected_and_rebuilt(tmp_path):
    from rloo.run.cli import compose_train_config
    from rloo.toy.bootstrap import damage, ensure_artifacts

    cfg = compose_train_config(["bootstrap=fast"]).bootstrap
    artifacts = ensure_artifacts(cfg, tmp_path, log=lambda line: None)
    assert damage(artifacts.root) is None
    weights = artifacts.root / "policy" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    train_split = artifacts.root / "data" / "train.jsonl"
    train_split.write_text(train_split.read_text().splitlines()[0] + "\n")  # shortened to one prompt
    assert "corrupt" in damage(artifacts.root)
    said = []
    rebuilt = ensure_artifacts(cfg, tmp_path, log=said.append)
    assert any("corrupt (its sha256 changed): building it again" in line for line in said)
    assert damage(rebuilt.root) is None and len(train_split.read_text().splitlines()) > 1


def test_ranks_that_hold_different_weights_stop_the_run(monkeypatch):
    """RanksAgree against a stand-in for a 2-rank gather whose second rank drifted by one ulp in one tensor."""
    from types import SimpleNamespace

    from rloo.run import callbacks
    from rloo.run.callbacks import RanksAgree

    policy = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 2))

    def gather(drift):
        def all_gather(sums):
            other = sums.clone()
            other[2] = torch.nextafter(other[2], torch.tensor(float("inf"), dtype=other.dtype)) if drift else other[2]
            return torch.stack([sums, other])

        return all_gather

    module = SimpleNamespace(policy=policy, state=SimpleNamespace(rollouts=7))
    for drift in (False, True):
        monkeypatch.setattr(callbacks, "gather_ranks", gather(drift))
        trainer = SimpleNamespace(world_size=2)
        if not drift:
            RanksAgree().on_train_batch_end(trainer, module, None, None, 0)
            continue
        with pytest.raises(RuntimeError, match=r"after rollout 7 \(1 tensors, e.g. 1.weight\)"):
            RanksAgree().on_train_batch_end(trainer, module, None, None, 0)
