"""Asynchronous training (rloo.service.producer, rloo.algorithms.asynchrony): which version samples which rollout,
the check every record passes, the decoupled correction's weights by hand, and real runs: the producer process at lag
0 against the inline loop, exact lag reproducible and resumed bit-identical across a SIGKILL, a producer that fails."""

import csv
import hashlib
import json
import math
import os
import signal
import time

import pytest
import torch

from rloo.generation.rollout import Rollout
from rloo.objectives import importance_ratio_stats, importance_weights
from rloo.service.producer import Record, RolloutProducer
from rloo.service.staleness import StaleRecord, check_record, oldest_version, slots, version_to_sample
from tests.e2e import train, train_error
from tests.test_interrupt import finish, start, wait_for

MEASURED = ("time/", "eval/seconds", "memory/", "eps", "async/")  # seconds and the machine's memory


# ---- which version samples which rollout ----------------------------------------------------------------------------
@pytest.mark.parametrize("lag", [0, 1, 2, 4])
def test_exact_lag_samples_rollout_r_with_version_r_minus_n_and_bounded_with_the_newest_within_n(lag):
    for rollout in range(10):
        oldest = max(0, rollout - lag)
        assert oldest_version(rollout, lag) == oldest
        for published in range(12):
            exact = version_to_sample(rollout, published, lag, "exact")
            bounded = version_to_sample(rollout, published, lag, "bounded")
            assert exact == (oldest if published >= oldest else None)  # waits (paced) until r - N exists
            assert bounded == (published if published >= oldest else None)
    assert slots(lag) == lag + 1


def test_a_record_older_than_the_bound_or_for_another_rollout_is_refused():
    check_record(5, 5, [4, 4], 1, "exact")
    check_record(5, 5, [3, 5, 4], 2, "bounded")
    with pytest.raises(StaleRecord, match="version 3: max_staleness=1 staleness_mode=exact allows version 4 only"):
        check_record(5, 5, [4, 3], 1, "exact")
    with pytest.raises(StaleRecord, match="allows versions 3..5 only"):
        check_record(5, 5, [2], 2, "bounded")
    with pytest.raises(StaleRecord, match="version 6"):  # sampled by a version the learner has not made
        check_record(5, 5, [6], 2, "bounded")
    with pytest.raises(StaleRecord, match="handed rollout 4 where the learner trains rollout 5"):
        check_record(5, 4, [4], 1, "exact")


def rollout_of(versions: list[int]) -> Rollout:
    """A two-token rollout whose rows were sampled by `versions`."""
    n, zeros = len(versions), torch.zeros(len(versions), 2)
    ones = torch.ones(n, 2, dtype=torch.long)
    return Rollout(
        ones,
        ones,
        ones,
        ones,
        torch.ones(n, dtype=torch.bool),
        zeros,
        zeros,
        torch.zeros(n),
        ones,
        torch.tensor(versions),
    )


def test_the_learner_never_takes_a_record_sampled_by_a_version_older_than_n():
    """A record in the producer's queue stamped with version r - N - 1 is refused by take: never returned, so never
    trained on."""
    from types import SimpleNamespace

    spec = SimpleNamespace(max_staleness=1, mode="exact", lockstep=False)
    producer = RolloutProducer.__new__(RolloutProducer)
    producer.spec, producer.rng_after = spec, {}
    queued = []
    producer.records = SimpleNamespace(get=lambda timeout: queued.pop(0), qsize=lambda: len(queued))
    producer.process = SimpleNamespace(pid=0, is_alive=lambda: True)
    rollout = rollout_of([3, 2])  # rollout 4 with N = 1: version 3 only
    queued.append(("record", Record(4, rollout, None, torch.zeros(1, 1), torch.zeros(1), {}, 0.0, 0.0, 0)))
    with pytest.raises(StaleRecord, match="version 2"):
        producer.take(4)
    rollout = rollout_of([3, 3])
    queued.append(("record", Record(4, rollout, None, torch.zeros(1, 1), torch.zeros(1), {}, 0.0, 0.0, 0)))
    assert producer.take(4).rollout is rollout


