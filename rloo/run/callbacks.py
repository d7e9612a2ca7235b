"""Lightning callbacks: held-out evaluation (before, every `eval_every` rollouts, after), a table of rollout samples,
and the mismatch histograms. Each counts rollouts (`module.state.rollouts`), the x-axis of every logged metric."""

from __future__ import annotations

import json
import shutil
import time
from datetime import timedelta
from pathlib import Path

import torch
from lightning import Callback
from lightning.pytorch.callbacks import Checkpoint

from rloo.evaluation.heldout import evaluate_policy, finite_or_none, summarize_eval
from rloo.generation.settings import SamplingConfig
from rloo.judges import Judge
from rloo.models.lora import has_adapters, merged_copy
from rloo.models.sharding import gather_ranks, weights_partitioned, whole_copy
from rloo.rewards.user_code import Interrupted
from rloo.utils import atomic
from rloo.utils.errors import NonFiniteError, collective_failure

MAX_INVALID_FRACTION = 0.5  # an evaluation whose judge failed for more of its pairs reports no win rate


class HeldOutEval(Callback):
    """Evaluates the policy on fixed held-out prompts (greedy by default): before training, every `every` rollouts,
    and after training. Logs eval/* (win rate with its 95% interval, counts, score, length), a W&B table of the
    judged samples, and appends those samples to `samples_path` (JSONL)."""

    def __init__(
        self,
        rows: list[dict],
        sampling: SamplingConfig,
        batch_size: int,
        judge: Judge | None,
        before: bool,
        after: bool,
        every: int,
        samples_path: Path | None,
        table_rows: int = 64,
        log=print,
        judge_timeout_s: float = 0,
        verifiable=None,
    ):
        self.rows, self.sampling, self.batch_size, self.judge = rows, sampling, batch_size, judge
        self.before, self.after, self.every, self.log_fn = before, after, every, log
        self.samples_path, self.table_rows, self.judge_timeout_s = samples_path, table_rows, judge_timeout_s
        self.verifiable = verifiable  # rloo.evaluation.heldout.VerifiableEval: pass@k and majority vote, or None
        self.initial: dict[str, float] | None = None
        self.final: dict[str, float] | None = None
        self.history: list[dict] = []  # {"step", **summary} of every evaluation, in order
        self.judge_failure: str | None = None  # of the latest evaluation (failed_judgements)

    def run(self, trainer, module) -> tuple[dict[str, float], list[dict]]:
        started = time.perf_counter()
        rank, world = trainer.global_rank, trainer.world_size
        shard = self.rows[rank::world]
        real = len(shard)
        if weights_partitioned(module.policy) and world > 1:
            # every decode step gathers weights, a collective: every rank completes as many rows, repeating one
            shard = shard + [self.rows[0]] * (-(-len(self.rows) // world) - real)
        if self.judge is not None:
            self.judge.setup(module.device)
        # a sampled evaluation draws from its own copy of the random state: training draws the same with or without it
        devices = [module.device.index or 0] if module.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), trainer.precision_plugin.forward_context():
            per_row, samples = evaluate_policy(
                module.policy,
                module.tokenizer,
                shard,
                self.sampling,
                self.batch_size,
                self.judge,
                module.reward_model,
                module.device,
                reward=module.reward,
                judge_timeout_s=self.judge_timeout_s,
                should_stop=lambda: trainer.received_sigterm,
                verifiable=self.verifiable,
                environment=module.environment,
            )
        per_row, samples = {k: v[:real] for k, v in per_row.items()}, samples[:real]
        if world > 1:  # shards differ by at most one row: pad with nan, gather, keep the rows that exist
            size = -(-len(self.rows) // world)
            per_row = {
                k: torch.nn.functional.pad(v, (0, size - len(v)), value=float("nan")) for k, v in per_row.items()
            }
            gathered = {k: gather_ranks(v).flatten() for k, v in per_row.items()}
            keep = ~torch.isnan(gathered["length"])
            per_row = {k: v[keep] for k, v in gathered.items()}
        summary = summarize_eval(per_row)
        summary["eval/seconds"] = time.perf_counter() - started
        return summary, samples

    def evaluate(self, trainer, module, label: str) -> dict[str, float] | None:
        if trainer.received_sigterm:  # the scheduler wants the process gone: no new evaluation
            self.log_fn(f"eval ({label}) skipped: SIGTERM received")
            return None
        if module.reward is not None:
            module.reward.last_errors = []  # what the evaluation's reward functions say under reward_errors=mask
            module.reward.trainer_state = module.trainer_state()  # TRL's trainer_state, the initial evaluation's too
        summary, samples = self.run(trainer, module)
        step = module.state.rollouts
        if nonfinite := summary.get("eval/score_nonfinite"):
            self.log_fn(
                f"eval ({label}): the reward model scored {nonfinite} of {nonfinite + summary['eval/score_rows']} "
                "completions non-finite (nan or inf): left out of eval/score"
            )
        for key in [k for k in summary if k.startswith("eval/reward/") and k.endswith("_failed")]:
            name = key.removeprefix("eval/").removesuffix("_failed")
            self.log_fn(
                f"eval ({label}): {name} failed on {summary[key]} completions, left out of eval/{name} "
                f"(reward_errors=mask): {'; '.join(dict.fromkeys(module.reward.last_errors))}"
            )
        if invalid := summary.get("eval/invalid"):
            self.log_fn(f"eval ({label}): {invalid} pairs judged invalid, left out of the win rate (eval/invalid)")
        self.judge_failure = self.failed_judgements(summary)
        if self.judge_failure:
            self.log_fn(f"eval ({label}): {self.judge_failure}")
            for key in [k for k in summary if k.startswith("eval/win_rate")]:
                del summary[key]  # a rate over the few pairs that got a verdict is no win rate
        # where the run stood: the x-axes of learning curves (rloo.report), episodes and seconds of training
        self.history.append(
            {
                "step": step,
                "episodes": module.state.episodes,
                "sampled": module.state.sampled,
                "train_seconds": round(module.state.train_seconds, 2),
                **summary,
            }
        )
        for logger in trainer.loggers:
            logger.log_metrics(summary, step=step)
            logger.save()  # on disk before the rollout's checkpoint, which follows: a kill after it loses no row
        if not trainer.is_global_zero:
            return summary
        shown = ", ".join(
            f"{k.split('/', 1)[1]} {v:.3f}"
            for k, v in summary.items()
            if k.split("/")[1] in SHOWN or (k.startswith("eval/reward/") and not k.endswith(("_ci_low", "_ci_high")))
        )
        self.log_fn(f"eval ({label}, step {step}, {len(self.rows)} held-out prompts): {shown}")
        rows = [{"step": step, **s} for s in samples]
        if rows:
            columns = list(rows[0])
            for logger in trainer.loggers:
                if hasattr(logger, "log_table"):
                    logger.log_table(
                        "eval/samples",
                        columns=columns,
                        data=[[r[c] for c in columns] for r in rows[: self.table_rows]],
                        step=step,
                    )
        if self.samples_path is not None:
            with Path(self.samples_path).open("a") as f:
                f.writelines(json.dumps(r, allow_nan=False) + "\n" for r in rows)  # strict JSON: no bare NaN
        return summary

    def failed_judgements(self, summary: dict) -> str | None:
        """Said when the judge gave no verdict for more than half of the pairs (an outage, a bad key)."""
        invalid, judged = summary.get("eval/invalid", 0), summary.get("eval/num_judged", 0)
        if self.judge is None or invalid <= (invalid + judged) * MAX_INVALID_FRACTION:
            return None
        return f"the judge {self.judge!r} gave no verdict for {invalid} of {invalid + judged} pairs"

    def state_dict(self) -> dict:  # in checkpoints: a resumed run keeps its evaluations and does not redo the first
        return {"initial": self.initial, "history": self.history}

    def load_state_dict(self, state_dict: dict) -> None:
        self.initial, self.history = state_dict["initial"], state_dict["history"]

    def on_train_start(self, trainer, module) -> None:
        if self.before and self.initial is None and module.state.rollouts == 0:
            self.initial = self.evaluate(trainer, module, "initial policy")

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        step = module.state.rollouts
        if self.every > 0 and step % self.every == 0 and step < module.config.total_rollouts:
            self.evaluate(trainer, module, "during training")

    def on_train_end(self, trainer, module) -> None:
        if self.after:
            self.final = self.evaluate(trainer, module, "final policy")


class ProgressLines(Callback):
    """Where stdout is not a terminal (a log file, a cluster job's output), one line every `every` rollouts and at
    the last, instead of a progress bar that such a file shows as nothing, or as escape codes:
    `rollout 12/40 episodes 768 score 0.512 kl 0.0131 clipfrac 0.000 2.9 s/rollout 35 s`."""

    SHOWN = (
        ("score", "objective/scores", ".3f"),
        ("kl", "objective/kl", ".4f"),
        ("clipfrac", "policy/clipfrac_avg", ".3f"),
    )

    def __init__(self, every: int, log):
        self.every, self.say, self.started = every, log, time.monotonic()
        self.rollouts_then = 0

    def on_train_start(self, trainer, module) -> None:
        self.started, self.rollouts_then = time.monotonic(), module.state.rollouts

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        rollouts, total = module.state.rollouts, module.config.total_rollouts
        if not trainer.is_global_zero or not (rollouts % self.every == 0 or rollouts == total):
            return
        row, seconds = getattr(module, "last_metrics", {}), time.monotonic() - self.started
        shown = [f"{name} {float(row[key]):{spec}}" for name, key, spec in self.SHOWN if key in row]
        per = seconds / max(rollouts - self.rollouts_then, 1)
        self.say(
            f"rollout {rollouts}/{total} episodes {module.state.episodes} {' '.join(shown)} {per:.1f} s/rollout "
            f"{seconds:.0f} s"
        )


class RanksAgree(Callback):
    """Data parallel: after every rollout, every rank must hold the same policy. A per-tensor checksum (float64 sums)
    is gathered from all ranks; any difference stops the run, naming the first tensor that differs. Bit-equal
    gradients after the all-reduce and the same AdamW step give bit-equal weights, so the tolerance is zero."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.world_size < 2 or weights_partitioned(module.policy):  # sharded: each rank holds its own part
            return
        names, params = zip(*[(n, p) for n, p in module.policy.named_parameters() if p.requires_grad])
        sums = torch.stack([p.detach().double().sum() for p in params])  # [P]
        gathered = gather_ranks(sums)  # [world, P]
        differ = (gathered != gathered[0]).any(0)
        if bool(differ.any()):
            raise RuntimeError(
                f"data parallel ranks hold different weights after rollout {module.state.rollouts} "
                f"({int(differ.sum())} tensors, e.g. {names[int(differ.nonzero()[0])]})"
            )


class RolloutCheckpoints(Callback):
    """`step<optimiser steps>.ckpt` every `every` rollouts, after a rollout that ends `minutes` or more after the last
    checkpoint, and after the last rollout; the newest `keep` kept (-1: all), `last.ckpt` pointing at the newest.

    Written as a rollout ends, after its metrics (the step writes them) and after the callbacks listed before this
    one (an evaluation at that rollout is in the checkpoint): a run killed after it loses nothing it resumes.
    """

    def __init__(self, directory: Path, every: int, minutes: float, keep: int):
        self.directory, self.every, self.seconds, self.keep = Path(directory), every, minutes * 60, keep
        self.last_time = time.monotonic()

    def due(self, rollouts: int, total: int) -> bool:
        periodic = self.every > 0 and rollouts % self.every == 0
        timed = self.seconds > 0 and time.monotonic() - self.last_time >= self.seconds
        return periodic or timed or rollouts == total

    def save(self, trainer, module) -> None:
        name = f"step{trainer.global_step}.ckpt" if self.keep != 0 else "last.ckpt"
        trainer.save_checkpoint(self.directory / name, weights_only=False)  # the optimiser and loops too
        self.last_time = time.monotonic()
        if trainer.is_global_zero and self.keep != 0:
            atomic.symlink(name, self.directory / "last.ckpt")
            steps = sorted(
                self.directory.glob("step*.ckpt"), key=lambda p: int(p.stem[4:]) if p.stem[4:].isdigit() else -1
            )
            for old in steps[: -self.keep] if self.keep > 0 else ():
                shutil.rmtree(old) if old.is_dir() else old.unlink(missing_ok=True)  # DeepSpeed: a dir per checkpoint

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if self.due(module.state.rollouts, module.config.total_rollouts):
            self.save(trainer, module)


class CollectiveTimeout(Callback):
    """Two bounds on waiting for other ranks. At start-up every rank loads its models before it joins the process
    group, which takes minutes on a loaded machine: the strategy's timeout is trainer.startup_timeout_s. Once the
    fit starts, every rank has joined and the strategy has made its groups (FSDP2's mesh): each group then takes
    trainer.collective_timeout_s, the bound on a rank that hangs mid-run (torch's own setter of a group's timeout,
    gloo and NCCL alike)."""

    def __init__(self, seconds: float):
        self.timeout = timedelta(seconds=float(seconds))

    def on_fit_start(self, trainer, module) -> None:
        from torch.distributed import distributed_c10d

        if trainer.world_size < 2 or not torch.distributed.is_initialized():
            return
        mesh = getattr(module, "device_mesh", None)  # FSDP2's data-parallel mesh, where it has one
        groups = [None] + ([mesh.get_group(name) for name in mesh.mesh_dim_names or ()] if mesh is not None else [])
        for group in groups:
            distributed_c10d._set_pg_timeout(self.timeout, group)


class SigtermBetweenRollouts(Callback):
    """Several processes: SIGTERM marks the run as stopping and reaches every rank Lightning launched, and nothing
    more happens inside the handler. Lightning's own handler also broadcasts from inside the signal handler, a
    collective at whatever point the rank stands: where another rank waits in a different collective, both wait
    until the collective timeout. The ranks agree where they all meet: Lightning broadcasts the first rank's mark as
    each rollout starts, and each rank stops at the end of the rollout it is in.

    Under SLURM, its pre-kill signal (rloo.run.preemption) marks the run the same way, on any number of processes,
    and `preempted` says the stop was a preemption: the first rank then requeues the job."""

    def __init__(self):
        self.preempted = False
        self.previous_requeue_handler = None

    def on_train_start(self, trainer, module) -> None:
        import signal
        import threading

        from rloo.run.preemption import on_slurm, watch_requeue_signal

        if threading.current_thread() is not threading.main_thread():
            return
        connector = trainer._signal_connector  # what trainer.received_sigterm reads (Lightning has no setter)
        if on_slurm():

            def on_requeue_signal() -> None:
                self.preempted = True
                connector.received_sigterm = True

            self.previous_requeue_handler = watch_requeue_signal(on_requeue_signal)
        if trainer.world_size < 2:
            return

        def on_sigterm(signum, frame) -> None:
            if not connector.received_sigterm and trainer.strategy.launcher is not None:
                trainer.strategy.launcher.kill(signum)  # the ranks this one launched
            connector.received_sigterm = True

        signal.signal(signal.SIGTERM, on_sigterm)  # Lightning restores the previous handler when fit ends

    def teardown(self, trainer, module, stage: str) -> None:
        import signal

        from rloo.run.preemption import REQUEUE_SIGNAL

        if self.previous_requeue_handler is not None:
            signal.signal(REQUEUE_SIGNAL, self.previous_requeue_handler)
            self.previous_requeue_handler = None


class InterruptedCheckpoint(Checkpoint):
    """`interrupted.ckpt` when SIGTERM, Ctrl-C or an error stops training, removed when a fit ends normally.
    Lightning's OnExceptionCheckpoint does the same, but its presence turns `fit(ckpt_path=None)` into "last" with
    two warnings on every fresh run; the resume point is rloo's own choice (rloo.utils.resume). A Checkpoint, so that
    Lightning adds no ModelCheckpoint of its own."""

    def __init__(self, directory: Path):
        self.path = Path(directory) / "interrupted.ckpt"

    def on_exception(self, trainer, module, exception) -> None:
        if trainer.world_size > 1 and (collective_failure(exception) or isinstance(exception, Interrupted)):
            return  # a rank is gone, or this one stopped inside user code mid-rollout: the ranks cannot gather one
        trainer.save_checkpoint(self.path, weights_only=False)  # the optimiser and loops too, as every checkpoint

    def teardown(self, trainer, module, stage: str) -> None:
        trainer.strategy.remove_checkpoint(self.path)


class ExportPolicy(Callback):
    """At the end of training, before the final evaluation: the policy and tokenizer to `directory`
    (save_pretrained, atomically), then `exported()` (rloo.train writes the summary so far)."""

    def __init__(self, directory: Path, exported):
        self.directory, self.exported = Path(directory), exported
        self.ran = False  # whether on_train_end came in this process (Lightning skips it when resumed at the end)

    def on_train_end(self, trainer, module) -> None:
        self.ran = True
        policy = module.policy
        if weights_partitioned(policy):  # FSDP2, ZeRO-3: the whole weights gathered into a plain copy on rank 0
            policy = whole_copy(policy)
        bad = (
            [name for name, p in policy.named_parameters() if not torch.isfinite(p).all()]
            if trainer.is_global_zero
            else None
        )
        bad = trainer.strategy.broadcast(bad)  # rank 0's finding: every rank raises, or none does
        if bad:
            raise NonFiniteError(
                f"the trained policy has non-finite weights ({len(bad)} tensors, e.g. {bad[0]}); not exported"
            )
        if trainer.is_global_zero:  # LoRA: the adapters merged into a plain copy, which loads without peft
            policy = merged_copy(policy) if has_adapters(policy) else policy
            atomic.save_pretrained(policy, module.tokenizer, self.directory, "the trained policy")
            self.exported()


SHOWN = (
    "win_rate",
    "win_rate_ci_low",
    "win_rate_ci_high",
    "invalid",
    "score",
    "mean_length",
    "accuracy",
    "pass@1",
    "replied",
    "turns",
)


class SampleTable(Callback):
    """Every `every` rollouts: a few rollout completions with score and advantage, to W&B and samples.jsonl."""

    def __init__(self, every: int, num_rows: int, path: Path):
        self.every, self.num_rows, self.path = every, num_rows, Path(path)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        step = module.state.rollouts
        rollout = module.last_rollout
        if self.every <= 0 or rollout is None or step % self.every != 0 or not trainer.is_global_zero:
            return
        if module.last_targets is None:  # a rollout the guard skipped: nothing was derived from it
            return
        tokenizer = module.tokenizer
        n = min(self.num_rows, rollout.scores.shape[0])
        prompts = tokenizer.batch_decode(rollout.prompt_ids[:n], skip_special_tokens=True)
        completions = tokenizer.batch_decode(rollout.completion_ids[:n], skip_special_tokens=True)
        advantages = module.last_targets.sequence_advantages(rollout.completion_mask)[:n]
        rows = [
            [step, p, c, finite_or_none(s), finite_or_none(a)]  # a masked score is null, as strict JSON has no NaN
            for p, c, s, a in zip(prompts, completions, rollout.scores[:n].tolist(), advantages.tolist())
        ]
        columns = ["step", "prompt", "completion", "score", "advantage"]
        for name, values in module.last_notes.reward_columns.items():  # the reward functions' log_extra
            if len(values) >= n and name not in columns:
                columns.append(name)
                rows = [row + [finite_or_none(v) if isinstance(v, float) else v] for row, v in zip(rows, values[:n])]
        for logger in trainer.loggers:
            if hasattr(logger, "log_table"):
                logger.log_table("samples", columns=columns, data=rows, step=step)
        with self.path.open("a") as f:
            for row in rows:
                f.write(json.dumps(dict(zip(columns, row)), allow_nan=False, default=str) + "\n")


class MismatchHistograms(Callback):
    """With log_histograms: W&B histograms of the per-token delta logp (training forward - sampler) and of the
    sequence log-ratio, every `every` rollouts. Other loggers have no histogram type and are skipped."""

    def __init__(self, every: int):
        self.every = every

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        step = module.state.rollouts
        kept = getattr(module, "last_mismatch", None)
        if not kept or step % self.every != 0 or not trainer.is_global_zero:
            return
        from lightning.pytorch.loggers import WandbLogger

        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                import wandb

                logger.experiment.log(
                    {f"mismatch/{name}_hist": wandb.Histogram(values.numpy()) for name, values in kept.items()}
                    | {"trainer/global_step": step}
                )
