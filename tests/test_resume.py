"""Exact resume: a run killed with SIGKILL and resumed ends bit-identical to one that was never interrupted;
what may and may not change on resume; which checkpoint is picked; unique run dirs; logs that append."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file

from rloo.config.schema import compare_configs
from rloo.data.prompts import EpisodeSampler
from rloo.run.loggers import drop_rows_after
from rloo.run.resolvers import unique_dir
from rloo.utils.errors import ConfigError
from rloo.utils.resume import find_resume_point, restore_rng_states, rng_states
from tests.e2e import FAST, ROOT, train, train_error
from tests.test_interrupt import finish, start, wait_for

# 12 rollouts of 8 completions, a checkpoint each and an evaluation every 4 (its history must survive the kill too)
RUN = ["total_episodes=96", "checkpoint_every=1", "keep_checkpoints=-1", "eval_every=4", "lr=3e-3", "logger=csv"]
MEASURED = ("time/", "eval/seconds", "memory/", "eps")  # seconds, memory, episodes per second: the machine's


def metric_rows(run_dir):
    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        return [{k: v for k, v in row.items() if not k.startswith(MEASURED)} for row in csv.DictReader(f)]


@pytest.mark.slow
def test_a_run_killed_with_sigkill_and_resumed_ends_bit_identical_to_an_uninterrupted_one(finished_run):
    base, _ = finished_run
    straight = train(base / "straight", base / "cache", *RUN)
    assert straight.returncode == 0, straight.stderr[-3000:]

    killed = base / "killed"
    process = start(killed, base / "cache", *RUN[:-1])
    wait_for(lambda: (killed / "checkpoints" / "step5.ckpt").exists(), process)
    process.send_signal(signal.SIGKILL)
    returncode, _ = finish(process)
    assert returncode == -signal.SIGKILL
    assert not (killed / "policy").exists()  # it really died before the end

    # as a requeued job would: same dir, auto, and no setting repeated: the run's own overrides are its settings
    resumed = train(killed, base / "cache", "resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resume: from" in resumed.stdout + resumed.stderr
    assert f"rloo: resume: {killed}'s own settings first: " in resumed.stderr
    assert "resume" not in (killed / ".hydra" / "overrides.yaml").read_text()  # the first run's record is kept
    assert len(list((killed / ".hydra").glob("resumed-*/overrides.yaml"))) == 1

    a, b = (
        load_file(base / "straight" / "policy" / "model.safetensors"),
        load_file(killed / "policy" / "model.safetensors"),
    )
    initial = torch.load(killed / "checkpoints" / "step1.ckpt", weights_only=True)["state_dict"]
    common = [k for k in a if f"policy.{k}" in initial]
    assert len(common) > 10 and any(not torch.equal(a[k], initial[f"policy.{k}"]) for k in common)  # it trained
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert metric_rows(base / "straight") == metric_rows(killed)  # rows of the redone rollouts moved aside
    straight_summary = OmegaConf.load(base / "straight" / "summary.json")
    resumed_summary = OmegaConf.load(killed / "summary.json")
    for key in ("rollouts", "optimizer_steps", "episodes"):
        assert straight_summary[key] == resumed_summary[key]

    def drop(history):  # seconds: the machine's
        return [{k: v for k, v in e.items() if k not in ("eval/seconds", "train_seconds")} for e in history]

    assert drop(straight_summary.eval_history) == drop(resumed_summary.eval_history)
    assert [e["step"] for e in straight_summary.eval_history] == [0, 4, 8, 12]  # before, at 4 and 8, after


@pytest.mark.slow
def test_a_run_killed_after_training_exports_and_evaluates_when_resumed_and_a_finished_one_is_left_alone(
    finished_run,
):
    """What a SIGKILL during the policy export leaves: every rollout trained and checkpointed, no policy/, no final
    evaluation (and no summary). The resume does both and only then says finished; a requeue changes nothing."""
    base, _ = finished_run
    run = base / "killed-at-export"
    first = train(run, base / "cache", "logger=csv")
    assert first.returncode == 0, first.stderr[-3000:]
    shutil.rmtree(run / "policy")
    (run / "summary.json").unlink()

    resumed = train(run, base / "cache", "logger=csv", "resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    output = resumed.stdout + resumed.stderr
    assert "exporting the policy now" in output and "running it now" in output
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["final"]["eval/win_rate"] is not None
    assert (run / "policy" / "model.safetensors").exists()

    before = (run / "summary.json").read_bytes(), (run / "policy" / "model.safetensors").stat().st_mtime_ns
    again = train(run, base / "cache", "logger=csv", "resume=auto")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "has finished" in again.stdout + again.stderr and "unchanged" in again.stdout + again.stderr
    after = (run / "summary.json").read_bytes(), (run / "policy" / "model.safetensors").stat().st_mtime_ns
    assert after == before


def test_resume_refuses_a_changed_k_in_one_line_before_loading(embedded_task, tmp_path):
    """A run dir whose config.yaml says k=2 (as a run writes it), resumed with k=4: refused before anything loads."""
    from omegaconf import OmegaConf

    from rloo.run.cli import compose_train_config

    base, previous = embedded_task, tmp_path / "previous"
    (previous / "checkpoints").mkdir(parents=True)
    (previous / "config.yaml").write_text(OmegaConf.to_yaml(compose_train_config(["debug=fast"]), resolve=False))
    error = train_error(base / "other", base / "cache", "k=4", f"resume={previous}")
    assert error.startswith("error: resume=") and "k: 2 -> 4" in error


@pytest.mark.slow
def test_resume_applies_a_changed_lr_and_says_so(finished_run):
    base, _ = finished_run
    run = base / "lr-change"
    first = train(run, base / "cache", "logger=csv", "total_episodes=32")
    assert first.returncode == 0, first.stderr[-3000:]
    # keep_checkpoints=3: the newest three of four, last.ckpt pointing at the newest
    assert sorted(p.name for p in (run / "checkpoints").glob("step*.ckpt")) == [
        "step2.ckpt",
        "step3.ckpt",
        "step4.ckpt",
    ]
    assert os.readlink(run / "checkpoints" / "last.ckpt") == "step4.ckpt"
    # no hydra.run.dir: resuming a checkpoint of a run dir continues in that dir
    env = {**os.environ, "RLOO_CACHE_DIR": str(base / "cache"), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "rloo.train",
            *FAST,
            "logger=csv",
            "total_episodes=48",
            "lr=1e-3",
            f"resume={run / 'checkpoints' / 'step2.ckpt'}",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    output = again.stdout + again.stderr
    assert "resume: lr: 0.0003 -> 0.001" in output and "total_episodes: 32 -> 48" in output
    assert f"writing to {run}" in output
    with open(run / "csv" / "metrics.csv", newline="") as f:
        lrs = {float(r["train/rollout"]): float(r["lr"]) for r in csv.DictReader(f) if r["lr"]}
    assert sorted(lrs) == [1, 2, 3, 4, 5, 6]  # rollouts 1-2 kept, 3-4 of the first run superseded, then 3-6
    assert lrs[3] > lrs[2]  # the larger peak, on the new horizon's linear decay: 1e-3 * (1 - 3/6)
    assert lrs[3] == pytest.approx(1e-3 * 0.5, rel=1e-6)
    assert (run / "csv" / "metrics.superseded.csv").exists()


@pytest.mark.slow
def test_resume_auto_starts_fresh_in_an_empty_run_dir_and_a_bad_resume_is_one_line(finished_run):
    base, _ = finished_run
    result = train(base / "auto", base / "cache", "resume=auto", "total_episodes=16")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "starting from the beginning" in result.stdout + result.stderr
    assert "does not exist" in train_error(base / "x", base / "cache", f"resume={base / 'nowhere'}")


# ---- the pieces --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("size, total", [(7, 30), (5, 5), (10, 23)])
def test_the_sampler_started_at_s_yields_the_rest_of_the_uninterrupted_stream(size, total):
    full = list(EpisodeSampler(size, total, seed=3))
    assert len(full) == total
    for first in range(total + 1):
        assert list(EpisodeSampler(size, total, seed=3, start=first)) == full[first:]


@pytest.mark.parametrize("world", [2, 3])
def test_each_rank_takes_every_world_th_index_of_the_stream_also_when_resumed(world):
    size, per_rollout, rollouts = 7, 4 * world, 5  # 4 prompts per rank and rollout
    full = list(EpisodeSampler(size, rollouts * per_rollout, seed=3))
    for first_rollout in range(rollouts):
        start = first_rollout * per_rollout
        shares = [
            list(EpisodeSampler(size, rollouts * per_rollout, seed=3, start=start, rank=r, world=world))
            for r in range(world)
        ]
        assert [share == full[start + r :: world] for r, share in enumerate(shares)] == [True] * world
        # each rank's rollout batches: 4 prompts apiece, the ranks together one rollout of the stream
        for rollout in range(rollouts - first_rollout):
            batches = [share[4 * rollout : 4 * rollout + 4] for share in shares]
            assert sorted(sum(batches, [])) == sorted(
                full[start + rollout * per_rollout : start + (rollout + 1) * per_rollout]
            )


def save_checkpoint(path, rollouts, steps):
    torch.save({"rloo_rollouts": rollouts, "global_step": steps, "state_dict": {}}, path)


def test_the_last_whole_checkpoint_is_picked_truncated_and_mid_rollout_ones_skipped(tmp_path):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    save_checkpoint(directory / "step8.ckpt", rollouts=2, steps=8)  # 4 updates per rollout: whole
    save_checkpoint(directory / "step12.ckpt", rollouts=3, steps=12)
    save_checkpoint(directory / "interrupted.ckpt", rollouts=3, steps=14)  # Ctrl-C between the updates of rollout 4
    save_checkpoint(directory / "step16.ckpt", rollouts=4, steps=16)
    data = (directory / "step16.ckpt").read_bytes()
    (directory / "step16.ckpt").write_bytes(data[: len(data) // 2])  # killed while writing (without rloo.utils.atomic)
    skipped = []
    point = find_resume_point(str(tmp_path), tmp_path, updates_per_rollout=4, log=skipped.append)
    assert point.checkpoint == directory / "step12.ckpt" and point.run_dir == tmp_path
    assert any("interrupted.ckpt" in line and "inside rollout 4" in line for line in skipped)
    assert any("step16.ckpt" in line and "does not load" in line for line in skipped)
    with pytest.raises(ConfigError, match="inside rollout 4"):
        find_resume_point(str(directory / "interrupted.ckpt"), tmp_path, updates_per_rollout=4)
    assert find_resume_point("auto", tmp_path / "fresh", updates_per_rollout=4, log=skipped.append) is None


class Payload:
    """What a planted checkpoint carries: unpickling it would create the file `marker` (a stand-in for any code)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_planted_pickle_is_refused_without_running_it(tmp_path):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    save_checkpoint(directory / "step8.ckpt", rollouts=2, steps=8)
    marker = tmp_path / "payload-ran"
    torch.save({"rloo_rollouts": 99, "global_step": 396, "payload": Payload(marker)}, directory / "step99.ckpt")
    skipped = []
    point = find_resume_point("auto", tmp_path, updates_per_rollout=4, log=skipped.append)
    assert point.checkpoint == directory / "step8.ckpt"
    assert skipped == [
        "resume: skipping step99.ckpt: it holds io.open, which no run writes: refused without loading it"
    ]
    with pytest.raises(ConfigError, match="which no run writes"):
        find_resume_point(str(directory / "step99.ckpt"), tmp_path, updates_per_rollout=4)
    assert not marker.exists()


