"""python -m rloo.train: compose the config, build the pieces, fit, write the run summary.

python -m rloo.train                                   # the embedded task, offline, CPU, minutes
python -m rloo.train model=pythia6.9b precision=bf16   # the published TL;DR recipe
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from rloo.cli import exit_on_config_error, fail, run_entry_point  # noqa: E402
from rloo.config import ConfigError, validate_train_config  # noqa: E402
from rloo.errors import SIGTERM_EXIT_CODE, JudgeFailed, NonFiniteError, RewardFunctionError, RunIncomplete, WriteError  # noqa: E402


def measured_peak(baseline_rss_mb: float) -> dict:
    """The peak to set beside rloo.plan's: GPU memory allocated where the run used a GPU, else RSS above baseline."""
    import torch

    from rloo.memory import peak_rss_mb

    rss_above = round(peak_rss_mb() - baseline_rss_mb, 1)
    if torch.cuda.is_initialized():
        gpu = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        return {
            "measured_peak_mb": gpu,
            "measured_as": "torch.cuda.max_memory_allocated",
            "rss_above_baseline_mb": rss_above,
        }
    return {"measured_peak_mb": rss_above, "measured_as": "peak RSS above baseline"}


def run(cfg: DictConfig) -> dict:
    """One training run inside the Hydra run dir; returns the summary written to summary.json."""
    from rloo.assemble import (
        build_module,
        check_lora_targets,
        fast_paths,
        lightning_strategy,
        policy_and_reference,
        precision_arguments,
        quiet_lightning_logs,
        resolve_sources,
        reward_from_config,
        world_size,
    )
    from rloo.config import (
        check_model_sources,
        check_strategy_installed,
        episodes_note,
        eval_sampling,
        num_rollouts,
        updates_per_rollout,
    )

    trainer_args = {k: v for k, v in OmegaConf.to_container(cfg.trainer, resolve=True).items() if k != "num_threads"}
    processes = world_size(trainer_args)
    validate_train_config(cfg, world_size=processes)  # once, before anything heavy is imported, written or loaded
    check_strategy_installed(cfg)  # DeepSpeed strategies need deepspeed on this machine
    check_model_sources(cfg)  # the model dirs (config.json) or the hub cache, read only
    # a batch of the train loop is one rollout; Lightning counts every optimiser step of it (global_step)
    rollouts, updates = num_rollouts(cfg, processes), updates_per_rollout(cfg)
    trainer_args["strategy"] = lightning_strategy(cfg, trainer_args, processes)

    import lightning as L
    import torch
    from hydra.utils import instantiate
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from rloo import atomic
    from rloo.callbacks import ExportPolicy, HeldOutEval, MismatchHistograms, RanksAgree, SampleTable
    from rloo.config import check_context
    from rloo.data import PromptDataModule, SplitSpec
    from rloo.judges import build_judge
    from rloo.loggers import drop_rows_after
    from rloo.memory import current_rss_mb, peak_rss_mb, reset_peak_rss
    from rloo.memory_plan import planned_peak
    from rloo.models import load_policy, load_reward_model, load_tokenizer, load_value_model
    from rloo.scoring import check_columns
    from rloo.user_code import Interrupted as UserCodeInterrupted

    started = time.time()  # after the imports, as wall_seconds always counted
    reset_peak_rss()  # peak_rss_mb is this run's, also where a sweep's runs share one process

    quiet_lightning_logs()
    log = logging.getLogger("rloo").info  # to the console and to the run's train.log
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if note := episodes_note(cfg, processes):
        log(f"rloo: warning: {note}")
    requeued = cfg.resume == "auto" or (cfg.resume is not None and Path(cfg.resume).expanduser().is_dir())
    if requeued and (done := finished_summary(out, rollouts, cfg.eval.after)) is not None:  # nothing left to do
        log(
            f"resume: {out} has finished ({done['rollouts']} rollouts, policy/ exported, summary.json final); unchanged"
        )
        return done
    resume_point, resumed_rollouts = prepare_resume(cfg, out, updates, log)  # before anything is written or loaded
    config_name = (
        "config.yaml" if not (out / "config.yaml").exists() else f"config.resumed-{time.strftime('%H-%M-%S')}.yaml"
    )
    atomic.write_text(out / config_name, OmegaConf.to_yaml(cfg, resolve=True), "the resolved config")
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    if resume_point:  # the rows a resumed run logs again move aside: metrics.csv stays one timeline
        for metrics_csv in out.glob("csv/metrics.csv"):
            drop_rows_after(str(metrics_csv), resumed_rollouts)
    loggers = (
        [instantiate(c, **continued_wandb_run(c, out) if resume_point else {}) for c in cfg.logger.values()]
        if cfg.logger
        else False
    )
    export = ExportPolicy(out / "policy", exported=lambda: write_summary("evaluating"))
    eval_callback = HeldOutEval(
        [],
        eval_sampling(cfg),
        cfg.eval.batch_size,
        None,
        before=cfg.eval.before,
        after=cfg.eval.after,
        every=cfg.eval_every,
        samples_path=out / "eval_samples.jsonl",
        log=log,
        judge_timeout_s=cfg.eval.judge_timeout_s,
    )
    # in list order at each hook. on_train_end: the policy exported, the summary so far (write_summary below), then
    # the final evaluation. After each rollout: evaluation and samples, then the checkpoint that includes them.
    callbacks = [
        export,
        eval_callback,
        SampleTable(cfg.sample_every, cfg.num_samples_logged, out / "samples.jsonl"),
        MismatchHistograms(cfg.log_every),
        RanksAgree(),
        *checkpoint_callbacks(cfg, out),
    ]
    precision = precision_arguments(cfg.precision.trainer, cfg.trainer.accelerator)
    plugins = precision.pop("plugins", []) + [atomic.checkpoint_io()]
    trainer = L.Trainer(
        **trainer_args,
        **precision,
        plugins=plugins,
        logger=loggers,
        default_root_dir=out,
        callbacks=callbacks,
        max_epochs=1,
        max_steps=rollouts * updates,
        log_every_n_steps=cfg.log_every,
        use_distributed_sampler=False,  # PromptDataModule splits
        num_sanity_val_steps=0,
    )
    if trainer.world_size != processes:
        raise ConfigError(
            f"trainer.devices={cfg.trainer.devices!r} runs {trainer.world_size} processes, not the "
            f"{processes} it was read as: give the device count as an integer"
        )

    model_src, data_src, bootstrap_report = resolve_sources(cfg, log)
    L.seed_everything(cfg.seed, workers=True, verbose=False)  # after the bootstrap: cold and warm runs match
    tokenizer = load_tokenizer(model_src["tokenizer"], model_src["pad_token"], model_src["chat_template"])
    datamodule = PromptDataModule(
        tokenizer,
        SplitSpec(**data_src["train"]),
        SplitSpec(**data_src["validation"]),
        cfg.data.max_prompt_length,
        cfg.data.truncate_prompts,
        cfg.rollout_batch_size // cfg.k,
        rollouts,
        seed=cfg.seed,
        shuffle=cfg.data.shuffle,
        num_workers=cfg.data.num_workers,
        log=log,
    )
    datamodule.first_rollout = resumed_rollouts
    datamodule.setup("fit")  # data errors surface before any model loads
    reward = reward_from_config(cfg)  # reward= beyond the reward model alone, built once
    if reward is not None:  # the columns reward functions ask for are in the data; a guarded call stops on SIGTERM
        reward.should_stop = lambda: trainer.received_sigterm
        check_columns(reward, list(datamodule.train_rows[0]["columns"]), f"data.train ({data_src['train']['path']})")
    eval_callback.rows = datamodule.eval_rows(cfg.eval.num_prompts)
    longest = max(len(row["prompt_ids"]) for row in datamodule.train_rows + eval_callback.rows)
    check_context(cfg, model_src["policy"], longest, f"data.train/validation ({data_src['train']['path']})")
    eval_callback.judge = build_judge(cfg.get("judge"), model_src["reward_model"], model_src["tokenizer"])

    check_lora_targets(cfg, model_src["policy"])  # before any weight loads
    memory = {"baseline_rss_mb": round(current_rss_mb(), 1)} | planned_peak(cfg, model_src["policy"])
    policy, reference = policy_and_reference(cfg, load_policy(model_src["policy"], tokenizer), model_src["reference"])
    reward_model = (
        load_reward_model(model_src["reward_model"], model_src["frozen_dtype"], tokenizer)
        if model_src["reward_model"]
        else None
    )  # reward= may score with functions alone
    module = build_module(
        cfg,
        policy,
        reference,
        reward_model,
        tokenizer,
        rollouts,
        value_model=lambda: load_value_model(cfg.value_model or model_src["reward_model"], tokenizer),
        reward=reward,
    )
    paths = fast_paths(cfg, policy, reward_model)  # which sampler and forwards run, and why: never silent
    for name, (chosen, why) in paths.items():
        log(f"rloo: {name}: {chosen} ({why})")
    for logger in loggers or []:
        logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))

    fit_started = time.time()

    def write_summary(status: str) -> dict:
        """summary.json as it stands: after training (status evaluating), at the end, or on an interruption."""
        summary = {
            "status": status,  # finished | evaluating (the final evaluation is running) | interrupted | failed
            "initial": eval_callback.initial,
            "final": eval_callback.final,
            "eval_history": eval_callback.history,
            "judge": None if eval_callback.judge is None else repr(eval_callback.judge),
            "rollouts": module.state.rollouts,
            "optimizer_steps": trainer.global_step,
            "episodes": module.state.episodes,
            "train_seconds": round(
                module.state.train_seconds, 2
            ),  # in training steps only: no evaluation, no checkpoint
            "algorithm": cfg.algorithm,
            "wall_seconds": round(time.time() - started, 2),
            "fit_seconds": round(
                time.time() - fit_started, 2
            ),  # trainer.fit: training steps and the evaluations inside it
            "peak_rss_mb": round(peak_rss_mb(), 1),  # this process (rank) since the run began
            # rloo.plan's peak for this config against the measured one above what ran before any model loaded
            "memory": memory | measured_peak(memory["baseline_rss_mb"]),
            "peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if torch.cuda.is_available() else None,
            "output_dir": str(out),
            "policy_dir": str(out / "policy") if (out / "policy").exists() else None,
            "bootstrap": bootstrap_report,
            "fast_paths": {name: {"ran": chosen, "why": why} for name, (chosen, why) in paths.items()},
        }
        if trainer.is_global_zero:
            atomic.write_text(out / "summary.json", json.dumps(summary, indent=2), "the run summary")
        return summary

    try:
        trainer.fit(
            module,
            datamodule=datamodule,
            ckpt_path=resume_point.checkpoint if resume_point else None,
            weights_only=True,  # tensors and plain values only: a planted pickle is refused, never run
        )
        if not export.ran and module.state.rollouts >= rollouts:  # resumed after training had ended: Lightning runs
            finish_ended_training(out, trainer, module, export, eval_callback, log)  # no end-of-training hooks
    except BaseException as error:  # SIGTERM, Ctrl-C (Lightning exits 1 for it), any failure: keep what there is
        interrupted = isinstance(error, (SystemExit, KeyboardInterrupt, UserCodeInterrupted))
        try:
            write_summary("interrupted" if interrupted else "failed")
        except WriteError as write_error:  # the first failure is the one to raise
            log(f"error: {write_error}")
        if isinstance(error, (SIGTERMException, UserCodeInterrupted)):
            stopped_by_sigterm(out, module, log)
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise WriteError(
                f"could not write {error.filename or 'a checkpoint'} in {out}: {error.strerror}; "
                f"checkpoints already there are whole: {checkpoint_names(out) or 'none'}"
            ) from None
        raise
    if trainer.received_sigterm:  # it came after training, during the final evaluation
        write_summary("interrupted")
        stopped_by_sigterm(out, module, log)
    if eval_callback.judge_failure and eval_callback.final is not None:  # no win rate to report, nor to rank by
        write_summary("failed")
        raise JudgeFailed(
            f"{eval_callback.judge_failure}; policy/ and checkpoints are saved, summary.json has no win rate"
        )
    missing = [
        what
        for what, absent in (
            ("policy/", not (out / "policy").is_dir()),
            ("the final evaluation", cfg.eval.after and eval_callback.final is None),
        )
        if absent
    ]
    if missing:  # never "finished" without them
        write_summary("failed")
        raise RunIncomplete(f"the run trained {module.state.rollouts} rollouts but has no {' and no '.join(missing)}")
    summary = write_summary("finished")
    if trainer.is_global_zero:
        print_summary(summary, log)
    return summary


