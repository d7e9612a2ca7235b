"""The policy versions the learner publishes to the producer: max_staleness + 1 copies of the policy whose weights
live in shared memory (torch.multiprocessing), version v in copy v % count, and in a shared `[count]` tensor the
version each copy holds, which the producer reads before and after it samples (a copy overwritten while it sampled
would say so)."""

from __future__ import annotations

import copy

import torch


class PolicyVersions:
    """`count` shared-memory copies of `policy`, made by the learner before the producer starts (they travel to it
    as the process's arguments, their storage shared, not copied)."""

    def __init__(self, policy: torch.nn.Module, count: int):
        self.copies = [copy.deepcopy(policy).requires_grad_(False).eval().share_memory() for _ in range(count)]
        self.held = torch.full((count,), -1, dtype=torch.int64).share_memory_()  # [count] each copy's version

    def __len__(self) -> int:
        return len(self.copies)

    @torch.no_grad()
    def write(self, policy: torch.nn.Module, version: int) -> None:
        """The learner's weights as they are now, published as `version`."""
        slot = version % len(self)
        self.held[slot] = -1  # being written: no version
        for target, source in zip(self.copies[slot].state_dict().values(), policy.state_dict().values()):
            target.copy_(source)
        self.held[slot] = version

    def holds(self, version: int) -> bool:
        return int(self.held[version % len(self)]) == version

    def policy_of(self, version: int) -> torch.nn.Module:
        """The copy holding `version` (the producer samples with it)."""
        if not self.holds(version):
            raise RuntimeError(
                f"policy version {version} is not among those published (copies hold {self.held.tolist()})"
            )
        return self.copies[version % len(self)]

    def saved(self) -> dict[int, dict]:
        """The versions held, for a checkpoint: {version: state_dict (cloned)}."""
        return {
            int(v): {name: t.clone() for name, t in self.copies[i].state_dict().items()}
            for i, v in enumerate(self.held.tolist())
            if v >= 0
        }

    @torch.no_grad()
    def restore(self, saved: dict[int, dict]) -> None:
        """A checkpoint's versions back in their copies."""
        for version, state in saved.items():
            slot = int(version) % len(self)
            self.copies[slot].load_state_dict(state)
            self.held[slot] = int(version)
