"""Hydra composition of every config, the published recipe, and one-line errors before any model loads."""

import itertools
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rloo.config.checks import ConfigError, check_strategy_installed, validate_train_config
from rloo.run.cli import CONF_DIR, compose_train_config, group_options, preflight
from tests.e2e import HANG_GUARD_S

ROOT = Path(__file__).resolve().parent.parent


def composed(*overrides):
    """As `python -m rloo.train` composes the command line (model=pythia1b selects its recipe)."""
    return compose_train_config(list(overrides))


def first_error(*argv) -> str:
    """The one-line error `python -m rloo.train *argv` stops with before any model loads (in-process: what the
    entry point checks of the command line, then of the composed config)."""
    with pytest.raises(ConfigError) as caught:
        cfg = compose_train_config(preflight(list(argv)))
        validate_train_config(cfg)
        check_strategy_installed(cfg)
    return str(caught.value)


@pytest.mark.parametrize("model", group_options("model"))
@pytest.mark.parametrize("precision", group_options("precision"))
def test_every_model_and_precision_composes_and_validates(model, precision, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # the real recipe judges with the OpenAI API
    cfg = composed(f"model={model}", f"precision={precision}")
    assert cfg.model.name == model and cfg.precision.name == precision
    validate_train_config(cfg)  # the shipped configs are valid as they are


@pytest.mark.parametrize("size", ["1b", "6.9b"])
def test_pythia_recipe_loads_the_published_models_and_data(size):
    """The hyperparameters, release by release: tests/test_recipes.py."""
    cfg = composed(f"model=pythia{size}")
    assert cfg.model.policy == f"cleanrl/EleutherAI_pythia-{size}-deduped__sft__tldr"
    assert cfg.model.reward_model == f"cleanrl/EleutherAI_pythia-{size}-deduped__reward__tldr"
    assert cfg.model.tokenizer == "EleutherAI/pythia-1b-deduped" and cfg.model.pad_token == "[PAD]"
    assert cfg.data.name == "tldr" and cfg.data.train.path == "trl-internal-testing/tldr-preference-sft-trl-style"
    assert cfg.data.validation.path == "trl-lib/tldr" and cfg.data.max_prompt_length == 512
    assert cfg.precision.trainer == "bf16-mixed" and cfg.trainer.accelerator == "gpu" and cfg.trainer.devices == 8
    assert cfg.trainer.strategy == ("deepspeed_stage_2" if size == "1b" else "deepspeed_stage_3")
    assert cfg.bootstrap is None


@pytest.mark.parametrize("size", ["1b", "6.9b"])
def test_a_deepspeed_recipe_hands_deepspeed_the_clipping_norm_and_the_micro_batch(size):
    """DeepSpeed keeps the gradients and clips inside its own step: max_grad_norm must reach its config (0 is off)."""
    from rloo.run.assemble import deepspeed_settings

    cfg = composed(f"model=pythia{size}")
    settings = deepspeed_settings(cfg)
    assert settings == {"gradient_clipping": cfg.max_grad_norm, "train_micro_batch_size_per_gpu": cfg.micro_batch_size}
    assert settings["gradient_clipping"] > 0
    assert deepspeed_settings(composed(f"model=pythia{size}", "max_grad_norm=null"))["gradient_clipping"] == 0.0


def test_command_line_beats_the_recipe():
    cfg = composed("model=pythia1b", "precision=fp32", "k=4", "lr=1e-6")
    assert cfg.precision.name == "fp32" and cfg.k == 4 and cfg.lr == 1e-6


def test_recipe_chat_template_renders_the_published_prompt(tokenizer):
    import copy

    cfg = composed("model=pythia1b")
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = cfg.model.chat_template
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "SUBREDDIT: r/x\n\nPOST: hi\n\nTL;DR:"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == "User: SUBREDDIT: r/x\n\nPOST: hi\n\nTL;DR:\n\nAssistant:"


def run_train(*args, timeout=HANG_GUARD_S):
    return subprocess.run(
        [sys.executable, "-m", "rloo.train", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_cfg_job_for_the_real_recipe_composes_without_downloading():
    result = run_train("model=pythia6.9b", "precision=bf16", "--cfg", "job")
    assert result.returncode == 0, result.stderr
    cfg = OmegaConf.create(result.stdout)
    assert cfg.model.policy.endswith("6.9b-deduped__sft__tldr") and cfg.precision.trainer == "bf16-mixed"


@pytest.mark.parametrize("size", ["1b", "6.9b"])
def test_a_model_on_the_command_line_runs_its_published_recipe(size):
    """model=pythia1b alone selects experiment=tldr_pythia1b; experiment=none keeps the model alone."""
    assert composed(f"model=pythia{size}", "precision=bf16") == composed(
        f"experiment=tldr_pythia{size}", "precision=bf16"
    )
    alone = composed(f"model=pythia{size}", "experiment=none")
    assert alone.model.name == f"pythia{size}" and alone.data.name == "toy" and alone.k == 4


def test_the_default_run_composes_the_embedded_task_with_rloo():
    cfg = composed()
    assert (cfg.algorithm, cfg.k, cfg.kl_coef, cfg.loss, cfg.clip_range, cfg.num_ppo_epochs) == (
        "rloo",
        4,
        0.05,
        "ppo_clip",
        0.2,
        1,
    )
    assert (cfg.model.name, cfg.data.name, cfg.precision.name, cfg.bootstrap.task.n_train) == (
        "tiny",
        "toy",
        "fp32",
        16384,
    )
    assert (cfg.rollout_batch_size, cfg.total_episodes, cfg.lr, cfg.response_length) == (64, 8192, 3e-4, 16)
    assert cfg.judge._target_.endswith("OracleJudge") and set(cfg.logger) == {"wandb", "csv"}


def test_a_recipe_has_the_last_word_over_an_algorithm():
    """experiment/ is composed after algo/: the recipe's schedule and k hold whatever algorithm runs it."""
    assert composed("experiment=bf16_mismatch", "algo=ppo").num_ppo_epochs == 2
    assert composed("experiment=tldr_pythia1b", "algo=raft").k == 2
    assert (
        composed("experiment=bf16_mismatch", "algo=ppo", "num_ppo_epochs=3").num_ppo_epochs == 3
    )  # the command line wins


def test_bootstrap_none_runs_without_the_embedded_task(tiny_run_assets):
    cfg = composed(
        "bootstrap=none",
        f"model.policy={tiny_run_assets / 'policy'}",
        f"model.reward_model={tiny_run_assets / 'reward_model'}",
        f"data.train.path={tiny_run_assets / 'train.jsonl'}",
        f"data.validation.path={tiny_run_assets / 'validation.jsonl'}",
    )
    assert cfg.get("bootstrap") is None
    validate_train_config(cfg)
    assert "model." in first_error("bootstrap=none")  # your own models and data, named


def test_a_model_dir_whose_weights_do_not_load_is_one_line(tiny_run_assets, tmp_path):
    import shutil

    from rloo.models.loading import load_policy, load_reward_model

    for name, load in (("policy", load_policy), ("reward_model", load_reward_model)):
        broken = tmp_path / name
        shutil.copytree(tiny_run_assets / name, broken)
        weights = broken / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])  # truncated, as by a kill without rloo.utils.atomic
        with pytest.raises(ConfigError) as caught:
            load(str(broken))
        assert str(caught.value).startswith(f"{broken} does not load as a model: SafetensorError: ")
        assert "\n" not in str(caught.value)


def test_a_total_that_whole_rollouts_do_not_reach_is_said_in_one_line():
    from rloo.config.checks import episodes_note, num_rollouts

    assert episodes_note(composed("total_episodes=1024", "rollout_batch_size=512"), 1) is None
    cfg = composed("total_episodes=1000000", "rollout_batch_size=512")
    assert num_rollouts(cfg, 1) == 1953
    assert episodes_note(cfg, 1) == (
        "total_episodes=1000000 is not a multiple of a rollout (512 completions): the run trains 1953 rollouts, "
        "999936 episodes"
    )
    assert "(1024 completions)" in episodes_note(cfg, 2)  # every device's rollout


def test_a_completion_beyond_the_policys_positions_is_refused_before_loading(tiny_run_assets):
    import json

    from rloo.config.checks import check_context

    policy = tiny_run_assets / "policy"
    positions = json.loads((policy / "config.json").read_text())["max_position_embeddings"]
    check_context(composed(f"response_length={positions - 8}"), str(policy), 8, "data.train (a.jsonl)")
    with pytest.raises(ConfigError) as caught:
        check_context(composed(f"response_length={positions - 7}"), str(policy), 8, "data.train (a.jsonl)")
    assert str(caught.value) == (
        f"response_length={positions - 7} after the longest prompt of data.train (a.jsonl) (8 tokens) needs "
        f"{positions + 1} positions; model.policy='{policy}' has {positions} (max_position_embeddings): "
        "lower response_length or data.max_prompt_length"
    )


@pytest.mark.parametrize("group", ["experiment", "debug", "bootstrap"])
def test_every_experiment_debug_and_bootstrap_option_composes_and_validates(group, monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    for option in group_options(group):
        if (group, option) == ("experiment", "own_model"):  # a template: refused until its keys are filled in
            with pytest.raises(
                ConfigError,
                match=r"^still null, give each: model.policy .*; data.train.path and data.validation.path .*; reward ",
            ):
                validate_train_config(composed("experiment=own_model"))
            (tmp_path / "a.jsonl").write_text('{"prompt": "2 + 2 =", "answer": "4"}\n')
            filled = [f"model.policy={tmp_path}", f"data.train.path={tmp_path / 'a.jsonl'}"]
            filled.append(f"data.validation.path={tmp_path / 'a.jsonl'}")
            filled.append("reward=tests.reward_functions:answer_matches")
            validate_train_config(composed("experiment=own_model", *filled))
            continue
        validate_train_config(composed(f"{group}={option}"))


def test_model_files_hold_models_and_recipes_hold_the_rest():
    for name in group_options("model"):
        keys = set(OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml"))
        assert keys == {
            "name",
            "policy",
            "reference",
            "reward_model",
            "tokenizer",
            "chat_template",
            "pad_token",
            "frozen_dtype",
            "lora",
        }, name


@pytest.mark.parametrize(
    "override, key, allowed",
    [
        ("k=1", "k=1", "integer >= 2"),
        ("rollout_batch_size=30", "rollout_batch_size=30", "multiple of k=4"),
        ("lr=-0.1", "lr=-0.1", "number in"),
        ("temperature=0", "temperature=0", "number in"),
        ("response_length=0", "response_length=0", "positive integer"),
        ("loss=dpo", "loss='dpo'", "ppo_clip, reinforce"),
        ("kl_estimator=k9", "kl_estimator='k9'", "k1, k2, k3"),
        ("model=gpt5", "model='gpt5'", "pythia1b, pythia6.9b, smollm2, tiny"),
        ("precision=fp8", "precision='fp8'", "bf16, bf16-true, fp16, fp32"),
        (
            "data.train.path=/nonexistent/prompts.jsonl",
            "data.train.path='/nonexistent/prompts.jsonl'",
            "does not exist",
        ),
        ("judge=gpt5", "judge='gpt5'", "hf, none, openai, oracle, reward_model"),
        ("eval_every=-1", "eval_every=-1", "integer >= 0"),
        (
            "algo=a2c",
            "algo='a2c'",
            "dapo, dpo, dr_grpo, grpo, gspo, ppo, raft, reinforce, reinforce_pp, reinforce_pp_baseline, rloo, "
            "rloo_k2, vanilla_pg",
        ),
        ("algo=raft k=1", "k=1", "integer >= 2 with advantage=best_of_k"),
        ("algo=reinforce baseline_decay=1.5", "baseline_decay=1.5", "number in"),
        (
            "experiment=tldr_gpt5",
            "experiment='tldr_gpt5'",
            "own_model, tldr_pythia1b, tldr_pythia1b_trl011, tldr_pythia1b_trl09",
        ),
        ("algo=ppo loss=reinforce", "loss", "does nothing with algo=ppo"),
        ("algo=ppo lam=1.5", "lam=1.5", "number in"),
        ("algo=ppo sequence_ratio=mean", "sequence_ratio", "does nothing with algo=ppo"),
        ("algo=dpo kl_coef=0.5", "kl_coef", "does nothing with algo=dpo"),
        ("algo=dpo loss=reinforce", "loss", "does nothing with algo=dpo"),
        ("algo=dpo is_correction=tis_token", "is_correction", "does nothing with algo=dpo"),
        ("algo=dpo old_logprobs=generation", "old_logprobs", "does nothing with algo=dpo"),
        ("algo=dpo sequence_ratio=mean", "sequence_ratio", "does nothing with algo=dpo"),
        ("algo=dpo clip_range=0.9", "clip_range", "does nothing with algo=dpo"),
        ("algo=rloo dpo_beta=0.2", "dpo_beta", "does nothing with algo=rloo"),
        ("algo=dpo experiment=bf16_mismatch", "old_logprobs", "does nothing with algo=dpo"),
        ("algo=dpo +kl_coef=0.5", "kl_coef", "does nothing with algo=dpo"),
        ("klcoef=0.1", "klcoef", "not a config key"),
        ("model.policyy=x", "model.policyy", "not a config key"),
        ("bootstrap=huge", "bootstrap='huge'", "fast, hard, toy, none"),
        ("eval.greedy=3", "eval.greedy=3", "true or false"),
        ("sampler=gumbel", "sampler='gumbel'", "inverse_cdf, multinomial"),
        ("trainer.strategy=fsdp", "trainer.strategy=fsdp", "needs GPUs"),
        ("trainer=gpu trainer.strategy=fsdp", "lean_decode=true", "trainer.strategy=fsdp2"),
        ("trainer.strategy=deepspeed_stage_3_offload", "trainer.strategy=deepspeed_stage_3_offload", "needs GPUs"),
        ("trainer.strategy=fsdp2 model.lora=true", "model.lora=true", "trainer.strategy=ddp"),
        ("model.lora=yes", "model.lora='yes'", "true or false"),
        ("model.lora=true lora.r=0", "lora.r=0", "positive integer"),
        ("algo=ppo value_model=/nonexistent/vm", "value_model='/nonexistent/vm'", "does not exist"),
        ("judge=hf", "judge.path", "required"),
        (
            "judge=openai judge.base_url=http://127.0.0.1:9/v1 judge.max_retries=-1",
            "judge.max_retries=-1",
            "integer >= 0",
        ),
    ],
)
def test_bad_values_fail_fast_with_one_line_naming_the_key(override, key, allowed):
    error = first_error(*override.split())
    assert "\n" not in error and key in error and allowed in error, error


@pytest.mark.slow
def test_a_bad_value_exits_2_with_one_line_and_loads_nothing(tmp_path):
    """The process-level contract of every error above: exit status 2, one line on stderr, nothing trained."""
    result = run_train("algo=dpo", "kl_coef=0.5", f"hydra.run.dir={tmp_path / 'run'}", "logger=none")
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        "error: kl_coef does nothing with algo=dpo: only dapo, dr_grpo, grpo, gspo, ppo, raft, reinforce, "
        "reinforce_pp, reinforce_pp_baseline, rloo, vanilla_pg read it; remove it"
    ], result.stderr
    assert not (tmp_path / "run" / "policy").exists()


@pytest.mark.parametrize("model", group_options("model"))
def test_algo_ppo_brings_its_own_keys_and_a_recipe_keeps_its_schedule(model, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    cfg = composed(f"model={model}", "algo=ppo")
    # what a recipe sets holds (TL;DR: k=2, 2 epochs; arithmetic: k=4), the rest is PPO's own (k=1, 4 epochs)
    expected = {"tiny": (1, 4), "smollm2": (4, 4)}.get(model, (2, 2))
    assert cfg.algorithm == "ppo" and (cfg.k, cfg.num_ppo_epochs) == expected
    assert (cfg.vf_coef, cfg.value_clip_range, cfg.gamma, cfg.lam) == (0.1, 0.2, 1.0, 0.95)
    assert cfg.normalize_advantages is True and cfg.value_model is None and "loss" not in cfg
    if model == "smollm2":  # no reward model ships with it: nothing to start PPO's value model from
        with pytest.raises(ConfigError, match="algo=ppo needs a value model"):
            validate_train_config(cfg)
        return
    validate_train_config(cfg)
    assert composed(f"model={model}").algorithm == "rloo"


def test_reinforce_refuses_reused_rollouts():
    cfg = composed("loss=reinforce", "num_ppo_epochs=2")
    with pytest.raises(ConfigError, match="num_ppo_epochs=1"):
        validate_train_config(cfg)


def test_total_episodes_counts_every_device():
    cfg = composed("total_episodes=64", "rollout_batch_size=64", "micro_batch_size=64")
    validate_train_config(cfg, world_size=1)
    with pytest.raises(ConfigError, match="total_episodes"):
        validate_train_config(cfg, world_size=2)


def compose_sweep(name: str, overrides: tuple[str, ...] = ()):
    """A sweep file as `python -m rloo.train -m -cd sweeps -cn NAME` composes it: the job config and its params."""
    from hydra import compose, initialize_config_dir

    from rloo.run.resolvers import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "sweeps"), version_base="1.3"):
        cfg = compose(name, overrides=[f"hydra.searchpath=[file://{CONF_DIR}]", *overrides], return_hydra_config=True)
    return OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), cfg.hydra.sweeper.params


