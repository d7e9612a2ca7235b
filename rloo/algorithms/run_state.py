"""What a run has done, kept in every checkpoint: the counters, the guard's tally and the random states a resumed
rollout redraws from. Plain data; the module updates it and Lightning's checkpoint hooks carry it."""

from __future__ import annotations

from dataclasses import dataclass

from rloo.utils.resume import restore_rng_states, rng_states


@dataclass
class RunState:
    rollouts: int = 0  # rollouts trained on (Lightning's global_step counts optimiser steps)
    episodes: int = 0  # completions trained on, summed over devices
    sampled: int = 0  # completions generated, summed over devices (more than episodes where groups were dropped)
    train_seconds: float = 0.0  # seconds in training steps (rollout and update; no evaluation, no checkpoint)
    skipped_updates: int = 0  # guard: optimiser steps taken without gradients (non-finite)
    bad_in_a_row: int = 0  # guard: rollouts in a row with a skipped update
    no_signal_rollouts: int = 0  # guard: rollouts in which no prompt's completions differed in score
    no_signal_in_a_row: int = 0
    rollout_was_bad: bool = False  # guard: the current rollout skipped an update
    rollout_finished: bool = True  # between rollouts: a checkpoint now continues with the states as they are
    rng_before_rollout: dict | None = (
        None  # random states as the current rollout began (a checkpoint inside it redoes it)
    )
    rng_to_restore: dict | None = None  # a checkpoint's states, restored as training starts

    def begin_rollout(self) -> None:
        self.rng_before_rollout, self.rollout_finished, self.rollout_was_bad = rng_states(), False, False

    def finish_rollout(self, completions: int, seconds: float, sampled: int) -> None:
        self.rollouts += 1
        self.episodes += completions
        self.sampled += sampled
        self.train_seconds += seconds
        self.rollout_finished = True
        self.bad_in_a_row = self.bad_in_a_row + 1 if self.rollout_was_bad else 0

    def note_signal(self, spread: bool) -> None:
        """After a trained rollout: whether any prompt's completions differed in score."""
        self.no_signal_rollouts += 0 if spread else 1
        self.no_signal_in_a_row = 0 if spread else self.no_signal_in_a_row + 1

    def rng_for_checkpoint(self) -> dict:
        """Between rollouts the states as they are; inside one (Ctrl-C, an error), those it began with."""
        return rng_states() if self.rollout_finished else self.rng_before_rollout

    def save(self, checkpoint: dict, rng_by_rank: list | None) -> None:
        checkpoint["rloo_episodes"] = self.episodes
        checkpoint["rloo_sampled"] = self.sampled
        checkpoint["rloo_train_seconds"] = self.train_seconds
        checkpoint["rloo_rollouts"] = self.rollouts
        checkpoint["rloo_guard"] = {
            "skipped_updates": self.skipped_updates,
            "bad_in_a_row": self.bad_in_a_row,
            "no_signal_rollouts": self.no_signal_rollouts,
            "no_signal_in_a_row": self.no_signal_in_a_row,
        }
        checkpoint["rloo_rng"] = self.rng_for_checkpoint()
        if rng_by_rank is not None:  # every rank samples from its own generators
            checkpoint["rloo_rng_by_rank"] = rng_by_rank

    def load(self, checkpoint: dict, world_size: int, rank: int) -> None:
        self.episodes = checkpoint.get("rloo_episodes", 0)
        self.sampled = checkpoint.get("rloo_sampled", self.episodes)  # a checkpoint from before it was counted
        self.train_seconds = checkpoint.get("rloo_train_seconds", 0.0)
        self.rollouts = checkpoint.get("rloo_rollouts", 0)
        guard = checkpoint.get("rloo_guard", {})
        self.skipped_updates, self.bad_in_a_row = guard.get("skipped_updates", 0), guard.get("bad_in_a_row", 0)
        self.no_signal_rollouts = guard.get("no_signal_rollouts", 0)
        self.no_signal_in_a_row = guard.get("no_signal_in_a_row", 0)
        by_rank = checkpoint.get("rloo_rng_by_rank") or []
        # the same world size resumes each rank's own states; another one starts every rank from rank 0's
        self.rng_to_restore = by_rank[rank] if len(by_rank) == world_size else checkpoint.get("rloo_rng")

    def restore_rng(self) -> None:
        if self.rng_to_restore is not None:
            restore_rng_states(self.rng_to_restore)
            self.rng_to_restore = None
