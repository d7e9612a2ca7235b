"""The win rate and its interval by hand, the A/B order draw, and the local judges against slow references."""

import inspect
import math

import pytest
import torch
from transformers import AutoTokenizer, GPTNeoXForCausalLM

from rloo.evaluation.heldout import INVALID, summarize_eval
from rloo.evaluation.intervals import win_rate_summary
from rloo.judges import Judge, Verdict, judge_pairs, swap_orders
from rloo.judges.prompts import TLDR_COMPARISON_NEXT_TOKEN, parse_preference, render_comparison
from rloo.models.loading import load_reward_model, load_tokenizer
from rloo.rewards.user_code import Interrupted
from rloo.toy.judge import OracleJudge
from rloo.toy.task import oracle_judge
from rloo.utils.errors import JudgeFailed
from tests import plugin_judges
from tests.builders import judge_from_conf
from tests.tiny_models import tiny_model


def test_win_rate_and_interval_by_hand():
    # scores 1, 1, 0.5, 0 (one invalid left out): rate 2.5/4 = 0.625; Wilson at n = 4, z = 1.959964:
    # denominator 1 + z^2/4 = 1.960365; centre (0.625 + z^2/8) / 1.960365 = 0.563764;
    # half z * sqrt(0.625 * 0.375 / 4 + z^2 / 64) / 1.960365 = z * sqrt(0.058594 + 0.060023) / 1.960365 = 0.344337
    s = win_rate_summary([1.0, 1.0, 0.5, 0.0, None])
    assert (s["wins"], s["ties"], s["losses"], s["invalid"], s["num_judged"]) == (2, 1, 1, 1, 4)
    assert s["win_rate"] == 0.625
    assert s["win_rate_ci_low"] == pytest.approx(0.219427, abs=1e-5)
    assert s["win_rate_ci_high"] == pytest.approx(0.908101, abs=1e-5)  # the normal interval's went past 1


def test_interval_narrows_with_n():
    # 60 wins, 40 losses: p = 0.6, Wilson [0.502003, 0.690599] (tests/test_intervals.py works it by hand)
    s = win_rate_summary([1.0] * 60 + [0.0] * 40)
    assert s["win_rate"] == 0.6
    assert s["win_rate_ci_low"] == pytest.approx(0.502003, abs=1e-6)
    assert s["win_rate_ci_high"] == pytest.approx(0.690599, abs=1e-6)
    wide = win_rate_summary([1.0] * 6 + [0.0] * 4)
    assert wide["win_rate_ci_high"] - wide["win_rate_ci_low"] > 2 * (s["win_rate_ci_high"] - s["win_rate_ci_low"])
    lost = win_rate_summary(
        [0.0] * 8
    )  # every pair lost: [0, z^2/(8 + z^2)] = [0, 3.841459 / 11.841459] = [0, 0.324408]
    assert lost["win_rate_ci_low"] == 0.0 and lost["win_rate_ci_high"] == pytest.approx(0.324408, abs=1e-6)


def test_invalid_is_never_a_win():
    assert win_rate_summary([1.0, None, None])["win_rate"] == 1.0  # left out of the rate, and counted
    nothing = win_rate_summary([None, None])
    assert nothing["invalid"] == 2 and math.isnan(nothing["win_rate"])


def test_summarize_eval_decodes_invalid_and_skips_unjudged():
    per_row = {
        "score": torch.tensor([1.0, 2.0, 3.0]),
        "length": torch.tensor([2.0, 4.0, 6.0]),
        "eos": torch.tensor([1.0, 0.0, 1.0]),
        "outcome": torch.tensor([1.0, INVALID, 0.0]),
    }
    s = summarize_eval(per_row)
    assert s["eval/win_rate"] == 0.5 and s["eval/invalid"] == 1 and s["eval/score"] == 2.0
    assert s["eval/mean_length"] == 4.0 and s["eval/eos_frac"] == pytest.approx(2 / 3)
    per_row["outcome"] = torch.full((3,), float("nan"))
    assert "eval/win_rate" not in summarize_eval(per_row)


def test_a_non_finite_reward_model_score_is_invalid_never_a_win_or_a_loss():
    """judge=reward_model: a pair with a nan or inf score is an invalid verdict, counted in eval/invalid; the
    policy's own reward-model score averages the finite rows and says how many (and how many it left out)."""
    from rloo.judges.reward_model import RewardModelJudge

    judge = RewardModelJudge(path=None, tokenizer=None, append_eos=True, tie_margin=0.0, batch_size=4, dtype="fp32")
    verdicts = [judge.compare(*pair) for pair in [(1.0, 0.0), (float("nan"), 0.0), (0.0, float("inf")), (0.0, 2.0)]]
    assert [v.outcome for v in verdicts] == [1.0, None, None, 0.0]
    assert "non-finite reward-model score (nan vs 0.0)" in verdicts[1].error
    per_row = {
        "score": torch.tensor([1.0, float("nan"), 3.0, float("-inf")]),
        "length": torch.ones(4),
        "eos": torch.ones(4),
        "outcome": torch.tensor([INVALID if v.outcome is None else v.outcome for v in verdicts]),
    }
    s = summarize_eval(per_row)
    assert (s["eval/invalid"], s["eval/num_judged"], s["eval/win_rate"]) == (2, 2, 0.5)
    assert (s["eval/score"], s["eval/score_rows"], s["eval/score_nonfinite"]) == (2.0, 2, 2)
    per_row["score"] = torch.full((4,), float("nan"))
    s = summarize_eval(per_row)
    assert "eval/score" not in s and (s["eval/score_rows"], s["eval/score_nonfinite"]) == (0, 4)
    del per_row["score"]  # no reward model
    assert not [k for k in summarize_eval(per_row) if k.startswith("eval/score")]