def swept_values(key: str, values) -> list[str] | None:
    """The values a sweeper param takes, as Hydra parses `key=values` (a choice sweep); None for a distribution that
    Optuna samples (interval(0.01, 0.2))."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep

    override = OverridesParser.create().parse_override(f"{key}={values}")
    if not override.is_sweep_override():
        return [override.get_value_element_as_str()]
    return list(override.sweep_string_iterator()) if isinstance(override.value(), ChoiceSweep) else None


@pytest.mark.parametrize("sweep", sorted(p.stem for p in (ROOT / "sweeps").glob("*.yaml")))
def test_every_sweep_composes_with_its_parameters(sweep):
    """Each value of each swept key or group (conf/'s, or the sweep dir's own, such as rloo_to_grpo/std) composes on
    the sweep's config and validates."""
    job, params = compose_sweep(sweep)
    assert params, "a sweep must list hydra.sweeper.params"
    validate_train_config(job)
    for key, values in params.items():
        group = (ROOT / "conf" / key).is_dir() or (ROOT / "sweeps" / key).is_dir()
        assert group or OmegaConf.select(job, key) is not None, f"{sweep}: swept key {key} is not a config key"
        for value in swept_values(key, values) or []:
            validate_train_config(compose_sweep(sweep, (f"{key}={value}",))[0])


