"""The episode service in a process of its own (torch.multiprocessing, spawn), beside the learner: it samples,
scores and stamps rollout r while the learner trains on an earlier one.

    learner (Lightning's loop)                          producer (this module's `produce`)
      step r: publish version r -- shared weights -->     rollout r' : wait for the version it may use
              (PolicyVersions, + a small message)          (rloo.service.staleness), sample and score it
              take rollout r   <-- a bounded queue --     with that version's copy, put the Record
              train on it                                   (its version on every row)

Weights and records move through torch.multiprocessing only: shared-memory tensors and bounded queues. The
producer draws its prompts in the train loader's order (rloo.data.prompts.PromptBatches); the learner checks each
record against the batch Lightning hands it. At max_staleness 0 the two run in lockstep, the learner's random state
handed over with each version and taken back with each record, so the trajectory is the inline loop's.

Faults: the producer's error reaches the learner as one line (RolloutProducerFailed); a producer that dies is seen
within half a second; the producer dies with the learner (PR_SET_PDEATHSIG, and it watches its parent) and ignores
Ctrl-C and SIGTERM, which the learner handles, then stops it.
"""

from __future__ import annotations

import atexit
import ctypes
import dataclasses
import os
import queue
import signal
import sys
import traceback
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Callable

import torch

from rloo.generation.rollout import PhaseTimer, Rollout, clock
from rloo.service.episodes import EpisodeService, RolloutNotes
from rloo.service.staleness import check_record, slots, version_to_sample
from rloo.service.weights import PolicyVersions
from rloo.utils.errors import ProducerFailed
from rloo.utils.memory import peak_rss_mb

POLL_S = 0.5  # how often a waiting side looks at the other's liveness


class RolloutProducerFailed(ProducerFailed):
    """The producer process raised or died: the learner stops with this one line."""


@dataclass
class Published:
    """A version the learner has written into its copy: what the producer needs beside the weights."""

    version: int
    trainer_state: object = None  # rloo.rewards.trl_arguments.TrainerState, for reward functions that take it
    rng_state: torch.Tensor | None = None  # lockstep (max_staleness 0): the learner's random state to sample from


@dataclass
class Record:
    """One finished rollout: scored, each row stamped with the version that sampled it."""

    rollout_index: int
    rollout: Rollout
    notes: RolloutNotes
    prompt_ids: torch.Tensor  # [B, P] the batch it was sampled from, as collated
    rng_after: torch.Tensor  # the producer's random state after it
    timings: dict[str, float]  # seconds by phase (generate, ref_logprobs, scores, ...)
    busy_s: float  # sampling and scoring it
    idle_s: float  # waiting for the version it needed before that
    tokens: int  # the model's tokens sampled
    peak_rss_mb: float = 0.0  # the producer process's peak resident memory so far


@dataclass
class ProducerSpec:
    """Everything the producer process is started with (pickled once; the models' tensors are shared, not copied)."""

    config: object  # the algorithm's config (rloo.algorithms.configs.EstimatorConfig): k, sampling, batch sizes
    tokenizer: object
    reference: torch.nn.Module | None
    reward_model: torch.nn.Module | None
    versions: PolicyVersions
    build_parts: Callable  # tokenizer -> (reward, environment, external rollout), built in the producer
    batches: object  # iterable of collated batches from first_rollout on (rloo.data.prompts.PromptBatches)
    first_rollout: int
    max_staleness: int
    mode: str  # rloo.service.staleness.STALENESS_MODES
    threads: int
    rng_state: torch.Tensor | None  # the producer's random state before first_rollout (None in lockstep)
    parent_pid: int = field(default_factory=os.getpid)

    @property
    def lockstep(self) -> bool:
        return self.max_staleness == 0


def produce(spec: ProducerSpec, published: "queue.Queue", records: "queue.Queue", stop) -> None:
    """The producer process: rollouts from spec.first_rollout on, each with the version rloo.service.staleness
    picks, put on `records` (bounded: the producer waits where the learner is behind)."""
    try:
        die_with_parent()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner handles Ctrl-C and SIGTERM, then stops us
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        torch.set_num_threads(spec.threads)
        reward, environment, external = spec.build_parts(spec.tokenizer)
        cfg = spec.config
        service = EpisodeService(
            spec.tokenizer,
            spec.reference,
            spec.reward_model,
            cfg.k,
            cfg.sampling,
            cfg.generation_batch_size,
            cfg.shared_prefix,
            reward,
            environment,
            external,
        )
        if spec.rng_state is not None:
            torch.set_rng_state(spec.rng_state)
        known: dict[int, Published] = {}
        for rollout_index, batch in enumerate(spec.batches, start=spec.first_rollout):
            waited = clock()
            version = wait_for_version(spec, rollout_index, known, published, stop)
            if version is None:
                return
            idle, meta, started = clock() - waited, known[version], clock()
            if meta.rng_state is not None:
                torch.set_rng_state(meta.rng_state)
            policy, timer = spec.versions.policy_of(version), PhaseTimer()
            harness = SimpleNamespace(policy=policy, tokenizer=spec.tokenizer, config=cfg, device=torch.device("cpu"))
            rollout, notes = service.rollout(
                policy, batch, timer, version, harness=harness, trainer_state=meta.trainer_state
            )
            if not spec.versions.holds(version):  # the learner wrote over the copy while it sampled: never trained on
                raise RuntimeError(
                    f"policy version {version}'s copy was overwritten while rollout {rollout_index} sampled"
                )
            record = Record(
                rollout_index,
                rollout,
                notes,
                batch["prompt_ids"],
                torch.get_rng_state(),
                dict(timer.seconds),
                clock() - started,
                idle,
                int(rollout.completion_mask.sum()),
                peak_rss_mb(),
            )
            if not put_until_stopped(records, ("record", record), stop):
                return
        wait_until_stopped(spec, stop)  # the records' tensors live in this process until the learner has them
    except BaseException as error:  # one line for the learner; the traceback on the producer's stderr
        traceback.print_exc(file=sys.stderr)
        line = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        if put_until_stopped(records, ("error", line), stop):
            wait_until_stopped(spec, stop)  # records put before it still read this process's tensors


