"""Interrupted runs keep what they did: SIGTERM and Ctrl-C mid-training and during the final evaluation, a failing
judge, a full disk at the end. Real `python -m rloo.train` processes, signalled from here."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.chat_server import answer
from tests.e2e import FAST, HANG_GUARD_S, ROOT, run_module

SIGTERM_EXIT, CTRL_C_EXIT = 128 + 15, 128 + 2  # as a shell reports a process stopped by SIGTERM, by Ctrl-C


def start(run_dir, cache, *overrides, preexec_fn=None):
    env = {**os.environ, "RLOO_CACHE_DIR": str(cache), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}

    def as_from_a_terminal():
        # a shell starts background jobs with SIGINT ignored, and the child would inherit that: a user's Ctrl-C
        # reaches a process that has the default handler
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if preexec_fn is not None:
            preexec_fn()

    return subprocess.Popen(
        [sys.executable, "-m", "rloo.train", f"hydra.run.dir={run_dir}", *FAST, "logger=csv", *overrides],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=as_from_a_terminal,
    )


def wait_for(condition, process, timeout=HANG_GUARD_S):
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, process.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def finish(process, timeout=HANG_GUARD_S):
    output, _ = process.communicate(timeout=timeout)
    return process.returncode, output


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, SIGTERM_EXIT), (signal.SIGINT, CTRL_C_EXIT)])
def test_a_signal_mid_training_saves_a_checkpoint_and_exits_non_zero(finished_run, sig, code):
    base, _ = finished_run
    run = base / f"mid-training-{sig.name}"
    # 200 rollouts: far more than will run before the signal; step checkpoints off, so only the signal saves one
    process = start(
        run, base / "cache", "total_episodes=1600", "checkpoint_every=0", "eval_every=0", "eval.before=false"
    )
    wait_for(
        lambda: (run / "samples.jsonl").exists() and len((run / "samples.jsonl").read_text().splitlines()) >= 16,
        process,
    )  # sample_every=1, 8 rows a rollout: two rollouts done
    process.send_signal(sig)
    returncode, output = finish(process)
    assert returncode == code, output[-3000:]
    checkpoint = torch.load(run / "checkpoints" / "interrupted.ckpt", weights_only=False)
    assert 2 <= checkpoint["rloo_rollouts"] < 200
    assert all(key.startswith("policy.") for key in checkpoint["state_dict"])
    done = summary(run)
    assert done["status"] == "interrupted" and done["rollouts"] == checkpoint["rloo_rollouts"]
    assert done["final"] is None and not (run / "policy").exists()  # the checkpoint holds the unfinished policy
    # one line says what was kept and the command that continues the run, which does, with the run's own settings
    by = "SIGTERM" if sig == signal.SIGTERM else "Ctrl-C"
    command = f"python -m rloo.train resume={run}"
    assert (
        f"rloo: stopped by {by} after {done['rollouts']} rollouts; kept checkpoints/interrupted.ckpt (in {run}); "
        f"continue with: {command}"
    ) in output.splitlines()
    assert "stopped by Ctrl-C; exit 130" not in output  # the run ends on that line, not the generic one
    if sig == signal.SIGINT:  # the command as printed, with a shorter budget (an applied key) so that it ends soon
        args = command.split()[3:] + [f"total_episodes={8 * (done['rollouts'] + 1)}"]
        resumed = run_module("rloo.train", *args, cache=base / "cache")
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert summary(run)["status"] == "finished" and summary(run)["rollouts"] == done["rollouts"] + 1


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, CTRL_C_EXIT), (signal.SIGTERM, SIGTERM_EXIT)])
def test_a_signal_during_the_final_evaluation_keeps_the_exported_policy(finished_run, server, sig, code):
    """The final evaluation judges with a slow loopback judge; the signal arrives while it waits for the answers."""
    base, _ = finished_run
    url, state = server
    state.respond = lambda i, body, headers: answer("Comparison: fine.\nPreferred: A", delay=1.0)
    run = base / f"final-eval-{sig.name}"
    process = start(
        run,
        base / "cache",
        "eval_every=0",
        "eval.before=false",
        "judge=openai",
        f"judge.base_url={url}",
        "judge.model=test",
        "judge.cache_dir=null",
        "judge.max_retries=0",
    )
    wait_for(lambda: state.count > 0, process)
    process.send_signal(sig)
    returncode, output = finish(process)
    assert returncode == code, output[-3000:]
    policy = AutoModelForCausalLM.from_pretrained(run / "policy")  # exported before the final evaluation began
    assert sum(p.numel() for p in policy.parameters()) > 0
    done = summary(run)
    assert done["status"] == "interrupted" and done["rollouts"] == 3 and done["policy_dir"] == str(run / "policy")
    assert (run / "checkpoints" / "last.ckpt").exists()


@pytest.mark.slow
def test_a_failing_judge_fails_the_run_after_the_policy_is_saved(finished_run, server):
    base, _ = finished_run
    url, state = server
    state.respond = lambda i, body, headers: (401, {}, json.dumps({"error": {"message": "bad key"}}), 0.0)
    run = base / "judge-fails"
    process = start(
        run,
        base / "cache",
        "eval_every=0",
        "eval.before=false",
        "judge=openai",
        f"judge.base_url={url}",
        "judge.model=test",
        "judge.cache_dir=null",
    )
    code, output = finish(process)
    assert code != 0, output[-3000:]
    assert summary(run)["status"] == "failed"
    AutoModelForCausalLM.from_pretrained(run / "policy")
    assert (run / "checkpoints" / "interrupted.ckpt").exists()


@pytest.mark.slow
def test_a_full_disk_at_the_end_says_so_in_one_line_and_leaves_no_torn_files(finished_run):
    """`ulimit -f` caps the size of every file the run writes: the checkpoints and the policy fail to fit."""
    import resource

    base, _ = finished_run
    run = base / "full-disk"

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap fails with EFBIG instead of killing

    process = start(
        run,
        base / "cache",
        "checkpoint_every=0",
        "eval_every=0",
        "eval.before=false",
        "eval.after=false",
        preexec_fn=small_files,
    )
    code, output = finish(process)
    assert code == 1, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "File too large" in errors[0] and str(run) in errors[0], output[-3000:]
    assert errors[0].startswith(f"error: could not write {run / 'checkpoints'}"), errors[0]  # the file, named
    assert "Traceback" not in output
    assert not (run / "policy").exists()  # never a half-written policy
    leftovers = [p.name for p in run.iterdir() if ".tmp-" in p.name]
    assert leftovers == []


@pytest.mark.slow
def test_sigterm_while_the_embedded_task_is_being_built_exits_non_zero_and_the_next_run_builds_it(tmp_path):
    """The bootstrap's stages run their own Lightning trainers, whose SIGTERM is a SystemExit without a code (exit 0
    before): now 143 with the setup's line and summary.json, no cache half-built, and the next run builds it."""
    cache, run = tmp_path / "cache", tmp_path / "run"
    long_sft = ["bootstrap.sft.epochs=150", "eval.before=false"]  # an SFT stage of some seconds, to be inside
    process = start(run, cache, *long_sft)
    wait_for(lambda: any(cache.glob("toy-*.tmp-*/tokenizer/tokenizer.json")), process)  # the SFT stage is next
    time.sleep(2.0)
    process.send_signal(signal.SIGTERM)
    returncode, output = finish(process)
    assert returncode == SIGTERM_EXIT, output[-3000:]
    assert "stopped by SIGTERM while setting up the run" in output and "Traceback" not in output
    assert summary(run)["status"] == "interrupted" and summary(run)["stopped_during"].startswith("setting up")
    assert not (run / "policy").exists()

    again = start(run.with_name("again"), cache, *long_sft)
    returncode, output = finish(again)
    assert returncode == 0, output[-3000:]
    assert not list(cache.glob("toy-*.tmp-*"))  # the killed build's temp dir is gone


def test_a_second_ctrl_c_does_not_cut_what_a_stopped_run_records():
    """A stopped run records its summary and the line that says how to continue with Ctrl-C held off: a second
    Ctrl-C in those seconds is dropped, and Ctrl-C stops the process again after them."""
    from rloo.run.stops import ctrl_c_held

    # Python's own SIGINT handler, as an interactive run has it (a job a script starts in the background inherits
    # SIGINT ignored, and so would this test process)
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with ctrl_c_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # a KeyboardInterrupt would be raised here
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    finally:
        signal.signal(signal.SIGINT, inherited)
