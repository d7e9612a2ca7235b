"""One training run from a composed config, whoever composed it (python -m rloo.train through Hydra, rloo.fit from
Python): prepare (validation, the run dir, resume), build (loggers, callbacks, the Trainer, data, models, the
algorithm's module), fit (training inside the failure handling), finish (summary.json, the model card)."""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from omegaconf import DictConfig, OmegaConf  # noqa: E402

from rloo.config.checks import ConfigError  # noqa: E402
from rloo.run.stops import (  # noqa: E402
    checkpoint_names,
    stop_line,
    stop_other_ranks,
    stopped_by_sigterm,
    stopped_while_building,
)
from rloo.utils.errors import (  # noqa: E402
    JudgeFailed,
    RankLost,
    RunIncomplete,
    WriteError,
    collective_failure,
    stopped_by_ctrl_c,
)
from rloo.utils.host import cpu_identity  # noqa: E402


def measured_peak(baseline_rss_mb: float) -> dict:
    """The peak to set beside rloo.plan's: GPU memory allocated where the run used a GPU, else RSS above baseline."""
    import torch

    from rloo.utils.memory import peak_rss_mb

    rss_above = round(peak_rss_mb() - baseline_rss_mb, 1)
    if torch.cuda.is_initialized():
        gpu = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        return {
            "measured_peak_mb": gpu,
            "measured_as": "torch.cuda.max_memory_allocated",
            "rss_above_baseline_mb": rss_above,
        }
    return {"measured_peak_mb": rss_above, "measured_as": "peak RSS above baseline"}


def run(cfg: DictConfig, callbacks: Sequence = ()) -> dict:
    """One training run inside the Hydra run dir, in three phases: `prepare` (validation, the run dir, resume),
    `build` (loggers, callbacks, the Trainer, data, models, the algorithm's module) and `fit` (training inside the
    failure handling, then summary.json). Returns the summary written to summary.json."""
    from rloo.run.cli import further_rank
    from rloo.utils import ownership

    try:
        if not further_rank():  # taken before validation too: a job failed by its config says why in its dir
            ownership.take(Path(cfg.paths.output_dir), logging.getLogger("rloo").info)
        plan = prepare(cfg)
        if isinstance(plan, dict):  # a requeued run that had finished: its summary, the run dir unchanged
            return plan
        plan.user_callbacks = list(callbacks)  # rloo.fit's, beside rloo's own
        record = RunRecord(plan)
        with stopped_while_building(record):
            pieces = build(plan, record)
        return fit(plan, pieces, record)
    except BaseException as error:
        from rloo.run.stops import record_failure

        record_failure(Path(cfg.paths.output_dir), error)
        raise
    finally:  # a sweep's jobs share a process: each job's dir is released as the job ends
        ownership.release(Path(cfg.paths.output_dir))


@dataclass
class RunPlan:
    """What `prepare` settled before any model or data loads."""

    cfg: DictConfig
    out: Path
    log: Callable[[str], None]  # to the console and to the run's train.log
    processes: int
    rollouts: int
    updates: int  # optimiser steps per rollout
    trainer_args: dict
    resume_point: object  # rloo.utils.resume.ResumePoint, or None for a fresh start
    resumed_rollouts: int
    started: float  # wall clock after the imports, as wall_seconds always counted
    user_callbacks: list = field(default_factory=list)  # Lightning callbacks handed to rloo.fit


@dataclass
class RunPieces:
    """What `build` made from the plan."""

    trainer: object
    module: object
    datamodule: object
    export: object  # rloo.run.callbacks.ExportPolicy
    evaluation: object  # rloo.run.callbacks.HeldOutEval
    paths: dict  # the fast paths that run, each with why
    memory: dict  # the planned peak and the RSS before any model loaded
    bootstrap_report: dict | None