def test_a_dangling_last_ckpt_falls_back_to_the_newest_whole_checkpoint(tmp_path):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    save_checkpoint(directory / "step8.ckpt", rollouts=2, steps=8)
    (directory / "last.ckpt").symlink_to("step12.ckpt")  # its target deleted
    skipped = []
    point = find_resume_point(str(tmp_path), tmp_path, updates_per_rollout=4, log=skipped.append)
    assert point.checkpoint == directory / "step8.ckpt"
    assert skipped == ["resume: skipping last.ckpt: it points at step12.ckpt, which is gone"]


def test_temporary_files_of_killed_writers_are_removed_and_live_ones_kept(tmp_path):
    from rloo.utils.atomic import remove_stale_temps

    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(finished.stdout)  # a process that has exited
    (tmp_path / f".step5.ckpt.tmp-{dead}").write_bytes(b"")
    (tmp_path / f".policy.tmp-{dead}").mkdir()
    (tmp_path / f".policy.tmp-{dead}" / "model.safetensors").write_bytes(b"x")
    (tmp_path / f".summary.json.tmp-{os.getpid()}").write_text("{}")  # this process is writing it
    (tmp_path / "step5.ckpt").write_bytes(b"kept")
    removed = []
    remove_stale_temps(tmp_path, removed.append)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".summary.json.tmp-{os.getpid()}", "step5.ckpt"]
    assert len(removed) == 2 and all(f"process {dead} is gone" in line for line in removed)