def test_the_design_card_sweep_over_k_and_clip_range_composes_on_the_command_line():
    for k, clip in itertools.product((2, 4), (0.1, 0.2)):
        cfg = composed(f"k={k}", f"clip_range={clip}", "num_ppo_epochs=2")
        validate_train_config(cfg)
        assert (cfg.k, cfg.clip_range) == (k, clip)


@pytest.mark.parametrize("judge", group_options("judge"))
def test_every_judge_composes_and_builds_without_loading(judge, monkeypatch):
    from rloo.judges import build_judge

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    overrides = [f"judge={judge}"] + (["judge.path=/some/judge"] if judge == "hf" else [])
    cfg = composed(*overrides)
    validate_train_config(cfg)
    built = build_judge(cfg.judge, reward_model="/the/run/reward_model", tokenizer="/the/run/tokenizer")
    assert (built is None) == (judge == "none")
    if judge == "reward_model":  # null path: the run's own reward model
        assert built.path == "/the/run/reward_model" and built.tokenizer_path == "/the/run/tokenizer"
    if built is not None:
        assert not any(isinstance(v, torch.nn.Module) for v in vars(built).values())  # nothing loaded


def test_real_recipe_judges_with_openai_and_asks_for_the_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    cfg = composed("model=pythia1b")
    assert cfg.judge._target_.endswith("OpenAIJudge") and cfg.judge.base_url == "https://api.openai.com/v1"
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        validate_train_config(cfg)
    validate_train_config(
        composed("model=pythia1b", "judge.base_url=http://localhost:8000/v1")
    )  # a local server needs no key


