"""Beyond one process, end to end on CPU (gloo): sharded training that samples from gathered weights (fsdp2,
DeepSpeed ZeRO-3), DeepSpeed ZeRO-2 and 3 through Lightning's strategy, two nodes and a lost one, SIGTERM to the
launcher, and SLURM's preemption. Each is held against one 2-process DDP twin with the same settings and draws: the
first rollout's completions are the same tokens, the policies agree up to the order of float sums, and a run that is
stopped and continued ends on the twin's bits (a 0-valued reward term, there to pause or fault a rank, changes none)."""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.e2e import finish, free_port, group_alive, start, train, wait_for

# 8 completions per rank and rollout in micro-batches of 4: each mini-batch accumulates 2 micro-batches (the path
# ZeRO-3 once got wrong); 2 epochs: 2 optimiser steps a rollout; 3 rollouts, the first one's checkpoint step2.ckpt;
# an evaluation inside training too (eval_every=2: fsdp2 and ZeRO-3 gather the weights for it as for a rollout)
SETTINGS = ["trainer.num_threads=1", "total_episodes=48", "num_ppo_epochs=2", "num_mini_batches=1", "sample_every=1"]
SETTINGS += ["eval.num_prompts=5", "eval_every=2"]  # 5 prompts: 3 + 2 on the ranks
TWIN = ["trainer.devices=2", *SETTINGS]  # the background runs (tests.e2e.start) log to csv, as the twin does
FIRST_CHECKPOINT = "step2.ckpt"
ZERO_TERM = "tests.reward_functions:faulty_rank"  # 0 for every completion; kills or hangs a rank on demand
SIGTERM_EXIT = 128 + signal.SIGTERM


def policy_of(run: Path) -> dict:
    return AutoModelForCausalLM.from_pretrained(run / "policy").state_dict()


def first_rollout(run: Path) -> list[tuple[str, str]]:
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    return [(row["prompt"], row["completion"]) for row in rows if row["step"] == 1]