def test_swap_orders_is_seeded_per_pair_not_per_position():
    prompts, a, b = [f"p{i}" for i in range(200)], [f"a{i}" for i in range(200)], [f"b{i}" for i in range(200)]
    first = swap_orders(0, prompts, a, b)
    assert first == swap_orders(0, prompts, a, b)
    assert swap_orders(0, prompts[::-1], a[::-1], b[::-1]) == first[::-1]  # a pair keeps its order wherever it is
    assert first != swap_orders(1, prompts, a, b)
    assert 70 < sum(first) < 130  # about half shown swapped


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("Comparison: A keeps the key points.\nPreferred: A", "A"),
        ("Comparison: B is shorter and complete.\nPreferred: B", "B"),
        ("B", "B"),
        (" a ", "A"),
        ("**Preferred:** B", "B"),
        ("Comparison: both are fine.", None),
        ("Preferred: A\nPreferred: B", None),
        ("Preferred: A\nPreferred: A", None),
        ("Preferred: C", None),
        ("Preferred: A or B", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_preference_is_strict(answer, expected):
    assert parse_preference(answer) == expected


def test_oracle_judge_is_the_task_scorer():
    prompt = "POST: cat boat rain\n\nTL;DR:"
    pairs = [(" cat boat rain", " cat boat"), (" cat lol", " cat boat"), (" cat boat", " cat boat")]
    verdicts = OracleJudge().judge([prompt] * 3, [c for c, _ in pairs], [o for _, o in pairs])
    assert [v.outcome for v in verdicts] == [oracle_judge(prompt, c, o) for c, o in pairs] == [1.0, 0.0, 0.5]


TEXTS = [
    ("POST: cat boat rain\n\nTL;DR:", " cat boat rain", " rain"),
    ("POST: house\n\nTL;DR:", " house house house house", " house"),
    ("POST: a b c d e f g\n\nTL;DR:", " a", " a b c d e f g"),
]


def test_reward_model_judge_matches_one_at_a_time_scoring(tiny_run_assets):
    judge = judge_from_conf(
        "reward_model",
        path=str(tiny_run_assets / "reward_model"),
        tokenizer=str(tiny_run_assets / "policy"),
        batch_size=2,
    )
    judge.setup()
    prompts, candidates, others = map(list, zip(*TEXTS))
    verdicts = judge.judge(prompts, candidates, others)
    # slow reference: each text alone, no padding, score at the last (EOS) token
    tokenizer = load_tokenizer(str(tiny_run_assets / "policy"))
    model = load_reward_model(str(tiny_run_assets / "reward_model"), tokenizer=tokenizer)

    def score(text):
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]])
        hidden = model.base_model(input_ids=ids).last_hidden_state[0, -1]
        return model.score(hidden).item()

    for (p, c, o), verdict in zip(TEXTS, verdicts):
        diff = score(p + c) - score(p + o)
        assert float(verdict.raw) == pytest.approx(diff, abs=1e-3)
        assert verdict.outcome == float(diff > 0)
    tied = judge_from_conf(
        "reward_model",
        path=str(tiny_run_assets / "reward_model"),
        tokenizer=str(tiny_run_assets / "policy"),
        tie_margin=1e9,
    )
    assert {v.outcome for v in tied.judge(prompts, candidates, others)} == {0.5}


@pytest.fixture
def hf_judge_model(tmp_path, tokenizer):
    torch.manual_seed(3)
    tiny_model("gpt_neox", tokenizer, max_position_embeddings=512).save_pretrained(tmp_path / "judge")
    tokenizer.save_pretrained(tmp_path / "judge")
    return tmp_path / "judge"


def test_hf_judge_matches_a_slow_reference_and_undoes_the_swap(hf_judge_model):
    judge = judge_from_conf("hf", path=str(hf_judge_model), labels=("A", "B"), batch_size=2, seed=5)
    prompts, candidates, others = map(list, zip(*TEXTS))
    verdicts = judge.judge(prompts, candidates, others)
    swapped = swap_orders(5, prompts, candidates, others)
    assert [v.swapped for v in verdicts] == swapped
    tokenizer = AutoTokenizer.from_pretrained(hf_judge_model)
    model = GPTNeoXForCausalLM.from_pretrained(hf_judge_model).eval()
    label_a, label_b = (tokenizer(x, add_special_tokens=False)["input_ids"][0] for x in ("A", "B"))
    for (p, c, o), s, verdict in zip(TEXTS, swapped, verdicts):
        text = render_comparison(TLDR_COMPARISON_NEXT_TOKEN, p, *((o, c) if s else (c, o)))
        logits = model(torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])).logits[0, -1]
        a_preferred = logits[label_a] > logits[label_b]
        candidate_wins = bool(a_preferred) != s
        assert verdict.outcome == float(candidate_wins)
        p_a = torch.softmax(logits[[label_a, label_b]], -1)[0].item()
        assert float(verdict.raw.split("=")[1]) == pytest.approx(p_a, abs=1e-3)