def test_fixed_keys_are_refused_and_the_others_reported():
    before = {"k": 2, "lr": 1e-3, "model": {"policy": "a"}, "rollout_batch_size": 8}
    refused, applied = compare_configs(before, {"k": 4, "lr": 2e-3, "model": {"policy": "b"}, "rollout_batch_size": 8})
    assert refused == ["k: 2 -> 4", "model.policy: 'a' -> 'b'"]
    assert applied == ["lr: 0.001 -> 0.002"]


def test_random_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    import random

    import numpy as np

    states = rng_states()
    torch.save(states, tmp_path / "rng.pt")
    drawn = (random.random(), np.random.rand(), torch.rand(3))
    restore_rng_states(torch.load(tmp_path / "rng.pt", weights_only=True))
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert drawn[:2] == again[:2] and torch.equal(drawn[2], again[2])


def test_checkpoints_fall_due_by_rollouts_by_minutes_and_at_the_end(tmp_path):
    import time

    from rloo.run.callbacks import RolloutCheckpoints

    by_rollouts = RolloutCheckpoints(tmp_path, every=4, minutes=0, keep=3)
    assert [r for r in range(1, 11) if by_rollouts.due(r, total=10)] == [4, 8, 10]
    by_time = RolloutCheckpoints(tmp_path, every=0, minutes=1, keep=3)
    assert not by_time.due(3, total=10)
    by_time.last_time = time.monotonic() - 61
    assert by_time.due(3, total=10)