def summary_of(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def assert_trains_as_the_twin(run: Path, twin: Path) -> None:
    """The same completions from the same draws, then the same policy up to float-sum order (DDP moved it)."""
    assert first_rollout(run) and first_rollout(run) == first_rollout(twin)
    ours, theirs = policy_of(run), policy_of(twin)
    assert max((ours[k] - theirs[k]).abs().max().item() for k in ours) < 1e-5


def assert_same_bits(run: Path, other: Path) -> None:
    ours, theirs = policy_of(run), policy_of(other)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def all_ended(processes: list) -> bool:
    """No process of these launches (nor any rank they started) is left, within a bound on a hang."""
    deadline = time.monotonic() + 300
    while any(group_alive(process) for process in processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not any(group_alive(process) for process in processes)


@pytest.fixture(scope="module")
def twin(embedded_task):
    """The 2-process DDP run every other layout is held against."""
    run = embedded_task / "ddp_twin"
    result = train(run, embedded_task / "cache", "trainer.strategy=ddp", "logger=csv", *TWIN)
    assert result.returncode == 0, result.stderr[-3000:]
    initial = AutoModelForCausalLM.from_pretrained(next((embedded_task / "cache").glob("*/policy"))).state_dict()
    trained = policy_of(run)
    moved = max((trained[k] - initial[k]).abs().max().item() for k in initial)
    assert moved > 1e-4  # well above the agreement asked of the other layouts (1e-5)
    return run


@pytest.mark.slow
def test_ddp_on_two_cpu_processes_splits_the_episodes(twin):
    """The twin itself: RanksAgree compared the ranks' weights after every rollout (the run finished), each rollout
    ran on both ranks, each rank stepped 2 epochs x 1 mini-batch. Its resumes are below: a lost node, SIGTERM and
    SLURM's requeue each end on its bits."""
    summary = summary_of(twin)
    assert (summary["rollouts"], summary["episodes"]) == (48 // (8 * 2), 48)
    assert summary["optimizer_steps"] == summary["rollouts"] * 2 * 1


def trained_and_resumed(base: Path, name: str, *settings: str) -> Path:
    """A run, then the same run resumed from its first rollout's checkpoint into a dir of its own: both finish on the
    same bits."""
    run, resumed = base / name, base / f"{name}_resumed"
    resume = ["eval.before=false", f"resume={run / 'checkpoints' / FIRST_CHECKPOINT}"]
    for target, extra in ((run, []), (resumed, resume)):
        code, output, _ = finish(*start(target, base / "cache", *TWIN, *settings, *extra))
        assert code == 0, output[-3000:]
    assert_same_bits(run, resumed)
    return run


@pytest.mark.slow
def test_fsdp2_samples_from_gathered_weights_as_ddp_does_and_resumes_bit_identical(embedded_task, twin):
    """trainer.strategy=fsdp2 with the lean decode: each rollout gathers the policy's weights whole once, samples
    from them, and partitions them again; the same draws give DDP's completions."""
    run = trained_and_resumed(embedded_task, "fsdp2", "trainer.strategy=fsdp2")
    assert_trains_as_the_twin(run, twin)
    summary = summary_of(run)
    assert (summary["rollouts"], summary["episodes"], summary["optimizer_steps"]) == (3, 48, 6)
    ran = summary["fast_paths"]["sampler"]
    assert ran["ran"] == "lean_decode" and "gathered whole once per rollout" in ran["why"]
    checkpoint = torch.load(run / "checkpoints" / FIRST_CHECKPOINT, weights_only=False)
    assert all(k.startswith("policy.") and type(v) is torch.Tensor for k, v in checkpoint["state_dict"].items())
    assert len(checkpoint["rloo_rng_by_rank"]) == 2  # each rank's generators
    evaluation = summary["final"]
    assert evaluation["eval/num_judged"] + evaluation["eval/invalid"] == 5  # the row padded onto rank 1 dropped


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_on_two_cpu_processes_trains_as_ddp_and_resumes_bit_identical(embedded_task, twin, stage):
    """trainer.strategy=deepspeed_stage_{2,3} through Lightning's strategy on CPU: ZeRO-2 partitions the gradients
    and AdamW state, ZeRO-3 also the weights (sampled from gathered copies); both accumulate a mini-batch's
    micro-batches as DDP does. Its op build under rloo's lock: tests/test_gathered_sampling.py."""
    pytest.importorskip("deepspeed")
    run = trained_and_resumed(embedded_task, f"zero{stage}", f"trainer.strategy=deepspeed_stage_{stage}")
    assert_trains_as_the_twin(run, twin)
    assert (run / "checkpoints" / FIRST_CHECKPOINT / "latest").is_file()  # DeepSpeed's own checkpoint layout
    if stage == 3:
        assert "gathered whole once per rollout" in summary_of(run)["fast_paths"]["sampler"]["why"]


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_every_rank_and_resume_is_bit_identical(embedded_task, twin, tmp_path):
    """SIGTERM to rank 0 alone, as a scheduler sends it, while rank 0 is inside its second rollout's reward call:
    every rank stops, the run says so, and resume=auto ends on the twin's bits."""
    stopped, settings = tmp_path / "stopped", [*TWIN, "trainer.strategy=ddp", f"reward=model + {ZERO_TERM}"]
    inside = {"RLOO_TEST_FAULT": "hang", "RLOO_TEST_FAULT_FILE": str(tmp_path / "inside"), "RLOO_TEST_FAULT_CALL": "2"}
    process, log = start(stopped, embedded_task / "cache", *settings, env=inside)
    wait_for((tmp_path / "inside").exists, process, log)  # rank 0 inside its second rollout's reward
    process.send_signal(signal.SIGTERM)  # to the launcher (rank 0) alone
    code, output, _ = finish(process, log)
    assert code == SIGTERM_EXIT, output[-3000:]
    assert "stopped by SIGTERM" in output and "Traceback" not in output
    assert all_ended([process])  # rank 1 stopped too
    assert summary_of(stopped)["status"] == "interrupted"
    code, output, _ = finish(*start(stopped, embedded_task / "cache", *settings, "resume=auto"))
    assert code == 0, output[-3000:]
    assert_same_bits(stopped, twin)


def start_nodes(run: Path, cache: Path, *settings: str, envs: tuple[dict, dict] = ({}, {})) -> list:
    """Two launchers on loopback, as two machines of a cluster start a run: trainer.num_nodes=2, one process each,
    NODE_RANK 0 and 1, one run dir (a shared file system)."""
    port = str(free_port())
    nodes = []
    for node, extra_env in enumerate(envs):
        env = {"NODE_RANK": str(node), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, **extra_env}
        nodes.append(start(run, cache, *settings, env=env))
    return nodes


NODES = [*SETTINGS, "trainer.strategy=ddp", "trainer.num_nodes=2", "trainer.devices=1", "eval.before=false"]
NODES += ["eval.after=false", f"reward=model + {ZERO_TERM}"]  # no final evaluation: node 1 ends right after training,
# before node 0 has written policy/ (it does not judge a run dir it does not write: once, node 1 failed for it)


@pytest.mark.slow
def test_two_nodes_split_whole_prompt_groups_write_once_and_resume_bit_identical_after_a_node_dies(
    embedded_task, twin, tmp_path
):
    cache = embedded_task / "cache"
    whole = tmp_path / "whole"
    results = [finish(*node) for node in start_nodes(whole, cache, *NODES)]
    assert [code for code, _, _ in results] == [0, 0], results[0][1][-2000:] + results[1][1][-2000:]
    # one writer: node 0 wrote the run dir's files; node 1 wrote none beside them
    assert sorted(p.name for p in whole.glob("config*.yaml")) == ["config.yaml"]
    assert summary_of(whole)["status"] == "finished" and (whole / "policy" / "config.json").is_file()
    assert "outputs:" in results[0][1] and "outputs:" not in results[1][1]
    checkpoint = torch.load(whole / "checkpoints" / FIRST_CHECKPOINT, weights_only=False)
    assert len(checkpoint["rloo_rng_by_rank"]) == 2
    # whole prompt groups on each node: every prompt of node 0's first rollout has its k=2 completions there, each
    # baselined by the other: the advantages are opposite, and (the first rollout's KL is 0) each is the score
    # difference up to the missing-EOS penalty of 1 (missing_eos_penalty) on either side
    groups = {}
    for row in (json.loads(line) for line in (whole / "samples.jsonl").read_text().splitlines()):
        if row["step"] == 1:
            groups.setdefault(row["prompt"], []).append(row)
    assert groups and all(len(group) == 2 for group in groups.values())
    for a, b in groups.values():
        assert a["advantage"] == pytest.approx(-b["advantage"], abs=1e-5)
        penalty = a["advantage"] - (a["score"] - b["score"])
        assert penalty == pytest.approx(round(penalty), abs=1e-5) and abs(round(penalty)) <= 1
    assert first_rollout(whole) == first_rollout(twin)  # node 0 sampled what rank 0 of one machine samples
    ours, theirs = policy_of(whole), policy_of(twin)
    assert max((ours[k] - theirs[k]).abs().max().item() for k in ours) < 1e-5

    killed = tmp_path / "killed"  # node 1 dies in its second rollout (SIGKILL, as a lost machine)
    die = {"RLOO_TEST_FAULT": "kill", "RLOO_TEST_FAULT_RANK": "0", "RLOO_TEST_FAULT_CALL": "2"}
    nodes = start_nodes(killed, cache, *NODES, envs=({}, die))
    (first_code, output, _), (second_code, _, _) = (finish(*node) for node in nodes)
    assert first_code == 1 and second_code == -signal.SIGKILL, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "died or hung" in errors[0] and "resume=auto" in errors[0], output[-3000:]
    assert all_ended([process for process, _ in nodes])
    assert not (killed / "policy").exists() and summary_of(killed)["status"] == "failed"
    for checkpoint in (killed / "checkpoints").glob("step*.ckpt"):  # each whole: it loads
        torch.load(checkpoint, map_location="cpu", weights_only=True)
    results = [finish(*node) for node in start_nodes(killed, cache, *NODES, "resume=auto")]
    assert [code for code, _, _ in results] == [0, 0], results[0][1][-3000:]
    assert_same_bits(killed, whole)


def slurm_tasks(run: Path, cache: Path, bin_dir: Path, *settings: str, env: dict | None = None) -> list:
    """The two tasks of a SLURM job on one node (as srun starts them: SLURM's variables, one process per rank),
    with a stand-in `scontrol` on PATH that records what it is asked."""
    port = str(free_port())
    tasks = []
    for rank in (0, 1):
        slurm = {
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NAME": "rloo-test",
            "SLURM_NTASKS": "2",
            "SLURM_NTASKS_PER_NODE": "2",
            "SLURM_NNODES": "1",
            "SLURM_NODEID": "0",
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "SLURM_NODELIST": "127.0.0.1",
            "MASTER_PORT": port,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "RLOO_TEST_SCONTROL_LOG": str(bin_dir / "scontrol.log"),
        }
        tasks.append(start(run, cache, *settings, env={**slurm, **(env or {})}))
    return tasks


SLURM = [*TWIN, "trainer.strategy=ddp", "eval.before=false", "reward=model + tests.reward_functions:pauses"]
SLURM += ["reward_timeout_s=0"]  # the pause runs in the main thread, where the signal lands


@pytest.mark.slow
def test_slurm_pre_kill_signal_checkpoints_at_a_rollouts_end_requeues_and_the_requeued_job_continues_bit_identical(
    embedded_task, twin, tmp_path
):
    cache, bin_dir = embedded_task / "cache", tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text('#!/bin/sh\necho "$@" >> "$RLOO_TEST_SCONTROL_LOG"\n')
    scontrol.chmod(0o755)
    preempted, marker = tmp_path / "preempted", tmp_path / "paused"
    # each task pauses inside its second rollout's reward call; SLURM signals both
    pause = {"RLOO_TEST_PAUSE_FILE": str(marker), "RLOO_TEST_PAUSE_CALL": "2", "RLOO_TEST_PAUSE_S": "3"}
    tasks = slurm_tasks(preempted, cache, bin_dir, *SLURM, env=pause)
    for rank, (process, log) in enumerate(tasks):
        wait_for(Path(f"{marker}.{rank}").exists, process, log)
    for process, _ in tasks:
        process.send_signal(signal.SIGUSR1)
    results = [finish(*task) for task in tasks]
    assert [code for code, _, _ in results] == [SIGTERM_EXIT, SIGTERM_EXIT], results[0][1][-3000:]
    lines = [line for line in results[0][1].splitlines() if "pre-kill signal" in line]
    assert len(lines) == 1 and "after 2 rollouts" in lines[0] and "requeued job 4242" in lines[0], lines
    assert (bin_dir / "scontrol.log").read_text() == "requeue 4242\n"  # once, by the first rank
    interrupted = torch.load(preempted / "checkpoints" / "interrupted.ckpt", weights_only=False)
    assert interrupted["rloo_rollouts"] == 2 and len(interrupted["rloo_rng_by_rank"]) == 2  # one point, every rank
    assert summary_of(preempted)["status"] == "interrupted"

    results = [finish(*task) for task in slurm_tasks(preempted, cache, bin_dir, *SLURM, "resume=auto")]
    assert [code for code, _, _ in results] == [0, 0], results[0][1][-3000:]
    assert_same_bits(preempted, twin)