def test_oracle_judge_is_refused_off_the_embedded_task(monkeypatch):
    with pytest.raises(ConfigError, match="judge=OracleJudge needs data=toy"):
        validate_train_config(composed("model=pythia1b", "judge=oracle"))


def test_a_deepspeed_strategy_without_deepspeed_is_one_line_before_any_model_loads():
    import importlib.util

    if importlib.util.find_spec("deepspeed") is not None:
        pytest.skip("deepspeed is installed here")
    assert "trainer.strategy=deepspeed_stage_2 needs DeepSpeed" in first_error(
        "trainer=gpu", "trainer.strategy=deepspeed_stage_2"
    )


def test_one_missing_eos_rule_at_a_time():
    with pytest.raises(ConfigError, match="one missing-EOS rule at a time"):
        validate_train_config(composed("missing_eos_penalty=1.0", "missing_eos_score=-1"))
    validate_train_config(composed("missing_eos_penalty=null", "missing_eos_score=-1"))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["judge=none", "eval.judge_timeout_s=5"], "eval.judge_timeout_s=5 does nothing with judge=none"),
        (["reward_timeout_s=5"], "reward_timeout_s=5 does nothing with reward='model'"),
    ],
)
def test_a_timeout_for_code_the_run_does_not_call_is_refused(overrides, message):
    assert first_error(*overrides).startswith(message)
    validate_train_config(composed("judge=none", "eval.judge_timeout_s=1800"))  # the default itself is no setting
    validate_train_config(
        composed("reward=tests.reward_functions:length", "reward_timeout_s=5", "eval.judge_timeout_s=9")
    )


