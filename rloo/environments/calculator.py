"""A calculator the model can call, for multi-step arithmetic word problems (data=word_problems): a turn holding
`<calc>expression</calc>` gets the result back (`Result: 333`) and the episode goes on; a turn without one is the
answer, checked against the row's `answer` (the number after "Answer:", else the turn's last number): reward 1.0 or
0.0, and the episode ends. Expressions are numbers, + - * / and parentheses, evaluated from their syntax tree (no
eval): anything else gets `Error: ...` back."""

from __future__ import annotations

import ast
import operator
import re

CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)
ANSWER = re.compile(r"Answer:\s*(-?[\d,]*\.?\d+)")
NUMBER = re.compile(r"-?\d[\d,]*\.?\d*")
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
LIMIT = 1e12  # results past this are refused, as a guard against runaway products


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression; ValueError for anything but numbers, + - * / and parentheses."""

    def value(node) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return -value(node.operand) if isinstance(node.op, ast.USub) else value(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            result = OPERATORS[type(node.op)](value(node.left), value(node.right))
            if abs(result) > LIMIT:
                raise ValueError("too large")
            return result
        raise ValueError("not arithmetic")

    try:
        tree = ast.parse(expression.strip().replace("x", "*").replace("×", "*"), mode="eval")
        return value(tree.body)
    except (SyntaxError, ZeroDivisionError, RecursionError) as error:
        raise ValueError(str(error)) from None


def shown(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else f"{number:.4g}"


def final_answer(text: str) -> str | None:
    """The number a turn answers with: after "Answer:", else its last number (commas dropped)."""
    found = ANSWER.findall(text) or NUMBER.findall(text)
    return found[-1].replace(",", "").rstrip(".") if found else None


class Calculator:
    def reset(self, row: dict) -> None:
        self.answer = str(row["answer"])

    def step(self, action: str) -> tuple[str | None, float | None, bool]:
        call = CALL.search(action)
        if call is not None and "Answer:" not in action[: call.start()]:
            try:
                return f"Result: {shown(evaluate(call.group(1)))}", None, False
            except ValueError:
                return "Error: not an arithmetic expression", None, False
        answer = final_answer(action)
        correct = answer is not None and answer.lstrip("+") == self.answer
        return None, 1.0 if correct else 0.0, True