def test_run_dirs_are_unique_within_a_second(tmp_path):
    made = [unique_dir(str(tmp_path / "12-00-00")) for _ in range(3)]
    assert made == [str(tmp_path / "12-00-00"), str(tmp_path / "12-00-00_2"), str(tmp_path / "12-00-00_3")]


def test_rows_after_the_resumed_rollout_move_aside(tmp_path):
    path = tmp_path / "metrics.csv"
    # as the run writes them: step = the rollout, for train rows and evaluations alike
    path.write_text("step,train/rollout,eval/win_rate\n0,,0.5\n1,1.0,\n2,2.0,\n2,,0.6\n3,3.0,\n")
    assert drop_rows_after(str(path), 2) == 1
    assert path.read_text().splitlines()[1:] == ["0,,0.5", "1,1.0,", "2,2.0,", "2,,0.6"]
    assert (tmp_path / "metrics.superseded.csv").read_text().splitlines()[1:] == ["3,3.0,"]


def test_every_leaf_of_every_composed_config_has_a_resume_policy(monkeypatch, tmp_path):
    """rloo.config.schema gives each key fixed or applied; no key of any algorithm, model, recipe or debug setting is
    left
    out (a key it does not know would be refused on resume as fixed)."""
    from omegaconf import OmegaConf

    from rloo.config.schema import APPLIED, FIXED, leaves, resume_policy
    from rloo.run.cli import compose_train_config, group_options

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    settings = (
        [[f"algo={a}"] for a in group_options("algo")]
        + [[f"model={m}"] for m in group_options("model")]
        + [[f"experiment={e}", "algo=ppo"] for e in group_options("experiment")]
        + [["debug=fast"], ["bootstrap=hard"]]
    )
    checked = 0
    for overrides in settings:
        cfg = compose_train_config(
            overrides + [f"paths.output_dir={tmp_path}", "logger.wandb.name=null", "logger.wandb.group=null"]
        )
        for key in leaves(OmegaConf.to_container(cfg, resolve=True)):
            assert resume_policy(key, cfg.algorithm) in (FIXED, APPLIED), (overrides, key)
            checked += 1
    assert checked > 100 * len(settings)