def test_an_added_key_nothing_reads_is_refused_outside_training():
    """rloo.evaluate, rloo.sft and rloo.reward (preflight with train=False)."""
    from rloo.run.cli import preflight

    with pytest.raises(ConfigError, match=r"^typo is not a config key of this entry point"):
        preflight(["+typo=1"], train=False)
    assert preflight(["+judge.threshold=0.5"], train=False) == ["+judge.threshold=0.5"]  # a plug-in judge's argument


# ---- the algorithm registry: one record per algorithm ---------------------------------------------------------------
def test_every_algo_option_sets_a_registered_algorithm_and_every_registered_one_has_an_option():
    from rloo.algorithms.registry import ALGORITHMS

    chosen = {composed(f"algo={option}").algorithm for option in group_options("algo")}
    assert chosen == set(ALGORITHMS)


@pytest.mark.parametrize("algorithm", ["rloo", "raft", "reinforce", "vanilla_pg", "ppo", "dpo"])
def test_the_class_that_validates_an_algorithms_keys_is_the_one_its_module_reads(algorithm):
    """Every key the schema checks for the algorithm is a field of the config its LightningModule gets, set from the
    composed config; a key of another algorithm is refused by name."""
    from dataclasses import fields

    from rloo.algorithms.registry import ALGORITHMS
    from rloo.config.schema import RunKeys, fields_of, schema_of
    from tests.builders import train_config

    module_class, config_class = ALGORITHMS[algorithm].load()
    config = train_config(algorithm, total_rollouts=3)
    assert type(config) is config_class and config.total_rollouts == 3
    cfg = composed(f"algo={algorithm}")
    keyed = [f.name for f in fields(config_class) if "resume" in f.metadata]
    assert set(fields_of(schema_of(algorithm))) == set(fields_of(RunKeys)) | set(keyed)
    assert all(getattr(config, name) == cfg[name] for name in keyed)
    every = {f.name for spec in ALGORITHMS.values() for f in fields(spec.load()[1]) if "resume" in f.metadata}
    for name in sorted(every - set(keyed)):
        assert f"{name} does nothing with algo={algorithm}" in first_error(f"algo={algorithm}", f"+{name}=1")


