"""The judge interface and the A/B order draw; the win rate over the verdicts is rloo.evaluation.intervals'."""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass

import torch

from rloo.rewards.user_code import Interrupted, call_guarded, raised
from rloo.utils.errors import JudgeFailed

OUTCOMES = {1.0: "win", 0.5: "tie", 0.0: "loss", None: "invalid"}


@dataclass(frozen=True)
class Verdict:
    """One judgement of (candidate, other): outcome 1.0 win, 0.5 tie, 0.0 loss, None invalid.

    `swapped` is True when the candidate was shown second (as B); `raw` is the judge's answer where there is one;
    `error` says why a judgement is invalid when no answer came back (transport failure, refused request).
    """

    outcome: float | None
    swapped: bool = False
    raw: str | None = None
    error: str | None = None

    @property
    def label(self) -> str:
        return OUTCOMES[self.outcome]

    @property
    def order(self) -> str:
        return "other_first" if self.swapped else "candidate_first"


class Judge:
    """Compares candidates[i] with others[i] for prompts[i]; subclasses implement `judge`.

    `setup(device)` loads whatever the judge needs (models, tokenizers); it is called once before the first
    `judge` call, so that building a judge from the config loads nothing.
    """

    name = "judge"

    def setup(self, device="cpu") -> None:
        pass

    def __repr__(self) -> str:
        shown = {
            k: v
            for k, v in vars(self).items()
            if not k.startswith("_")
            and isinstance(v, (str, int, float, bool, tuple, type(None)))
            and not (isinstance(v, str) and len(v) > 80)
        }
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in shown.items())})"

    def judge(self, prompts: list[str], candidates: list[str], others: list[str]) -> list[Verdict]:
        raise NotImplementedError


def in_callers_torch_modes(function):
    """`function` to be run in another thread with this thread's grad mode and autocast (both are per thread): a
    judge with a model computes as it would have in the evaluation's own thread."""
    grad = torch.is_grad_enabled()
    autocasts = [(d, torch.get_autocast_dtype(d)) for d in ("cpu", "cuda") if torch.is_autocast_enabled(d)]

    def call(*args, **kwargs):
        with torch.set_grad_enabled(grad), contextlib.ExitStack() as stack:
            for device_type, dtype in autocasts:
                stack.enter_context(torch.autocast(device_type, dtype=dtype))
            return function(*args, **kwargs)

    return call


def judge_pairs(
    judge: Judge, prompts: list[str], candidates: list[str], others: list[str], timeout_s: float = 0, should_stop=None
) -> list[Verdict]:
    """`judge.judge(...)` under guard (rloo.rewards.user_code): one Verdict per pair, or `JudgeFailed` in one line
    naming the
    judge and what it did (raised anything, SystemExit included; ran past `timeout_s`, eval.judge_timeout_s; returned
    the wrong count or something not a Verdict with outcome 1, 0.5, 0 or None). `Interrupted` when SIGTERM came.
    timeout_s=0: called directly in the main thread, without the guard."""
    name = type(judge).__name__
    call = in_callers_torch_modes(judge.judge) if timeout_s > 0 else judge.judge  # a thread: carry the torch modes
    try:
        verdicts = call_guarded(
            call, (prompts, candidates, others), {}, timeout_s, should_stop, name, "eval.judge_timeout_s"
        )
    except Interrupted:
        raise
    except (Exception, SystemExit) as error:  # a judge's failure is its own; KeyboardInterrupt stops the run
        raise JudgeFailed(f"judge {name} {raised(error)}") from error
    if isinstance(verdicts, (str, bytes, dict)) or not hasattr(verdicts, "__len__"):
        raise JudgeFailed(f"judge {name} returned {type(verdicts).__name__}, not a list of one Verdict per pair")
    if len(verdicts) != len(prompts):
        raise JudgeFailed(f"judge {name} returned {len(verdicts)} verdicts for {len(prompts)} pairs")
    for verdict in verdicts:
        if not isinstance(verdict, Verdict):
            raise JudgeFailed(
                f"judge {name} returned {type(verdict).__name__} ({verdict!r:.40}), not a rloo.judges.Verdict"
            )
        if verdict.outcome not in OUTCOMES or isinstance(verdict.outcome, bool):
            raise JudgeFailed(
                f"judge {name} returned a Verdict with outcome {verdict.outcome!r}: allowed 1.0 (win), 0.5 (tie), "
                "0.0 (loss), None (invalid)"
            )
    return list(verdicts)


def swap_orders(seed: int, prompts: list[str], candidates: list[str], others: list[str]) -> list[bool]:
    """Per pair, whether the candidate is shown second. Drawn from (seed, pair contents), so a pair gets the same
    order whatever its position in the batch, and a re-run with the same seed hits the verdict cache."""
    return [
        random.Random(f"{seed}\x00{p}\x00{c}\x00{o}").random() < 0.5 for p, c, o in zip(prompts, candidates, others)
    ]
