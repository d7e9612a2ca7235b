"""rloo.algorithms.schedule: the update loop every algorithm shares, against a hand-written trace."""

import torch

from rloo.algorithms.schedule import micro_batches, mini_batch_indices


def test_micro_batches_mark_each_mini_batchs_last_and_step_after_it():
    """8 rows, 2 mini-batches of 2 micro-batches of 2, two epochs: the trace a nested loop would give by hand."""
    events = []
    passes = (mini_batch_indices(8, 2, 2, 2, whole_groups=False, shuffle=False, device="cpu") for _ in range(2))
    for micro in micro_batches(passes, step=lambda: events.append("step")):
        events.append((micro.index.tolist(), micro.last_of_mini_batch))
    epoch = [([0, 1], False), ([2, 3], True), "step", ([4, 5], False), ([6, 7], True), "step"]
    assert events == epoch + epoch


def test_shuffled_whole_groups_stay_together_and_cover_every_row_once():
    torch.manual_seed(0)
    (mini_batch,) = mini_batch_indices(12, 3, 6, 1, whole_groups=True, shuffle=True, device="cpu")
    rows = torch.cat(mini_batch)
    assert sorted(rows.tolist()) == list(range(12))
    groups = rows.view(4, 3) // 3
    assert (groups == groups[:, :1]).all() and not torch.equal(rows, torch.arange(12))
