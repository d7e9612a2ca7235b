"""The learner's side of asynchronous training: the producer process started with the run (and from a checkpoint's
in-flight state), each step's version published and its rollout taken, the staleness metrics, what a checkpoint
keeps. The producer itself is rloo/service/producer.py; which version samples which rollout, rloo/service/staleness.py.

At step r the learner publishes version r (its weights now), then takes rollout r, sampled by version r - N (exact)
or by a version in r - N .. r (bounded). A checkpoint holds the versions the next rollouts need and the producer's
random state before the next one, so an exact-lag run resumes bit-identically.
"""

from __future__ import annotations

import dataclasses

import torch

from rloo.generation.rollout import PhaseTimer, Rollout
from rloo.rewards.trl_arguments import TrainerState
from rloo.service.producer import ProducerSpec, RolloutProducer
from rloo.service.staleness import StaleRecord, slots
from rloo.service.weights import PolicyVersions

CHECKPOINT_KEY = "rloo_async"


def start_producer(module, saved: dict | None) -> RolloutProducer:
    """The producer process for `module`'s run, from rollout `module.state.rollouts` on; `saved`: a checkpoint's
    CHECKPOINT_KEY entry (the versions it held and the producer's random state), None for a fresh start."""
    cfg, datamodule = module.config, module.trainer.datamodule
    versions = PolicyVersions(module.policy, slots(cfg.max_staleness))
    if saved is not None:
        versions.restore(saved["versions"])
    # its own random stream from the checkpoint's, or a fresh run's from the learner's; none in lockstep (handed over)
    rng = None if cfg.max_staleness == 0 else saved["producer_rng"] if saved is not None else torch.get_rng_state()
    service = module.episode_service
    spec = ProducerSpec(
        cfg,
        module.tokenizer,
        service.reference,
        service.reward_model,
        versions,
        module.producer_parts,
        datamodule.rollout_batches(module.state.rollouts),
        module.state.rollouts,
        cfg.max_staleness,
        cfg.staleness_mode,
        module.producer_threads,
        rng,
    )
    producer = RolloutProducer(spec).start()
    if saved is not None:
        for version, state in sorted(saved["trainer_states"].items()):  # the restored versions, announced again
            producer.announce(int(version), TrainerState(**state) if state else None)
    return producer


def collect_from_producer(module, batch: dict, timer: PhaseTimer) -> Rollout:
    """Publish version r = state.rollouts, take rollout r from the producer (checked against the staleness bound
    and against the batch Lightning handed the step), and note its staleness, queue and sides' seconds."""
    producer, index = module.producer, module.state.rollouts
    trainer_state = module.trainer_state() if module.episode_service.reward is not None else None
    producer.publish(module.policy, index, trainer_state)
    record = producer.take(index)
    if not torch.equal(record.prompt_ids, batch["prompt_ids"].cpu()):
        raise StaleRecord(
            f"the producer's rollout {index} was sampled from other prompts than the train loader's batch {index}"
        )
    if producer.lockstep:  # the random state continues as the inline loop's would
        torch.set_rng_state(record.rng_after)
    for phase, seconds in record.timings.items():
        timer.seconds[phase] = timer.seconds.get(phase, 0.0) + seconds
    timer.seconds["wait_for_rollout"] = producer.waited_s
    module.last_notes = record.notes
    staleness = (index - record.rollout.behaviour_version).float()  # [N] versions behind the learner
    module.async_metrics = {
        "async/staleness_mean": staleness.mean(),
        "async/staleness_max": staleness.max(),
        "async/queue_depth": float(producer.depth),
        "async/producer_busy_s": record.busy_s,
        "async/producer_idle_s": record.idle_s,
        "async/learner_wait_s": producer.waited_s,
        "async/producer_tokens_per_s": record.tokens / max(record.busy_s, 1e-9),
        "memory/producer_peak_rss_mb": record.peak_rss_mb,  # its shared weights count in both processes' RSS
    }
    return Rollout(**{f.name: getattr(record.rollout, f.name).to(module.device) for f in dataclasses.fields(Rollout)})


def checkpoint_state(module) -> dict:
    """What an asynchronous run's checkpoint holds beyond the learner's: the policy versions the producer still
    reads, their trainer states, and its random state before the next rollout."""
    producer = module.producer
    saved = producer.spec.versions.saved()
    return {
        "versions": saved,
        "trainer_states": {v: producer.trainer_states.get(v) for v in saved},
        "producer_rng": producer.rng_before(module.state.rollouts),
    }