def prepare(cfg: DictConfig) -> RunPlan | dict:
    """Validation (once, before anything heavy is imported, written or loaded), the run dir and its config.yaml,
    and the resume point; the summary of a requeued run that had finished instead."""
    from rloo.config.checks import episodes_note, num_rollouts, updates_per_rollout, validate_run, world_size
    from rloo.run.assemble import lightning_strategy, quiet_lightning_logs

    trainer_args = {
        k: v
        for k, v in OmegaConf.to_container(cfg.trainer, resolve=True).items()
        if k not in ("num_threads", "collective_timeout_s", "startup_timeout_s")  # rloo's own: torch's threads, the
        # process groups' bounds
    }
    processes = world_size(trainer_args)
    validate_run(cfg, processes)
    # a batch of the train loop is one rollout; Lightning counts every optimiser step of it (global_step)
    rollouts, updates = num_rollouts(cfg, processes), updates_per_rollout(cfg)
    trainer_args["strategy"] = lightning_strategy(cfg, trainer_args, processes)

    import lightning  # noqa: F401 (imported before the clock starts, as wall_seconds always counted)
    import torch

    from rloo.run.cli import further_rank
    from rloo.run.loggers import drop_rows_after
    from rloo.utils import atomic
    from rloo.utils.memory import reset_peak_rss
    from rloo.utils.resume import finished_summary, prepare_resume

    started = time.time()
    reset_peak_rss()  # peak_rss_mb is this run's, also where a sweep's runs share one process
    quiet_lightning_logs()
    log = logging.getLogger("rloo").info
    out = Path(cfg.paths.output_dir)  # taken by `run` before this (one owner per run dir)
    out.mkdir(parents=True, exist_ok=True)
    if note := episodes_note(cfg, processes):
        log(f"rloo: warning: {note}")
    requeued = cfg.resume == "auto" or (cfg.resume is not None and Path(cfg.resume).expanduser().is_dir())
    if requeued and (done := finished_summary(out, rollouts, cfg.eval.after)) is not None:  # nothing left to do
        log(
            f"resume: {out} has finished ({done['rollouts']} rollouts, policy/ exported, summary.json final); unchanged"
        )
        return done
    if cfg.resume is not None:  # before anything is written or loaded
        compare_with_resumed_run(cfg, out, log)
    resume_point, resumed_rollouts = prepare_resume(cfg.resume, out, updates, log)
    if not further_rank():  # the run dir's one writer (another rank or node would add a config.resumed-*.yaml)
        config_name = (
            "config.yaml" if not (out / "config.yaml").exists() else f"config.resumed-{time.strftime('%H-%M-%S')}.yaml"
        )
        atomic.write_text(out / config_name, OmegaConf.to_yaml(cfg, resolve=True), "the resolved config")
    if cfg.trainer.num_threads:
        torch.set_num_threads(cfg.trainer.num_threads)
    if resume_point:  # the rows a resumed run logs again move aside: metrics.csv stays one timeline
        for metrics_csv in out.glob("csv/metrics.csv"):
            drop_rows_after(str(metrics_csv), resumed_rollouts)
    return RunPlan(cfg, out, log, processes, rollouts, updates, trainer_args, resume_point, resumed_rollouts, started)