def wait_for_version(spec: ProducerSpec, rollout_index: int, known: dict, published, stop) -> int | None:
    """The version that samples `rollout_index`, once the learner has published it (None: told to stop)."""
    while True:
        newest = max(known, default=-1)
        version = version_to_sample(rollout_index, newest, spec.max_staleness, spec.mode)
        if version is not None and version in known:
            return version
        if stop.is_set() or os.getppid() != spec.parent_pid:
            return None
        try:
            message = published.get(timeout=POLL_S)
        except queue.Empty:
            continue
        if message is None:
            return None
        known[message.version] = message
        for old in [v for v in known if v <= message.version - len(spec.versions)]:
            del known[old]  # its copy has been written over


def wait_until_stopped(spec: ProducerSpec, stop) -> None:
    while not stop.wait(POLL_S) and os.getppid() == spec.parent_pid:
        pass


def put_until_stopped(records, item, stop) -> bool:
    while not stop.is_set():
        try:
            records.put(item, timeout=POLL_S)
            return True
        except queue.Full:
            continue
    return False


def die_with_parent() -> None:
    """Linux: the kernel kills this process when its parent dies (a SIGKILLed learner leaves no orphan)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # elsewhere the producer still watches its parent's pid between rollouts


class RolloutProducer:
    """The learner's handle on the producer process: `publish` a version, `take` a rollout, `close`."""

    def __init__(self, spec: ProducerSpec):
        self.spec = spec
        context = torch.multiprocessing.get_context("spawn")
        self.published = context.Queue()
        self.records = context.Queue(maxsize=slots(spec.max_staleness))
        self.stop_event = context.Event()
        self.process = context.Process(
            target=produce,
            args=(spec, self.published, self.records, self.stop_event),
            name="rloo-producer",
            daemon=True,
        )
        self.rng_after: dict[int, torch.Tensor] = {}  # by rollout taken: the producer's random state after it
        self.trainer_states: dict[int, dict | None] = {}  # by version published: its trainer state, as a dict
        self.closed = False
        self.waited_s = 0.0  # the learner's seconds waiting in the last `take`
        self.depth = 0  # records ready when the last `take` began

    def start(self) -> "RolloutProducer":
        self.process.start()
        # before multiprocessing's own exit handler, which would SIGTERM the producer (ignored) and wait on it forever
        atexit.register(self.close)
        return self

    @property
    def lockstep(self) -> bool:
        return self.spec.lockstep

    def publish(self, policy: torch.nn.Module, version: int, trainer_state=None) -> None:
        """The learner's weights now, as `version` (in lockstep with the learner's random state)."""
        self.spec.versions.write(policy, version)
        self.announce(version, trainer_state)

    def announce(self, version: int, trainer_state=None) -> None:
        """Tell the producer that `version` is in its copy (written now, or restored from a checkpoint)."""
        self.trainer_states[version] = None if trainer_state is None else dataclasses.asdict(trainer_state)
        for old in [v for v in self.trainer_states if v <= version - len(self.spec.versions)]:
            del self.trainer_states[old]
        rng = torch.get_rng_state() if self.lockstep else None
        self.published.put(Published(version, trainer_state, rng))

    def take(self, rollout_index: int) -> Record:
        """Rollout `rollout_index`, once the producer has it; checked against the staleness bound before it is
        trained on (rloo.service.staleness.check_record)."""
        started = clock()
        try:
            self.depth = self.records.qsize()
        except NotImplementedError:  # macOS
            self.depth = -1
        while True:
            try:
                kind, item = self.records.get(timeout=POLL_S)
                break
            except queue.Empty:
                if not self.process.is_alive():
                    raise RolloutProducerFailed(
                        f"the rollout producer (pid {self.process.pid}) died with exit code {self.process.exitcode} "
                        f"before rollout {rollout_index}: nothing trained on it"
                    ) from None
        if kind == "error":
            raise RolloutProducerFailed(f"the rollout producer (pid {self.process.pid}) raised: {item}")
        self.waited_s = clock() - started
        versions = item.rollout.behaviour_version.tolist()
        check_record(rollout_index, item.rollout_index, versions, self.spec.max_staleness, self.spec.mode)
        self.rng_after = {
            rollout_index: item.rng_after,
            **{k: v for k, v in self.rng_after.items() if k == rollout_index - 1},
        }
        return item

    def rng_before(self, rollout_index: int) -> torch.Tensor | None:
        """The producer's random state before `rollout_index` (what a checkpoint restarts it from)."""
        if rollout_index == self.spec.first_rollout:
            return self.spec.rng_state
        return self.rng_after.get(rollout_index - 1)

    def close(self) -> None:
        """Stop the producer and wait for it (at most a few seconds, then it is killed). Its versions and random
        states stay readable here, for a checkpoint taken after it."""
        if self.process.pid is None or self.closed:
            return
        self.closed = True
        atexit.unregister(self.close)
        self.stop_event.set()
        self.published.put(None)
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        for channel in (self.published, self.records):
            channel.cancel_join_thread()
            channel.close()
