"""The calculator environment and its word problems: a call gets its result back, an answer ends the episode with
1 or 0, nothing but arithmetic is evaluated; every generated problem's expression gives its answer."""

import re

import pytest

from rloo.environments.calculator import Calculator, evaluate, final_answer
from rloo.toy import word_problems


@pytest.mark.parametrize(
    "expression, value",
    [("23*17-58", 333), ("12 * 7 + 5", 89), ("(3+4)*2", 14), ("-8/4", -2.0), ("23 x 17", 391), ("1.5*4", 6.0)],
)
def test_arithmetic_is_evaluated(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression", ["__import__('os')", "2**10", "a+1", "1/0", "9e99*9e99", ""])
def test_anything_else_is_refused(expression):
    with pytest.raises(ValueError):
        evaluate(expression)


def test_a_call_is_answered_and_an_answer_ends_the_episode():
    calculator = Calculator()
    calculator.reset({"prompt": "...", "answer": "333"})
    assert calculator.step("First <calc>23*17-58</calc>") == ("Result: 333", None, False)
    assert calculator.step("<calc>open('x')</calc>") == ("Error: not an arithmetic expression", None, False)
    assert calculator.step("So the total is 333.\nAnswer: 333") == (None, 1.0, True)
    assert calculator.step("Answer: 334") == (None, 0.0, True)
    assert calculator.step("I think it is 1,333 or 333") == (None, 1.0, True)  # no "Answer:": the last number
    assert calculator.step("Answer: 333 <calc>1+1</calc>") == (None, 1.0, True)  # a call after the answer: answered
    assert final_answer("no number") is None


def test_every_word_problem_is_solved_by_its_expression():
    rows = word_problems.rows(200, seed=3)
    assert len({r["prompt"][-1]["content"] for r in rows}) > 190
    for row in rows:
        assert str(int(evaluate(row["expression"]))) == row["answer"]
        assert row["prompt"][0] == {"role": "system", "content": word_problems.SYSTEM}
        assert row["prompt"][1:-1] == word_problems.DEMO and row["prompt"][-1]["role"] == "user"
        assert re.search(r"\b\d\d\*\d\d\b", row["expression"])  # a product of two two-digit numbers in every one
    assert word_problems.rows(5, seed=3) == rows[:5]  # the same seed, the same rows