def build(plan: RunPlan, record: "RunRecord") -> RunPieces:
    """The Trainer with its loggers and callbacks, then the data (its errors before any model loads), then the
    models and the algorithm's module; says which fast paths run."""
    trainer, export, evaluation = build_trainer(plan, record)
    cfg, log = plan.cfg, plan.log
    from rloo.generation.fast_paths import fast_paths
    from rloo.run.assemble import build_module, resolve_sources

    model_src, data_src, bootstrap_report = resolve_sources(cfg, log)
    import lightning as L

    L.seed_everything(cfg.seed, workers=True, verbose=False)  # after the bootstrap: cold and warm runs match
    tokenizer, datamodule, reward, environment = build_data(plan, trainer, evaluation, model_src, data_src)
    memory, (policy, reference, reward_model) = build_models(cfg, model_src, tokenizer)
    from rloo.models.loading import load_value_model

    module = build_module(
        cfg,
        policy,
        reference,
        reward_model,
        tokenizer,
        plan.rollouts,
        value_model=lambda: load_value_model(cfg.value_model or model_src["reward_model"], tokenizer),
        reward=reward,
        environment=environment,
    )
    if module.environment is not None:  # a guarded call stops waiting on SIGTERM
        module.environment.should_stop = lambda: trainer.received_sigterm
    paths = fast_paths(cfg, policy, reward_model)  # which sampler and forwards run, and why: never silent
    for name, (chosen, why) in paths.items():
        log(f"rloo: {name}: {chosen} ({why})")
    for logger in trainer.loggers:
        logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
    pieces = RunPieces(trainer, module, datamodule, export, evaluation, paths, memory, bootstrap_report)
    record.pieces = pieces
    return pieces


def build_trainer(plan: RunPlan, record: "RunRecord"):
    """The Trainer, its loggers (a resumed run continues its W&B run) and callbacks; the export and evaluation
    callbacks, which the summary reads."""
    import lightning as L
    from hydra.utils import instantiate

    from rloo.config.checks import eval_sampling, verifiable_eval
    from rloo.run.assemble import precision_arguments
    from rloo.run.callbacks import (
        CollectiveTimeout,
        ExportPolicy,
        HeldOutEval,
        MismatchHistograms,
        ProgressLines,
        RanksAgree,
        SampleTable,
        SigtermBetweenRollouts,
    )
    from rloo.run.preemption import cluster_plugins
    from rloo.utils import atomic
    from rloo.utils.resume import continued_wandb_run

    cfg, out = plan.cfg, plan.out
    resumed = plan.resume_point is not None
    loggers = (
        [instantiate(c, **continued_wandb_run(c, out) if resumed else {}) for c in cfg.logger.values()]
        if cfg.logger
        else False
    )
    export = ExportPolicy(out / "policy", exported=lambda: record.write("evaluating"))
    evaluation = HeldOutEval(
        [],
        eval_sampling(cfg),
        cfg.eval.batch_size,
        None,
        before=cfg.eval.before,
        after=cfg.eval.after,
        every=cfg.eval_every,
        samples_path=out / "eval_samples.jsonl",
        log=plan.log,
        judge_timeout_s=cfg.eval.judge_timeout_s,
        verifiable=verifiable_eval(cfg),
    )
    # in list order at each hook. on_train_end: the policy exported, the summary so far (RunRecord.write), then
    # the final evaluation. After each rollout: evaluation and samples, then the checkpoint that includes them.
    terminal = sys.stdout.isatty()  # a log file or a cluster job's output gets lines instead of the bar
    callbacks = [
        export,
        evaluation,
        SampleTable(cfg.sample_every, cfg.num_samples_logged, out / "samples.jsonl"),
        MismatchHistograms(cfg.log_every),
        RanksAgree(),
        SigtermBetweenRollouts(),
        CollectiveTimeout(cfg.trainer.collective_timeout_s),
        *checkpoint_callbacks(cfg, out),
        *([ProgressLines(cfg.progress_every, plan.log)] if not terminal and cfg.progress_every else []),
        *plan.user_callbacks,
    ]
    if str(cfg.trainer.strategy).startswith("deepspeed") and cfg.trainer.accelerator == "cpu":
        from rloo.run.deepspeed_cpu import build_cpu_ops

        build_cpu_ops(plan.log)  # before the ranks start: under rloo's lock, never a silent wait on a stale one
    precision = precision_arguments(cfg.precision.trainer, cfg.trainer.accelerator)
    plugins = precision.pop("plugins", []) + [atomic.checkpoint_io(), *cluster_plugins()]
    trainer = L.Trainer(
        **plan.trainer_args,
        **precision,
        plugins=plugins,
        logger=loggers,
        default_root_dir=out,
        callbacks=callbacks,
        max_epochs=1,
        max_steps=plan.rollouts * plan.updates,
        log_every_n_steps=cfg.log_every,
        use_distributed_sampler=False,  # PromptDataModule splits
        num_sanity_val_steps=0,
        # Lightning's model table counts the frozen models as modules in eval mode and FLOPs as 0: rloo's own lines
        # name each model and path
        **({} if "enable_model_summary" in plan.trainer_args else {"enable_model_summary": False}),
        **({} if "enable_progress_bar" in plan.trainer_args else {"enable_progress_bar": terminal}),
    )
    if trainer.world_size != plan.processes:
        raise ConfigError(
            f"trainer.devices={cfg.trainer.devices!r} runs {trainer.world_size} processes, not the "
            f"{plan.processes} it was read as: give the device count as an integer"
        )
    return trainer, export, evaluation