def test_the_runtime_settings_are_the_schemas_keys_by_name():
    """Each settings class reads its keys by their own names (rloo.utils.keys.settings); every sampling key of the
    schema reaches a field of the sampler's settings (or one made from it), so a new key cannot validate and do
    nothing."""
    from dataclasses import fields

    from rloo.config.checks import eval_sampling, rollout_sampling, verifiable_eval
    from rloo.config.schema import EvalKeys, SamplingKeys
    from rloo.generation.settings import SamplingConfig
    from rloo.utils.keys import settings

    cfg = composed("reward=rloo.toy.rule_rewards:topic_recall", "eval.samples_per_prompt=4", "temperature=0.7")
    sampling = rollout_sampling(cfg)
    assert (sampling.temperature, sampling.max_new_tokens) == (0.7, cfg.response_length)
    assert eval_sampling(cfg).max_new_tokens == cfg.eval.max_new_tokens
    assert verifiable_eval(cfg).samples_per_prompt == 4
    made_from = {"response_length": "max_new_tokens", "stop_token": "stop_at_eos", "eval": None}
    sampler_fields = {f.name for f in fields(SamplingConfig)}
    for key in (f.name for f in fields(SamplingKeys)):
        assert key in sampler_fields or key in made_from, f"sampling key {key} reaches no setting"
    assert {"samples_per_prompt", "pass_k", "correct_at", "answer"} <= {f.name for f in fields(EvalKeys)}
    with pytest.raises(KeyError, match="no config key of that name"):
        settings(SamplingConfig, cfg.eval)  # eval has no temperature: a field is never filled from another name