# ---- the decoupled correction, by hand -------------------------------------------------------------------------------
def test_the_decoupled_correction_weighs_the_learner_over_the_behaviour_policy_by_hand():
    """Two sequences of 2 and 1 tokens: log pi_behaviour (the sampler's, a version behind) and log pi_learner (the
    proximal policy, the clip's reference). rho_t = pi_learner / pi_behaviour."""
    behaviour = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]])
    learner = torch.tensor([[-0.5, -2.5], [-1.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    rho = [[math.exp(0.5), math.exp(-0.5)], [math.exp(-1.0)]]  # 1.6487, 0.6065 | 0.3679
    token, _ = importance_weights(learner, behaviour, mask, "tis_token", cap=1.5)
    assert torch.allclose(token, torch.tensor([[1.5, rho[0][1]], [rho[1][0], 0.0]]))  # min(rho_t, 1.5)
    _, sequence = importance_weights(learner, behaviour, mask, "tis_sequence", cap=1.5)
    assert torch.allclose(sequence, torch.tensor([1.0, rho[1][0]]))  # prod: e^0 = 1, e^-1
    _, masked = importance_weights(learner, behaviour, mask, "mask_sequence", low=0.5, high=2.0)
    assert masked.tolist() == [1.0, 0.0]

    stats = importance_ratio_stats(learner, behaviour, mask, "tis_token", cap=1.5)
    flat = [rho[0][0], rho[0][1], rho[1][0]]
    assert stats["ratio_mean"].item() == pytest.approx(sum(flat) / 3)
    assert stats["ratio_min"].item() == pytest.approx(rho[1][0])
    assert stats["ratio_max"].item() == pytest.approx(rho[0][0])  # before the truncation at 1.5
    assert stats["cut_frac"].item() == pytest.approx(1 / 3)  # one token of three truncated
    stats = importance_ratio_stats(learner, behaviour, mask, "mask_token", low=0.5, high=2.0)
    assert stats["cut_frac"].item() == pytest.approx(1 / 3)  # 0.3679 < 0.5 masked
    stats = importance_ratio_stats(learner, behaviour, mask, "geometric", low=0.5, high=2.0)
    assert stats["ratio_max"].item() == pytest.approx(1.0) and stats["ratio_min"].item() == pytest.approx(rho[1][0])
    assert importance_ratio_stats(learner, behaviour, mask, "none") == {}


# ---- keys ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, says",
    [
        (["max_staleness=1"], "is_correction=none with old_logprobs=recompute would treat them as the current one"),
        (["max_staleness=1", "producer=inline", "is_correction=tis_token"], "use producer=auto or producer=process"),
        (["staleness_mode=bounded"], "staleness_mode=bounded does nothing with max_staleness=0"),
        (["producer_threads=1"], "producer_threads=1 does nothing with producer=auto max_staleness=0"),
        (["max_staleness=1", "is_correction=tis_token", "algo=dapo"], "dynamic_sampling=true samples again"),
    ],
)
def test_asynchronous_settings_that_cannot_run_are_one_line(embedded_task, tmp_path, overrides, says):
    assert says in train_error(tmp_path / "run", embedded_task / "cache", *overrides)


# ---- real runs -------------------------------------------------------------------------------------------------------
RUN = ["total_episodes=64", "logger=csv", "eval_every=0", "trainer.num_threads=1", "lr=3e-3"]


def metric_rows(run_dir):
    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        return [{k: v for k, v in row.items() if not k.startswith(MEASURED)} for row in csv.DictReader(f)]


def column(run_dir, name: str) -> list[float]:
    """A metric's values in metrics.csv, in order, where a row has it."""
    with open(run_dir / "csv" / "metrics.csv", newline="") as f:
        return [float(row[name]) for row in csv.DictReader(f) if row.get(name)]


def children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux /proc)."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(child) for child in f.read().split()]
    return found


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:  # gone
        return ""


def policy_hash(run_dir) -> str:
    return hashlib.sha256((run_dir / "policy" / "model.safetensors").read_bytes()).hexdigest()


def trained(base, name, *overrides):
    result = train(base / name, base / "cache", *RUN, *overrides)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return base / name


@pytest.mark.slow
def test_the_producer_process_at_lag_0_follows_the_inline_loops_trajectory(embedded_task):
    inline = trained(embedded_task, "inline")
    process = trained(embedded_task, "lockstep", "producer=process", "producer_threads=1")
    assert metric_rows(inline) == [
        {k: v for k, v in row.items() if k in metric_rows(inline)[0]} for row in metric_rows(process)
    ]
    assert policy_hash(inline) == policy_hash(process)
    assert set(column(process, "async/staleness_max")) == {0.0} and len(column(process, "async/staleness_max")) == 8


@pytest.mark.slow
@pytest.mark.parametrize("lag", [1, 2])
def test_exact_lag_is_reproducible_and_resumes_bit_identically_after_a_sigkill(embedded_task, lag):
    settings = [f"max_staleness={lag}", "is_correction=tis_token", "producer_threads=1"]
    once = trained(embedded_task, f"lag{lag}-a", *settings)
    twice = trained(embedded_task, f"lag{lag}-b", *settings)
    assert metric_rows(once) == metric_rows(twice) and policy_hash(once) == policy_hash(twice)
    assert json.loads((once / "summary.json").read_text())["curves"].startswith("curves.png: 7 panels of 7 drawn")
    assert column(once, "async/staleness_max") == [min(r, lag) for r in range(8)]  # rollout r: version max(0, r - N)

    killed = embedded_task / f"lag{lag}-killed"
    process = start(killed, embedded_task / "cache", *RUN, *settings, "keep_checkpoints=-1")
    wait_for(lambda: (killed / "checkpoints" / "step4.ckpt").exists(), process)
    producers = [pid for pid in children(process.pid) if "spawn_main" in command_line(pid)]
    assert len(producers) == 1
    process.send_signal(signal.SIGKILL)
    assert finish(process)[0] == -signal.SIGKILL and not (killed / "policy").exists()
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{producers[0]}") and "spawn_main" in command_line(producers[0]):
        assert time.monotonic() < deadline, "the producer outlived the learner killed with SIGKILL"
        time.sleep(0.1)
    resumed = train(killed, embedded_task / "cache", "resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert metric_rows(once) == metric_rows(killed) and policy_hash(once) == policy_hash(killed)


@pytest.mark.slow
@pytest.mark.parametrize("how, says", [("raise", "raised: "), ("exit", "died with exit code 3")])
def test_a_producer_that_raises_or_dies_stops_the_run_with_one_line_and_a_checkpoint(embedded_task, how, says):
    run = embedded_task / f"producer-{how}"
    result = train(
        run,
        embedded_task / "cache",
        *RUN,
        "max_staleness=1",
        "is_correction=tis_token",
        f"reward=tests.reward_functions:fails_in_the_producer_{how}",
    )
    assert result.returncode not in (0, None), result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "the rollout producer (pid " in lines[0] and says in lines[0], result.stderr[-3000:]
    assert sorted(p.name for p in (run / "checkpoints").glob("step*.ckpt"))  # the rollouts before it were kept
    assert "rollout producer" in (run / "summary.json").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 128 + 15), (signal.SIGINT, 128 + 2)])