def build_data(plan: RunPlan, trainer, evaluation, model_src: dict, data_src: dict):
    """The tokenizer, the prompts (train and held out), the reward beyond the reward model and the judge; every data
    error (a column a reward function needs, a prompt past the policy's positions) surfaces here, before any model
    loads."""
    from rloo.config.checks import check_context
    from rloo.data.prompts import PromptDataModule, SplitSpec
    from rloo.judges import build_judge
    from rloo.models.loading import load_tokenizer
    from rloo.rewards.scoring import check_columns
    from rloo.run.assemble import environment_from_config, reward_from_config

    cfg = plan.cfg
    tokenizer = load_tokenizer(model_src["tokenizer"], model_src["pad_token"], model_src["chat_template"])
    environment = environment_from_config(cfg, tokenizer)  # env=: its class (and a tool environment's tools)
    datamodule = PromptDataModule(
        tokenizer,
        SplitSpec(**data_src["train"]),
        SplitSpec(**data_src["validation"]),
        cfg.data.max_prompt_length,
        cfg.data.truncate_prompts,
        cfg.rollout_batch_size // cfg.k,
        plan.rollouts,
        seed=cfg.seed,
        shuffle=cfg.data.shuffle,
        num_workers=cfg.data.num_workers,
        log=plan.log,
        system_prompt=cfg.data.get("system_prompt"),
        tools=None if environment is None else environment.tools,
    )
    datamodule.first_rollout = plan.resumed_rollouts
    datamodule.setup("fit")
    reward = reward_from_config(cfg)  # reward= beyond the reward model alone, built once
    if reward is not None:  # the columns reward functions ask for are in the data; a guarded call stops on SIGTERM
        reward.should_stop = lambda: trainer.received_sigterm
        available = list(datamodule.train_rows[0]["columns"]) + (["environments"] if environment is not None else [])
        if cfg.get("rollout") is None:  # an external rollout's own fields reach the functions too: known only then
            check_columns(reward, available, f"data.train ({data_src['train']['path']})")
    evaluation.rows = datamodule.eval_rows(cfg.eval.num_prompts)
    longest = max(len(row["prompt_ids"]) for row in datamodule.train_rows + evaluation.rows)
    check_context(cfg, model_src["policy"], longest, f"data.train/validation ({data_src['train']['path']})")
    evaluation.judge = build_judge(cfg.get("judge"), model_src["reward_model"], model_src["tokenizer"])
    return tokenizer, datamodule, reward, environment