def finished_summary(out: Path, rollouts: int, final_evaluation: bool) -> dict | None:
    """summary.json of a run in `out` that is done: finished, all `rollouts` trained, policy/ exported and the final
    evaluation recorded (where one is asked for). None otherwise, also where the file does not parse."""
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    done = (
        summary.get("status") == "finished"
        and summary.get("rollouts", -1) >= rollouts
        and (out / "policy" / "config.json").is_file()
        and (summary.get("final") is not None or not final_evaluation)
    )
    return summary if done else None


def finish_ended_training(out: Path, trainer, module, export, eval_callback, log) -> None:
    """What a run killed after its last rollout had not done yet: the policy export, the final evaluation."""
    if not (out / "policy").is_dir():
        log(f"resume: training had ended after {module.state.rollouts} rollouts; exporting the policy now")
        export.on_train_end(trainer, module)
    if eval_callback.after and eval_callback.final is None:
        log("resume: training had ended without its final evaluation; running it now")
        eval_callback.on_train_end(trainer, module)


def checkpoint_callbacks(cfg: DictConfig, out: Path) -> list:
    """Checkpoints every checkpoint_every rollouts and every checkpoint_minutes (the newest keep_checkpoints kept,
    last.ckpt the newest), at the end of training, and on SIGTERM, Ctrl-C or an error (interrupted.ckpt)."""
    from lightning.pytorch.callbacks import OnExceptionCheckpoint

    from rloo.callbacks import RolloutCheckpoints

    directory = out / "checkpoints"
    return [
        RolloutCheckpoints(directory, cfg.checkpoint_every, cfg.checkpoint_minutes, cfg.keep_checkpoints),
        OnExceptionCheckpoint(directory, "interrupted"),
    ]


