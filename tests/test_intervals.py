"""Intervals for proportions stay in [0, 1]: Wilson's score interval, by hand, where it is used."""

import pytest
import torch

from rloo.evaluation.heldout import summarize_eval
from rloo.evaluation.intervals import proportion_interval, seed_interval


def test_wilsons_interval_by_hand():
    # 1 right of 16 (the 0.062, which the normal interval put at [-0.060, 0.185]), z = 1.959964:
    # z^2 = 3.841459; denominator 1 + z^2/16 = 1.240091; centre (0.0625 + z^2/32) / 1.240091 = 0.147203;
    # half z * sqrt(0.0625 * 0.9375 / 16 + z^2 / 1024) / 1.240091
    #      = z * sqrt(0.0036621 + 0.0037514) / 1.240091 = 0.136084
    low, high = proportion_interval(1 / 16, 16)
    assert low == pytest.approx(0.011119, abs=1e-6) and high == pytest.approx(0.283287, abs=1e-6)
    # none right of 10: [0, 2 * (z^2 / 20) / (1 + z^2 / 10)] = [0, 0.384146 / 1.384146] = [0, 0.277533]
    assert proportion_interval(0.0, 10) == (0.0, pytest.approx(0.277533, abs=1e-6))
    assert proportion_interval(1.0, 10) == (pytest.approx(0.722467, abs=1e-6), 1.0)  # the mirror image
    # 60 of 100: centre (0.6 + 0.019207) / 1.038415 = 0.596306; half 1.959964 * sqrt(0.0024 + 0.0000960) / 1.038415
    assert proportion_interval(0.6, 100) == (pytest.approx(0.502003, abs=1e-6), pytest.approx(0.690599, abs=1e-6))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 16, 64, 1000])
def test_wilsons_interval_stays_in_the_unit_range_and_holds_the_rate(n):
    for right in range(n + 1):
        low, high = proportion_interval(right / n, n)
        assert 0.0 <= low <= right / n <= high <= 1.0


def test_held_out_proportions_get_wilsons_interval_and_rewards_the_normal_one():
    correct = torch.tensor([1.0] + [0.0] * 15)  # 1 of 16
    reward = torch.tensor([-2.0, 0.0, 2.0, 4.0])  # mean 1, sd sqrt(20/3) = 2.581989, se 1.290994
    per_row = {
        "length": torch.ones(16),
        "eos": torch.ones(16),
        "accuracy": correct,
        "pass@4": correct,
        "majority_vote": correct,
        "outcome": torch.full((16,), float("nan")),
    }
    summary = summarize_eval(per_row)
    for key in ("accuracy", "pass@4", "majority_vote"):
        assert summary[f"eval/{key}_ci_low"] == pytest.approx(0.011119, abs=1e-6)
        assert summary[f"eval/{key}_ci_high"] == pytest.approx(0.283287, abs=1e-6)
    per_row = {**per_row, "length": torch.ones(4), "eos": torch.ones(4), "reward/r": reward}
    per_row = {k: v[:4] for k, v in per_row.items()}
    summary = summarize_eval(per_row)
    assert summary["eval/reward/r_ci_low"] == pytest.approx(1 - 1.959964 * 1.290994, abs=1e-5)  # below 0: allowed
    assert summary["eval/reward/r_ci_high"] == pytest.approx(1 + 1.959964 * 1.290994, abs=1e-5)


def test_a_proportions_interval_over_seeds_is_cut_to_the_unit_range():
    from rloo.report import metric_range, verifiable_markdown

    # 0.02, 0.10: mean 0.06, sd 0.056569, se 0.04, t(1) 12.706: half 0.50824 -> [-0.44824, 0.56824] uncut
    assert seed_interval([0.02, 0.10]) == pytest.approx((0.06, -0.44824, 0.56824), abs=1e-5)
    assert seed_interval([0.02, 0.10], (0.0, 1.0)) == pytest.approx((0.06, 0.0, 0.56824), abs=1e-5)
    assert metric_range("accuracy") == metric_range("pass@4") == metric_range("win_rate") == (0.0, 1.0)
    assert metric_range("reward/length") is None
    rows = [
        {"status": "ok", "setting": "algo=rloo", "win_rate": None, "outcomes": {"accuracy": a, "reward/r": a - 1}}
        for a in (0.02, 0.10)
    ]
    table = verifiable_markdown(rows)
    assert "0.060 [0.000, 0.568]" in table and "-0.940 [-1.448, -0.432]" in table