def test_a_changed_key_is_refused_or_applied_by_its_policy():
    before = {
        "algorithm": "rloo",
        "temperature": 0.7,
        "loss": "ppo_clip",
        "kl_coef": 0.05,
        "eval_every": 32,
        "trainer": {"devices": 1, "strategy": "auto"},
        "resume": None,
    }
    after = {
        "algorithm": "rloo",
        "temperature": 0.9,
        "loss": "reinforce",
        "kl_coef": 0.1,
        "eval_every": 8,
        "trainer": {"devices": 2, "strategy": "ddp"},
        "resume": "auto",
    }
    refused, applied = compare_configs(before, after)
    assert refused == ["loss: 'ppo_clip' -> 'reinforce'", "temperature: 0.7 -> 0.9", "trainer.devices: 1 -> 2"]
    assert applied == ["eval_every: 32 -> 8", "kl_coef: 0.05 -> 0.1", "trainer.strategy: 'auto' -> 'ddp'"]


def test_resuming_a_run_stopped_before_its_first_checkpoint_says_how_to_start_it_again(tmp_path):
    """A run dir stopped while it was set up (config.yaml, summary.json interrupted, no checkpoints/) is a run dir:
    the line says it stopped before its first checkpoint and how to start it again, not that it is no run dir."""
    from rloo.utils.errors import ConfigError
    from rloo.utils.resume import check_resume_argument

    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text('{"status": "interrupted", "stopped_during": "setting up"}')
    with pytest.raises(ConfigError) as caught:
        check_resume_argument(str(run))
    assert str(caught.value) == (
        f"resume={str(run)!r}: that run stopped before its first checkpoint, so there is nothing to continue from; "
        f"start it again in its dir: hydra.run.dir={run} resume=auto"
    )
    with pytest.raises(ConfigError, match="is a dir without checkpoints/"):
        check_resume_argument(str(tmp_path))  # a dir that was never a run


def test_a_resume_composes_the_runs_own_overrides_before_the_command_lines(tmp_path):
    """resume=<run dir> alone continues with what the run was composed from (.hydra/overrides.yaml, as Hydra and
    rloo.fit save it); a key given beside it is the command line's; the run's --config-dir joins the search path."""
    from rloo.run.cli import compose_train_config, with_the_runs_own_overrides

    run, conf = tmp_path / "run", tmp_path / "my conf's"  # a space and a quote: Hydra's grammar quotes them
    (run / ".hydra").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    conf.mkdir()
    (run / ".hydra" / "overrides.yaml").write_text("- debug=fast\n- rollout_batch_size=16\n- k=4\n- lr=1e-4\n")
    (run / ".hydra" / "hydra.yaml").write_text(
        "hydra:\n  runtime:\n    config_sources:\n"
        "    - {path: hydra.conf, schema: pkg, provider: hydra}\n"
        f"    - {{path: {conf}, schema: file, provider: command-line}}\n"
    )
    said = []
    argv = with_the_runs_own_overrides([f"resume={run}", "lr=3e-4"], said.append)
    assert argv == [
        "debug=fast",
        "rollout_batch_size=16",
        "k=4",
        "hydra.searchpath=['file://" + str(conf).replace("'", "\\'") + "']",
        f"resume={run}",
        "lr=3e-4",
    ]
    from rloo.run.command_line import CommandLine

    assert CommandLine.parse(argv).value("hydra.searchpath") == [f"file://{conf}"]  # round-trips as it was
    assert said == [f"rloo: resume: {run}'s own settings first: {' '.join(argv[:4])}"]
    cfg = compose_train_config([a for a in argv if not a.startswith("hydra.")])
    assert (cfg.rollout_batch_size, cfg.k, cfg.lr) == (16, 4, 3e-4)
    assert with_the_runs_own_overrides(["k=2"]) == ["k=2"]  # a fresh run: as it is
    (run / ".hydra" / "overrides.yaml").unlink()  # a run from before the record: as it is
    assert with_the_runs_own_overrides([f"resume={run}"]) == [f"resume={run}"]