def build_models(cfg: DictConfig, model_src: dict, tokenizer):
    """The memory plan (before any weight loads), then the policy, its reference and the reward model (None where
    reward functions alone score)."""
    from rloo.models.loading import load_policy, load_reward_model
    from rloo.run.assemble import check_lora_targets, policy_and_reference
    from rloo.run.memory_plan import planned_peak
    from rloo.utils.memory import current_rss_mb

    check_lora_targets(cfg, model_src["policy"])  # before any weight loads
    memory = {"baseline_rss_mb": round(current_rss_mb(), 1)} | planned_peak(cfg, model_src["policy"])
    policy, reference = policy_and_reference(cfg, load_policy(model_src["policy"], tokenizer), model_src["reference"])
    reward_model = (
        load_reward_model(model_src["reward_model"], model_src["frozen_dtype"], tokenizer)
        if model_src["reward_model"]
        else None
    )
    return memory, (policy, reference, reward_model)


class RunRecord:
    """summary.json as the run stands: after training (status evaluating), at the end, or on an interruption."""

    def __init__(self, plan: RunPlan):
        self.plan = plan
        self.pieces: RunPieces | None = None  # set by `build`
        self.fit_started = time.time()

    def summary(self, status: str) -> dict:
        import torch

        from rloo.utils.memory import peak_rss_mb

        plan, pieces = self.plan, self.pieces
        module, evaluation, out = pieces.module, pieces.evaluation, plan.out
        return {
            "status": status,  # finished | evaluating (the final evaluation is running) | interrupted | failed
            "initial": evaluation.initial,
            "final": evaluation.final,
            "eval_history": evaluation.history,
            "judge": None if evaluation.judge is None else repr(evaluation.judge),
            "rollouts": module.state.rollouts,
            "optimizer_steps": pieces.trainer.global_step,
            "episodes": module.state.episodes,
            "sampled": module.state.sampled,  # completions generated: more than episodes where groups were dropped
            "no_signal_rollouts": module.state.no_signal_rollouts,  # no prompt's completions differed in score
            "train_seconds": round(module.state.train_seconds, 2),  # in training steps only: no evaluation
            "algorithm": plan.cfg.algorithm,
            "wall_seconds": round(time.time() - plan.started, 2),
            "fit_seconds": round(time.time() - self.fit_started, 2),  # trainer.fit, with the evaluations inside it
            "peak_rss_mb": round(peak_rss_mb(), 1),  # this process (rank) since the run began
            # rloo.plan's peak for this config against the measured one above what ran before any model loaded
            "memory": pieces.memory | measured_peak(pieces.memory["baseline_rss_mb"]),
            "peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if torch.cuda.is_available() else None,
            "output_dir": str(out),
            "host": cpu_identity(),  # the figures depend on the CPU's instruction set (rloo.utils.host)
            "policy_dir": str(out / "policy") if (out / "policy").exists() else None,
            "bootstrap": pieces.bootstrap_report,
            "data": pieces.datamodule.counts,  # prompts kept, and dropped for their length or as empty, per split
            "fast_paths": {name: {"ran": chosen, "why": why} for name, (chosen, why) in self.ran_paths().items()},
        }

    def ran_paths(self) -> dict[str, tuple[str, str]]:
        """The fast paths as planned before fit, with the sampler as the module decided it once sharded (a gathered
        copy of the policy that would not fit: rloo.algorithms.base.OnlineRLModule.decide_rollout_gather)."""
        note = getattr(self.pieces.module, "sampler_note", None)
        return self.pieces.paths | ({"sampler": note} if note else {})

    def write_before_fit(self, status: str, during: str) -> None:
        """summary.json before the trainer runs: the status and where it stopped, over what an earlier session of the
        run (a resume) recorded."""
        from rloo.run.cli import further_rank
        from rloo.utils import atomic

        if further_rank():
            return
        path = self.plan.out / "summary.json"
        try:
            previous = json.loads(path.read_text())
        except (OSError, ValueError):
            previous = {}
        summary = (previous if isinstance(previous, dict) else {}) | {
            "status": status,
            "stopped_during": during,
            "rollouts": self.plan.resumed_rollouts,
            "algorithm": self.plan.cfg.algorithm,
            "wall_seconds": round(time.time() - self.plan.started, 2),
            "output_dir": str(self.plan.out),
        }
        atomic.write_text(path, json.dumps(summary, indent=2), "the run summary")

    def write(self, status: str) -> dict:
        from rloo.run.plots import write_curves
        from rloo.utils import atomic

        summary = self.summary(status)
        if self.pieces.trainer.is_global_zero:
            if status != "evaluating":  # the learning curves as the run ends, a failed one's up to where it got
                summary["curves"] = write_curves(self.plan.out, self.plan.log)
            atomic.write_text(self.plan.out / "summary.json", json.dumps(summary, indent=2), "the run summary")
        return summary


