"""Which policy version samples which rollout, and the check every record passes before the learner trains on it.

Versions: version v is the policy after v rollouts were trained on; the learner trains rollout r from version r.
With `max_staleness` N:

    exact    rollout r is sampled by version max(0, r - N): a run is reproducible from its seed (N = 0: the
             synchronous loop's rollout r, sampled by version r)
    bounded  rollout r is sampled by the newest version the learner has published, never older than r - N: the
             producer runs ahead as fast as it can and waits (is paced) where it would fall further behind, so no
             rollout is discarded and no prompt starves

Pure functions, no torch.
"""

from __future__ import annotations

from rloo.utils.errors import ProducerFailed

STALENESS_MODES = ("exact", "bounded")


class StaleRecord(ProducerFailed):
    """A record the learner must not train on: sampled by a version its staleness bound does not allow, or for
    another rollout than the one being trained."""


def oldest_version(rollout: int, max_staleness: int) -> int:
    """The oldest policy version allowed to sample `rollout` (and, in exact mode, the one that does)."""
    return max(0, rollout - max_staleness)


def version_to_sample(rollout: int, published: int, max_staleness: int, mode: str) -> int | None:
    """The version that samples `rollout` when versions up to `published` exist, or None: wait for a newer one."""
    oldest = oldest_version(rollout, max_staleness)
    if published < oldest:
        return None
    return oldest if mode == "exact" else published


def slots(max_staleness: int) -> int:
    """Policy copies the producer needs: versions r - N .. r may be read while rollout r trains (exact lag reads
    r - N, and the learner publishes version r before it takes rollout r), so N + 1 of them."""
    return max_staleness + 1


def check_record(rollout: int, record_rollout: int, versions: list[int], max_staleness: int, mode: str) -> None:
    """Refuse a record for another rollout than `rollout`, or with a row sampled by a version the bound forbids."""
    if record_rollout != rollout:
        raise StaleRecord(f"the producer handed rollout {record_rollout} where the learner trains rollout {rollout}")
    oldest, newest = oldest_version(rollout, max_staleness), rollout
    bad = [v for v in versions if v < oldest or v > newest or (mode == "exact" and v != oldest)]
    if bad:
        wanted = f"version {oldest}" if mode == "exact" else f"versions {oldest}..{newest}"
        raise StaleRecord(
            f"rollout {rollout} holds rows sampled by policy version {bad[0]}: max_staleness={max_staleness} "
            f"staleness_mode={mode} allows {wanted} only; not trained on"
        )