def test_hf_judge_with_a_position_biased_model_follows_the_order(hf_judge_model):
    judge = judge_from_conf("hf", path=str(hf_judge_model), labels=("A", "B"), seed=0)
    judge.setup()
    label_a = judge.label_ids[0]
    judge.model.get_output_embeddings().register_forward_hook(
        lambda m, i, out: out.index_add(-1, torch.tensor([label_a]), torch.full(out.shape[:-1] + (1,), 100.0))
    )
    n = 40
    verdicts = judge.judge([f"POST: p{i}\n\nTL;DR:" for i in range(n)], [" x"] * n, [" y"] * n)
    assert {v.swapped for v in verdicts} == {True, False}
    assert all(
        v.outcome == (0.0 if v.swapped else 1.0) for v in verdicts
    )  # always "A": the candidate wins when shown first


def test_hf_judge_refuses_labels_that_are_not_one_token(hf_judge_model):
    with pytest.raises(ValueError, match="judge.labels"):
        judge_from_conf("hf", path=str(hf_judge_model), labels=("Summary A is better", "B")).setup()


# ---- plug-in judges under guard (rloo.judges.judge_pairs) ------------------------------------------------------
RAISES, EXITS = (  # the failing judges' own lines, as a failure names them
    f"tests/plugin_judges.py:{inspect.getsourcelines(judge.judge)[1] + 1}"
    for judge in (plugin_judges.Raises, plugin_judges.Exits)
)
PAIRS = (["p1", "p2", "p3"], ["long answer", "a", "same"], ["short", "longer", "same"])


@pytest.mark.parametrize(
    "judge, message",
    [
        (plugin_judges.Raises(), f"judge Raises raised at {RAISES} in judge: RuntimeError: the grader crashed"),
        (plugin_judges.Exits(), f"judge Exits raised at {EXITS} in judge: SystemExit: 0"),
        (plugin_judges.WrongCount(), "judge WrongCount returned 2 verdicts for 3 pairs"),
        (plugin_judges.Floats(), "judge Floats returned float (1.0), not a rloo.judges.Verdict"),
        (plugin_judges.BoolOutcomes(), "judge BoolOutcomes returned a Verdict with outcome True: allowed 1.0 (win)"),
    ],
)
@pytest.mark.parametrize("timeout_s", [0, 30])
def test_a_misbehaving_judge_fails_in_one_line_naming_what_it_did(judge, message, timeout_s):
    with pytest.raises(JudgeFailed) as caught:
        judge_pairs(judge, *PAIRS, timeout_s=timeout_s)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_a_well_behaved_plugin_judge_passes_through_the_guard():
    assert [v.outcome for v in judge_pairs(plugin_judges.Longest(), *PAIRS, timeout_s=30)] == [1.0, 0.0, 0.5]


def test_a_hanging_judge_fails_at_its_timeout_and_stops_waiting_on_sigterm():
    import time

    started = time.monotonic()
    with pytest.raises(
        JudgeFailed, match=r"judge Hangs raised TimeoutError: no result after 0.5 s \(eval.judge_timeout_s\)"
    ):
        judge_pairs(plugin_judges.Hangs(), *PAIRS, timeout_s=0.5)
    assert time.monotonic() - started < 60  # a bound on a hang (the judge never returns), not on speed
    stop_after = time.monotonic() + 0.3
    with pytest.raises(Interrupted):
        judge_pairs(plugin_judges.Hangs(), *PAIRS, timeout_s=600, should_stop=lambda: time.monotonic() > stop_after)
    assert time.monotonic() - started < 300


def test_a_keyboard_interrupt_inside_a_judge_still_stops_the_run():
    class Interrupts(Judge):
        def judge(self, prompts, candidates, others):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        judge_pairs(Interrupts(), *PAIRS, timeout_s=30)


def test_a_guarded_judge_runs_in_the_callers_grad_mode_and_autocast():
    """Both are per thread: the guard's thread takes them from the evaluation's."""
    seen = {}

    class Records(Judge):
        def judge(self, prompts, candidates, others):
            seen["grad"] = torch.is_grad_enabled()
            seen["autocast"] = torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu")
            return [Verdict(0.5)] * len(prompts)

    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        judge_pairs(Records(), *PAIRS, timeout_s=30)
    assert seen == {"grad": False, "autocast": torch.bfloat16}
    judge_pairs(Records(), *PAIRS, timeout_s=30)
    assert seen == {"grad": True, "autocast": False}