def continued_wandb_run(logger_cfg: DictConfig, out: Path) -> dict:
    """A resumed run logs into the same W&B run (its id, from the run dir's wandb/ folder), not a new one."""
    if not str(logger_cfg.get("_target_", "")).endswith("WandbLogger"):
        return {}
    runs = sorted((out / "wandb").glob("*run-*-*"), key=lambda p: p.stat().st_mtime)
    return {"id": runs[-1].name.rsplit("-", 1)[1], "resume": "allow"} if runs else {}


def prepare_resume(cfg: DictConfig, out: Path, updates: int, log):
    """The checkpoint `resume=` continues from and the rollouts it had done, or (None, 0) for a fresh start."""
    from rloo.resume import find_resume_point, inspect_checkpoint

    if cfg.resume is None:
        return None, 0
    compare_with_resumed_run(cfg, out, log)
    from rloo.atomic import remove_stale_temps

    for directory in (out, out / "checkpoints"):  # what a kill mid-write left
        if directory.is_dir():
            remove_stale_temps(directory, log)
    point = find_resume_point(cfg.resume, out, updates, log)
    if point is None:
        return None, 0
    rollouts = inspect_checkpoint(point.checkpoint, updates)[0]
    log(f"resume: from {point.checkpoint} after {rollouts} rollouts; writing to {out}")
    return point, rollouts