def test_an_old_module_path_is_refused_in_one_line_naming_the_new_one():
    """The tree was laid out by layer: reward=, eval.answer and _target_ strings that name a module at its old path
    are one line naming the new path, before any model loads."""
    assert (
        first_error("reward=rloo.scoring:x")
        == "reward: rloo.scoring moved to rloo.rewards.scoring: write rloo.rewards.scoring:x"
    )
    assert first_error("logger=csv", "logger.csv._target_=rloo.loggers.AppendingCSVLogger") == (
        "rloo.loggers.AppendingCSVLogger: rloo.loggers moved to rloo.run.loggers; write "
        "rloo.run.loggers.AppendingCSVLogger"
    )


def test_the_rloo_to_grpo_sweep_is_its_eight_cells_of_rloo_over_five_seeds():
    """It builds on sweeps/rlvr.yaml, whose list of methods it must not inherit: 2 x 2 x 2 cells of algo=rloo."""
    _, params = compose_sweep("rloo_to_grpo")
    counts = {key: len(swept_values(key, values)) for key, values in params.items()}
    assert swept_values("algo", params["algo"]) == ["rloo"] and math.prod(counts.values()) == 8 * 5


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["rollout_precision=bf16", "precision=bf16"], "rollout_precision=bf16 needs precision=fp32"),
        (["rollout_precision=bf16", "lean_decode=false"], "rollout_precision=bf16 needs lean_decode=true"),
        (["rollout_precision=fp16"], "rollout_precision"),
    ],
)
def test_a_bf16_rollout_is_refused_where_it_would_change_nothing(overrides, message):
    assert first_error(*overrides).startswith(message)


def test_a_bf16_rollout_says_how_it_samples_and_evaluation_stays_float32():
    from rloo.config.checks import eval_sampling, rollout_sampling, verifiable_eval
    from rloo.generation.fast_paths import fast_paths
    from tests.tiny_models import tiny_model

    cfg = composed("rollout_precision=bf16", "reward=tests.reward_functions:length", "eval.samples_per_prompt=4")
    validate_train_config(cfg)
    assert rollout_sampling(cfg).rollout_precision == "bf16"
    assert eval_sampling(cfg).rollout_precision == verifiable_eval(cfg).sampling.rollout_precision == "same"
    sampler, why = fast_paths(cfg, tiny_model("llama"), None)["sampler"]
    assert sampler == "lean_decode" and "from bfloat16 copies of the weights" in why
    assert "held-out evaluation in float32" in why


def test_an_episode_budget_beyond_the_policys_positions_is_refused_before_loading(tiny_run_assets):
    """env=: the episode runs to env.max_episode_tokens after the prompt (turns and replies), not response_length."""
    import json

    from rloo.config.checks import check_context

    policy = tiny_run_assets / "policy"
    positions = json.loads((policy / "config.json").read_text())["max_position_embeddings"]
    fits = composed("env=topic_recall", "reward=env", f"env.max_episode_tokens={positions - 8}", "response_length=4")
    check_context(fits, str(policy), 8, "data.train (a.jsonl)")
    over = composed("env=topic_recall", "reward=env", f"env.max_episode_tokens={positions - 7}", "response_length=4")
    with pytest.raises(ConfigError) as caught:
        check_context(over, str(policy), 8, "data.train (a.jsonl)")
    assert str(caught.value) == (
        f"env.max_episode_tokens={positions - 7} after the longest prompt of data.train (a.jsonl) (8 tokens) needs "
        f"{positions + 1} positions; model.policy='{policy}' has {positions} (max_position_embeddings): "
        "lower env.max_episode_tokens or data.max_prompt_length"
    )
