"""Beyond one process, end to end on CPU (gloo): sharded training that samples from gathered weights (fsdp2,
DeepSpeed ZeRO-3), DeepSpeed ZeRO-2 and 3 through Lightning's strategy, two nodes, and SLURM's preemption. Each is held
against a 2-process DDP twin with the same settings and draws: the first rollout's completions are the same tokens,
the policies agree up to the order of float sums, and every resume ends on the same bits as the run it continues."""

import json
import os
import signal
import socket
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.e2e import finish, start, train, wait_for

# 8 completions per rank and rollout in micro-batches of 4: each mini-batch accumulates 2 micro-batches (the path
# ZeRO-3 once got wrong), 2 epochs: 2 optimiser steps a rollout, so the first rollout's checkpoint is step2.ckpt
SETTINGS = ["trainer.num_threads=1", "total_episodes=32", "num_ppo_epochs=2", "num_mini_batches=1", "sample_every=1"]
SETTINGS += ["eval.num_prompts=5"]  # 3 + 2 on the ranks
TWIN = ["trainer.devices=2", *SETTINGS]  # the background runs (tests.e2e.start) log to csv, as the twin does
FIRST_CHECKPOINT = "step2.ckpt"


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


@pytest.fixture(scope="module")
def twin(embedded_task):
    """The 2-process DDP run every other layout is held against."""
    run = embedded_task / "ddp_twin"
    result = train(run, embedded_task / "cache", "trainer.strategy=ddp", "logger=csv", *TWIN)
    assert result.returncode == 0, result.stderr[-3000:]
    initial = AutoModelForCausalLM.from_pretrained(next((embedded_task / "cache").glob("*/policy"))).state_dict()
    trained = policy_of(run)
    assert (
        max((trained[k] - initial[k]).abs().max().item() for k in initial) > 1e-4
    )  # it moved (agreement below is 1e-5)
    return run


def trained_and_resumed(base: Path, name: str, *settings: str, env: dict | None = None) -> tuple[Path, str]:
    """A run, then the same run resumed from its first rollout's checkpoint into a dir of its own: both must
    finish; returns the first run's dir and its output."""
    run, resumed = base / name, base / f"{name}_resumed"
    outputs = []
    for target, extra in (
        (run, []),
        (resumed, ["eval.before=false", f"resume={run / 'checkpoints' / FIRST_CHECKPOINT}"]),
    ):
        process, log = start(target, base / "cache", *TWIN, *settings, *extra, env=env)
        code, output, _ = finish(process, log)
        assert code == 0, output[-3000:]
        outputs.append(output)
    assert_same_bits(run, resumed)
    return run, outputs[0]


@pytest.mark.slow
def test_fsdp2_samples_from_gathered_weights_as_ddp_does_and_resumes_bit_identical(embedded_task, twin):
    """trainer.strategy=fsdp2 with the lean decode: each rollout gathers the policy's weights whole once, samples
    from them, and partitions them again; the same draws give DDP's completions."""
    run, _ = trained_and_resumed(embedded_task, "fsdp2", "trainer.strategy=fsdp2")
    assert_trains_as_the_twin(run, twin)
    summary = summary_of(run)
    assert (summary["rollouts"], summary["episodes"], summary["optimizer_steps"]) == (2, 32, 4)
    ran = summary["fast_paths"]["sampler"]
    assert ran["ran"] == "lean_decode" and "gathered whole once per rollout" in ran["why"]
    checkpoint = torch.load(run / "checkpoints" / FIRST_CHECKPOINT, weights_only=False)
    assert all(k.startswith("policy.") and type(v) is torch.Tensor for k, v in checkpoint["state_dict"].items())
    assert len(checkpoint["rloo_rng_by_rank"]) == 2  # each rank's generators
    evaluation = summary["final"]
    assert evaluation["eval/num_judged"] + evaluation["eval/invalid"] == 5  # the row padded onto rank 1 dropped