def test_a_damaged_record_or_a_config_dir_that_is_gone_is_one_line(tmp_path):
    from rloo.run.cli import with_the_runs_own_overrides

    run, conf = tmp_path / "run", tmp_path / "gone_conf"
    (run / ".hydra").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text("- debug=fast\n- 'k=4\n")  # an unclosed quote
    with pytest.raises(ConfigError, match=r"overrides.yaml is damaged \(while scanning a quoted scalar\): it should"):
        with_the_runs_own_overrides([f"resume={run}"])
    (run / ".hydra" / "overrides.yaml").write_text("- debug=fast\n")
    (run / ".hydra" / "hydra.yaml").write_text(
        f"hydra:\n  runtime:\n    config_sources:\n    - {{path: {conf}, schema: file, provider: command-line}}\n"
    )
    with pytest.raises(ConfigError, match=rf"was composed with --config-dir {conf}, which is gone: give --config-dir"):
        with_the_runs_own_overrides([f"resume={run}"])
    assert "--config-dir" in with_the_runs_own_overrides(["--config-dir", str(tmp_path), f"resume={run}"])


def deepspeed_checkpoint(directory, ranks: int = 2, rollouts: int = 1, steps: int = 2, zero3: bool = False):
    """A checkpoint dir in the layout Lightning's DeepSpeedStrategy writes (`latest` names the tag dir; the model
    states, once under ZeRO-2 or one per rank under ZeRO-3, hold the run's state; one optimiser state per rank)."""
    tag = directory / "checkpoint"
    tag.mkdir(parents=True)
    (directory / "latest").write_text("checkpoint")
    state = {"rloo_rollouts": rollouts, "global_step": steps, "dp_world_size": ranks}
    names = [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(ranks)] if zero3 else []
    for name in names or ["mp_rank_00_model_states.pt"]:
        torch.save(state, tag / name)
    for rank in range(ranks):
        torch.save({"step": torch.zeros(1)}, tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    return directory


@pytest.mark.parametrize("zero3", [False, True])
def test_a_deepspeed_checkpoint_dir_resumes_only_when_every_part_of_it_is_there(tmp_path, zero3):
    from rloo.utils.resume import check_resume_argument, inspect_checkpoint, run_dir_of

    run = tmp_path / "run"
    whole = deepspeed_checkpoint(run / "checkpoints" / "step2.ckpt", zero3=zero3)
    check_resume_argument(str(whole))  # a checkpoint, not a run dir without checkpoints/
    assert run_dir_of(str(whole)) == str(run)
    assert inspect_checkpoint(whole, updates_per_rollout=2) == (1, None)
    assert find_resume_point("auto", run, 2, log=lambda line: None).checkpoint == whole

    tag = whole / "checkpoint"
    optimiser = tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    optimiser.write_bytes(optimiser.read_bytes()[:40])  # a write cut short
    assert inspect_checkpoint(whole, 2) == (-1, f"is a DeepSpeed checkpoint whose {optimiser.name} is cut short")
    optimiser.unlink()
    assert inspect_checkpoint(whole, 2) == (-1, "is a DeepSpeed checkpoint with 1 of 2 ranks' optimiser states")
    for states in tag.glob("*model_states.pt"):
        states.unlink()
    assert "without its model states" in inspect_checkpoint(whole, 2)[1]
    skipped = []
    assert find_resume_point("auto", run, 2, log=skipped.append) is None and "step2.ckpt" in skipped[0]


def test_a_run_keeps_its_newest_checkpoint_by_default_and_no_frozen_model(embedded_task, tmp_path, monkeypatch):
    import rloo
    from rloo.run.cli import compose_train_config

    assert compose_train_config([]).keep_checkpoints == 1
    monkeypatch.setenv("RLOO_CACHE_DIR", str(embedded_task / "cache"))
    out = tmp_path / "run"
    rloo.fit({"debug": "fast", "logger": "csv", "judge": "none", "keep_checkpoints": 1}, output_dir=out)
    assert sorted(p.name for p in (out / "checkpoints").glob("*.ckpt")) == ["last.ckpt", "step3.ckpt"]
    assert os.readlink(out / "checkpoints" / "last.ckpt") == "step3.ckpt"
    state = torch.load(out / "checkpoints" / "step3.ckpt", weights_only=True)
    assert all(key.startswith("policy.") for key in state["state_dict"])  # the reference and reward model reload
    moments = state["optimizer_states"][0]["state"]  # AdamW's two moments for every policy weight
    assert len(moments) == len(state["state_dict"]) and all(
        {"exp_avg", "exp_avg_sq"} <= set(m) for m in moments.values()
    )