def compare_with_resumed_run(cfg: DictConfig, out: Path, log) -> None:
    """Refuse a resume whose settings cannot continue the run (one line, before any checkpoint is read); say which
    changed settings take effect."""
    from rloo.resume import compare_configs, run_dir_of

    previous_config = Path(run_dir_of(cfg.resume) or out) / "config.yaml"
    if not previous_config.exists():
        if cfg.resume != "auto":
            log(f"resume: {previous_config} not found; the checkpoint's settings are not compared")
        return
    previous = OmegaConf.to_container(OmegaConf.load(previous_config))
    refused, applied = compare_configs(previous, OmegaConf.to_container(cfg, resolve=True))
    if refused:
        raise ConfigError(
            f"resume={cfg.resume} cannot continue with {'; '.join(refused)} (from {previous_config}): "
            "these keys are fixed for a run; start a new run to change them"
        )
    for change in applied:
        log(f"resume: {change} (applied from the resumed rollout on)")


def checkpoint_names(out: Path) -> str:
    return ", ".join(sorted(p.name for p in (out / "checkpoints").glob("*.ckpt")))


def stopped_by_sigterm(out: Path, module, log) -> None:
    """Exit as a process ended by SIGTERM (128 + 15), which schedulers read as preempted, never as success."""
    log(
        f"rloo: stopped by SIGTERM after {module.state.rollouts} rollouts; checkpoints in {out / 'checkpoints'}: "
        f"{checkpoint_names(out) or 'none'}; summary.json says what was done"
    )
    sys.exit(SIGTERM_EXIT_CODE)