@pytest.fixture(scope="module")
def extensions(tmp_path_factory):
    """A torch extensions dir of the module's own, holding the lock file a killed DeepSpeed op build leaves."""
    pytest.importorskip("deepspeed")
    root = tmp_path_factory.mktemp("torch_extensions")
    build = root / f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}_cpu"
    lock = build / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    return root, lock


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_on_two_cpu_processes_trains_as_ddp_and_resumes_bit_identical(embedded_task, twin, extensions, stage):
    """trainer.strategy=deepspeed_stage_{2,3} through Lightning's strategy on CPU: ZeRO-2 partitions the gradients
    and AdamW state, ZeRO-3 also the weights (sampled from gathered copies); both accumulate a mini-batch's
    micro-batches as DDP does. A stale lock of a killed op build is named in one line and removed, not waited on."""
    root, lock = extensions
    stale = lock.exists()
    run, output = trained_and_resumed(
        embedded_task,
        f"zero{stage}",
        f"trainer.strategy=deepspeed_stage_{stage}",
        env={"TORCH_EXTENSIONS_DIR": str(root)},
    )
    assert not lock.exists()
    if stale:  # the first DeepSpeed run of the module found it
        assert f"rloo: removed {lock}, left by a DeepSpeed op build that was killed" in output
    assert_trains_as_the_twin(run, twin)
    assert (run / "checkpoints" / FIRST_CHECKPOINT / "latest").is_file()  # DeepSpeed's own checkpoint layout
    if stage == 3:
        assert "gathered whole once per rollout" in summary_of(run)["fast_paths"]["sampler"]["why"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_nodes(run: Path, cache: Path, *settings: str, envs: tuple[dict, dict] = ({}, {})) -> list:
    """Two launchers on loopback, as two machines of a cluster start a run: trainer.num_nodes=2, one process each,
    NODE_RANK 0 and 1, one run dir (a shared file system)."""
    port = str(free_port())
    nodes = []
    for node, extra_env in enumerate(envs):
        env = {"NODE_RANK": str(node), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, **extra_env}
        nodes.append(start(run, cache, *settings, env=env))
    return nodes


NODES = [*SETTINGS, "trainer.strategy=ddp", "trainer.num_nodes=2", "trainer.devices=1", "checkpoint_every=1"]
NODES += ["eval.before=false", "reward=model + tests.reward_functions:faulty_rank"]  # a 0 term that can kill a node


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
    checkpoint = torch.load(whole / "checkpoints" / "step2.ckpt", weights_only=False)
    assert len(checkpoint["rloo_rng_by_rank"]) == 2
    # whole prompt groups on each node: every prompt of node 0's first rollout has its k=2 completions there, each
    # baselined by the other: the advantages are opposite, and (the first rollout's KL is 0) each is the score
    # difference up to the missing-EOS penalty of 1 (missing_eos_penalty) on either side
    rows = [json.loads(line) for line in (whole / "samples.jsonl").read_text().splitlines()]
    first = [row for row in rows if row["step"] == 1]
    groups = {}
    for row in first:
        groups.setdefault(row["prompt"], []).append(row)
    assert groups and all(len(group) == 2 for group in groups.values())
    for a, b in groups.values():
        assert a["advantage"] == pytest.approx(-b["advantage"], abs=1e-5)
        penalty = a["advantage"] - (a["score"] - b["score"])
        assert penalty == pytest.approx(round(penalty), abs=1e-5) and abs(round(penalty)) <= 1
    assert first_rollout(whole) == first_rollout(twin)  # node 0 sampled what rank 0 of one machine samples

    killed = tmp_path / "killed"  # node 1 dies in its second rollout (SIGKILL, as a lost machine)
    die = {"RLOO_TEST_FAULT": "kill", "RLOO_TEST_FAULT_RANK": "0", "RLOO_TEST_FAULT_CALL": "2"}
    codes = [finish(*node)[0] for node in start_nodes(killed, cache, *NODES, envs=({}, die))]
    assert codes[0] == 1 and codes[1] == -signal.SIGKILL, codes
    assert not (killed / "policy").exists() and (killed / "checkpoints" / "step2.ckpt").is_file()
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


SLURM = [*SETTINGS, "trainer.strategy=ddp", "trainer.devices=2", "total_episodes=64", "checkpoint_every=1"]
SLURM += ["eval.before=false", "reward=model + tests.reward_functions:pauses", "reward_timeout_s=0"]


@pytest.mark.slow
def test_slurm_pre_kill_signal_checkpoints_at_a_rollouts_end_requeues_and_the_requeued_job_continues_bit_identical(
    embedded_task, tmp_path
):
    cache, bin_dir = embedded_task / "cache", tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text('#!/bin/sh\necho "$@" >> "$RLOO_TEST_SCONTROL_LOG"\n')
    scontrol.chmod(0o755)
    whole, preempted = tmp_path / "whole", tmp_path / "preempted"
    results = [finish(*task) for task in slurm_tasks(whole, cache, bin_dir, *SLURM)]
    assert [code for code, _, _ in results] == [0, 0], results[0][1][-3000:]

    marker = tmp_path / "paused"  # each task pauses inside its second rollout's reward call; SLURM signals both
    pause = {"RLOO_TEST_PAUSE_FILE": str(marker), "RLOO_TEST_PAUSE_CALL": "2", "RLOO_TEST_PAUSE_S": "3"}
    tasks = slurm_tasks(preempted, cache, bin_dir, *SLURM, env=pause)
    for rank, (process, log) in enumerate(tasks):
        wait_for(Path(f"{marker}.{rank}").exists, process, log)
    for process, _ in tasks:
        process.send_signal(signal.SIGUSR1)
    results = [finish(*task) for task in tasks]
    assert [code for code, _, _ in results] == [143, 143], results[0][1][-3000:]
    lines = [line for line in results[0][1].splitlines() if "pre-kill signal" in line]
    assert len(lines) == 1 and "after 2 rollouts" in lines[0] and "requeued job 4242" in lines[0], lines
    assert (bin_dir / "scontrol.log").read_text() == "requeue 4242\n"  # once, by the first rank
    interrupted = torch.load(preempted / "checkpoints" / "interrupted.ckpt", weights_only=False)
    assert interrupted["rloo_rollouts"] == 2 and len(interrupted["rloo_rng_by_rank"]) == 2  # one point, every rank
    assert summary_of(preempted)["status"] == "interrupted"

    results = [finish(*task) for task in slurm_tasks(preempted, cache, bin_dir, *SLURM, "resume=auto")]
    assert [code for code, _, _ in results] == [0, 0], results[0][1][-3000:]
    assert_same_bits(preempted, whole)