def test_a_signal_to_the_whole_job_stops_both_sides_saves_and_resumes(embedded_task, sig, code):
    """As a terminal's Ctrl-C or a scheduler's SIGTERM reaches every process of the job: the producer ignores it, the
    learner stops, saves its checkpoint with the in-flight versions, and stops the producer; resume=auto continues."""
    run = embedded_task / f"signal-{sig.name}"
    settings = ["total_episodes=1600", "checkpoint_every=0", "eval.before=false", "max_staleness=1"]
    process = start(run, embedded_task / "cache", *settings, "is_correction=tis_token", preexec_fn=os.setpgrp)
    wait_for(
        lambda: (run / "samples.jsonl").exists() and len((run / "samples.jsonl").read_text().splitlines()) >= 16,
        process,
    )
    producers = [pid for pid in children(process.pid) if "spawn_main" in command_line(pid)]
    os.killpg(process.pid, sig)
    returncode, output = finish(process)
    assert returncode == code, output[-3000:]
    assert not any(os.path.exists(f"/proc/{pid}") and "spawn_main" in command_line(pid) for pid in producers)
    checkpoint = torch.load(run / "checkpoints" / "interrupted.ckpt", weights_only=True)
    rollouts = checkpoint["rloo_rollouts"]
    assert 2 <= rollouts < 200 and checkpoint["rloo_async"]["producer_rng"] is not None
    assert sorted(checkpoint["rloo_async"]["versions"])[-1] <= rollouts  # never a version the learner had not made
    resumed = train(run, embedded_task / "cache", "resume=auto", f"total_episodes={8 * (rollouts + 2)}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert column(run, "async/staleness_max")[-2:] == [1.0, 1.0]


def test_the_memory_plan_counts_the_producers_policy_copies_and_its_rollout_beside_the_update():
    from rloo.run.cli import compose_train_config
    from rloo.run.memory_plan import plan_config

    _, _, inline, _ = plan_config(compose_train_config([]))
    _, shape, produced, _ = plan_config(compose_train_config(["max_staleness=2", "is_correction=tis_token"]))
    assert shape.producer_copies == 3 and "producer policy copies" not in inline
    assert produced["producer policy copies"] == pytest.approx(3 * inline["policy weights"])
    static = sum(inline[k] for k in ("policy weights", "reference weights", "reward model weights", "AdamW state"))
    update = inline["gradients"] + inline["activations"] + inline["logit chunks"]
    rollout = inline["KV cache"] + inline.get("decode weights", 0.0)
    assert inline["peak"] == pytest.approx(static + max(update, rollout))
    assert produced["peak"] == pytest.approx(static + 3 * inline["policy weights"] + update + rollout)


def test_curves_get_a_staleness_panel_only_where_the_run_logged_staleness_or_a_correction():
    from rloo.run.plots import training_panels

    plain = [{"step": 1, "objective/scores": 1.0, "objective/kl": 0.1}]
    assert [title for title, _, _ in training_panels(plain)][-1] == "clip fractions"
    produced = [plain[0] | {"async/staleness_mean": 1.0, "async/staleness_max": 1.0, "is/cut_frac": 0.01}]
    title, _, keys = training_panels(produced)[-1]
    assert title == "staleness and correction" and keys == [
        "async/staleness_mean",
        "async/staleness_max",
        "is/cut_frac",
    ]