def print_summary(summary: dict, log=print) -> None:
    log(
        f"\nrloo: {summary['rollouts']} rollouts ({summary['optimizer_steps']} optimiser steps), "
        f"{summary['episodes']} episodes"
        f" in {summary['wall_seconds']:.0f} s"
    )
    log(f"  outputs: {summary['output_dir']}  (summary.json, policy/, checkpoints/, config.yaml, logs)")
    initial, final = summary["initial"] or {}, summary["final"] or {}

    def shown(evaluation: dict, key: str) -> str:
        if key not in evaluation:
            return "-"
        if f"{key}_ci_low" in evaluation:  # the win rate and reward functions' means carry a 95% interval
            low, high = evaluation[f"{key}_ci_low"], evaluation[f"{key}_ci_high"]
            return f"{evaluation[key]:.3f} [{low:.3f}, {high:.3f}]"
        return f"{evaluation[key]:.3f}"

    rewards = [key for key in final if key.startswith("eval/reward/") and not key.endswith(("_ci_low", "_ci_high"))]
    for key in ("eval/win_rate", *rewards, "eval/score", "eval/mean_length"):
        if key in final:
            log(f"  {key:<17} {shown(initial, key)} -> {shown(final, key)}")


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def hydra_main(cfg: DictConfig) -> float | None:
    """One run; returns what a sweeper ranks: the final win rate when a judge is set (None when it has none); with
    judge=none, the first reward function's held-out mean (eval/reward/<name>), else the reward model's score.
    Never one in place of the other."""
    try:
        summary = run(cfg)
    except ConfigError as error:
        exit_on_config_error(error)
    except (WriteError, NonFiniteError, RewardFunctionError, JudgeFailed, RunIncomplete) as error:
        fail(error, 1)
    return objective(summary)


def objective(summary: dict) -> float | None:
    """What a sweeper ranks a finished run by (see hydra_main)."""
    final = summary.get("final") or {}
    if summary["judge"] is not None:
        return final.get("eval/win_rate")
    rewards = [k for k in final if k.startswith("eval/reward/") and not k.endswith(("_ci_low", "_ci_high"))]
    return final.get(rewards[0]) if rewards else final.get("eval/score")


if __name__ == "__main__":
    run_entry_point(hydra_main, train=True)