def fit(plan: RunPlan, pieces: RunPieces, record: RunRecord) -> dict:
    """trainer.fit inside the failure handling: whatever stops it (SIGTERM, Ctrl-C, a failure, a full disk) leaves
    summary.json saying so and exits non-zero; a run is "finished" only with policy/ and its final evaluation."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from rloo.rewards.user_code import Interrupted as UserCodeInterrupted
    from rloo.run.stops import ctrl_c_held
    from rloo.utils.resume import finish_ended_training

    trainer, module, out, log = pieces.trainer, pieces.module, plan.out, plan.log
    record.fit_started = time.time()
    try:
        trainer.fit(
            module,
            datamodule=pieces.datamodule,
            ckpt_path=plan.resume_point.checkpoint if plan.resume_point else None,
            weights_only=True,  # tensors and plain values only: a planted pickle is refused, never run
        )
        if not pieces.export.ran and module.state.rollouts >= plan.rollouts:  # resumed after training had ended:
            finish_ended_training(out, trainer, module, pieces.export, pieces.evaluation, log)  # no end hooks ran
    except BaseException as error:  # SIGTERM, Ctrl-C (exit 130 in run_entry_point), any failure: keep what there is
        if hasattr(module, "close_producer"):
            module.close_producer()  # a producer process beside the learner stops with it
        interrupted = isinstance(error, (SystemExit, KeyboardInterrupt, UserCodeInterrupted))
        with (
            ctrl_c_held()
        ):  # (rloo.run.stops)  # a second Ctrl-C does not cut the summary or the line that says how to continue
            try:
                record.write("interrupted" if interrupted else "failed")
            except WriteError as write_error:  # the first failure is the one to raise
                log(f"error: {write_error}")
            if stopped_by_ctrl_c(error) and trainer.is_global_zero:
                log(stop_line("Ctrl-C", plan, module))
        lost = collective_failure(error) if trainer.world_size > 1 else None  # what a rank that is gone left
        if isinstance(error, (SIGTERMException, UserCodeInterrupted)) or (trainer.received_sigterm and lost):
            stopped_by_sigterm(plan, module)  # (a rank whose peers stopped on the SIGTERM too)
        if trainer.world_size > 1:
            stop_other_ranks(trainer, log)
        if lost:
            raise RankLost(
                f"a process of this {trainer.world_size}-process run died or hung (rank {trainer.global_rank} saw: "
                f"{lost}); checkpoints already there are whole: {checkpoint_names(out) or 'none'}; "
                "resume=auto continues from the newest"
            ) from None
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise WriteError(
                f"could not write {error.filename or 'a checkpoint'} in {out}: {error.strerror}; "
                f"checkpoints already there are whole: {checkpoint_names(out) or 'none'}"
            ) from None
        raise
    return finish(plan, pieces, record)


def finish(plan: RunPlan, pieces: RunPieces, record: RunRecord) -> dict:
    """After fit: a SIGTERM during the final evaluation, a judge that failed it, or a missing policy/ or final
    evaluation end the run as interrupted or failed; else summary.json says finished."""
    trainer, module, evaluation, out = pieces.trainer, pieces.module, pieces.evaluation, plan.out
    if trainer.received_sigterm:  # it came after training, during the final evaluation
        record.write("interrupted")
        stopped_by_sigterm(plan, module)
    if evaluation.judge_failure and evaluation.final is not None:  # no win rate to report, nor to rank by
        record.write("failed")
        raise JudgeFailed(
            f"{evaluation.judge_failure}; policy/ and checkpoints are saved, summary.json has no win rate"
        )
    missing = [
        what
        for what, absent in (
            # by its writer: another rank may finish before rank 0 has written it, or not see its node's disk
            ("policy/", trainer.is_global_zero and not (out / "policy").is_dir()),
            ("the final evaluation", plan.cfg.eval.after and evaluation.final is None),
        )
        if absent
    ]
    if missing:  # never "finished" without them
        record.write("failed")
        raise RunIncomplete(f"the run trained {module.state.rollouts} rollouts but has no {' and no '.join(missing)}")
    if trainer.is_global_zero:  # the card before "finished": a run that says finished has it
        from rloo.run.model_card import model_card
        from rloo.utils import atomic

        card = model_card(plan.cfg, record.summary("finished"))
        atomic.write_text(out / "policy" / "README.md", card, "the model card")
    summary = record.write("finished")
    if trainer.is_global_zero:
        print_summary(summary, plan.log)
    return summary


def compare_with_resumed_run(cfg: DictConfig, out: Path, log) -> None:
    """Refuse a resume whose settings cannot continue the run (one line, before any checkpoint is read); say which
    changed settings take effect."""
    from rloo.config.schema import compare_configs
    from rloo.utils.resume import run_dir_of

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


def checkpoint_callbacks(cfg: DictConfig, out: Path) -> list:
    """Checkpoints every checkpoint_every rollouts and every checkpoint_minutes (the newest keep_checkpoints kept,
    last.ckpt the newest), at the end of training, and on SIGTERM, Ctrl-C or an error (interrupted.ckpt)."""
    from rloo.run.callbacks import InterruptedCheckpoint, RolloutCheckpoints

    directory = out / "checkpoints"
    return [
        RolloutCheckpoints(directory, cfg.checkpoint_every, cfg.checkpoint_minutes, cfg.keep_checkpoints),
        InterruptedCheckpoint(directory),
    ]


def print_summary(summary: dict, log=print) -> None:
    log(
        f"\nrloo: {summary['rollouts']} rollouts ({summary['optimizer_steps']} optimiser steps), "
        f"{summary['episodes']} episodes"
        f" in {summary['wall_seconds']:.0f} s"
    )
    curves = "" if "not drawn" in summary.get("curves", "not drawn") else "curves.png, "
    log(f"  outputs: {summary['output_dir']}  (summary.json, {curves}policy/, checkpoints/, config.yaml, logs)")
    initial, final = summary["initial"] or {}, summary["final"] or {}

    def shown(evaluation: dict, key: str) -> str:
        if key not in evaluation:
            return "-"
        if f"{key}_ci_low" in evaluation:  # the win rate and reward functions' means carry a 95% interval
            low, high = evaluation[f"{key}_ci_low"], evaluation[f"{key}_ci_high"]
            return f"{evaluation[key]:.3f} [{low:.3f}, {high:.3f}]"
        return f"{evaluation[key]:.3f}"

    rewards = [key for key in final if key.startswith("eval/reward/") and not key.endswith(("_ci_low", "_ci_high"))]
    verifiable = [k for k in final if k.startswith(("eval/accuracy", "eval/pass@", "eval/majority_vote"))]
    verifiable = [k for k in verifiable if not k.endswith(("_ci_low", "_ci_high"))]
    episodes = ("eval/replied", "eval/turns")  # multi-turn runs: how often the environment replied, turns taken
    for key in ("eval/win_rate", *rewards, *verifiable, *episodes, "eval/score", "eval/mean_length"):
        if key in final:
            log(f"  {key:<17} {shown(initial, key)} -> {shown(final, key)}")
