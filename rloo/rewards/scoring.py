"""What scores a completion: the reward model, Python functions, or a weighted sum of them (`reward=` in
conf/train.yaml).

    reward=model                                            # the reward model (model.reward_model), the default
    reward=rloo.toy.rule_rewards:topic_recall                    # a function (prompts, completions) -> one float each
    reward='model + 0.5*rloo.toy.rule_rewards:topic_recall'      # a weighted sum; each term is [weight*]name

A function receives the prompts and completions as TRL hands them to its reward functions, and returns a sequence of
floats, one per completion. Where the data's prompts are text: two lists of strings (decoded, special tokens
removed). Where they are chat messages (conversational data): `prompts` the message lists the model was prompted with
(without a trailing assistant reference) and `completions` one message list each, `[{"role": "assistant",
"content": text}]`, so that `completions[i][0]["content"]` is the text
(rloo.data.chat.completion_text reads either form).
Positionally, or by keyword where it names `prompts` or `completions` or takes **kwargs (TRL's convention,
`def reward(completions, **kwargs)`); any other column of the data it names arrives by name. A None is "does not
apply": that function adds nothing to that completion's reward (the others' weighted values still sum; counted as
reward/none/<name>); a completion that no term scores is a failure under reward_errors. A function that raises,
returns the wrong count or a value that is not finite stops the run with a one-line error naming it
(`reward_errors=raise`), or, with `reward_errors=mask`, its completions get no score: they leave the leave-one-out
baseline and are counted (`reward/masked`).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from rloo.data.chat import is_messages
from rloo.rewards.trl_arguments import ARGUMENTS, RewardLog, TrainerState, trl_arguments
from rloo.rewards.user_code import Failure, Interrupted, call_guarded, import_user_module, raised
from rloo.utils.errors import ConfigError, RewardFunctionError
from rloo.utils.numbers import finite_float, is_number, shown

MODEL = "model"
ENV = "env"  # the environment's return of a multi-turn episode (env=; rloo.environments.base)
BUILT_IN = (MODEL, ENV)
REWARD_ERRORS = ("raise", "mask")
TERM = re.compile(
    r"^\s*(?:(?P<weight>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*\*\s*)?(?P<name>[\w.]+(?::\w+)?)\s*$"
)


@dataclass(frozen=True)
class RewardTerm:
    weight: float
    name: str  # "model", or "module:function"


def parse_reward(spec: str) -> list[RewardTerm]:
    """'model + 0.5*pkg.mod:fn' -> [RewardTerm(1.0, 'model'), RewardTerm(0.5, 'pkg.mod:fn')]."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(
            f"reward={spec!r} is not allowed: model, module:function, or a sum like 'model + 0.5*module:function'"
        )
    terms = []
    for part in spec.split("+"):
        match = TERM.match(part)
        if match is None or (match["name"] not in BUILT_IN and ":" not in match["name"]):
            raise ConfigError(
                f"reward={spec!r}: term {part.strip()!r} is not [weight*]model, [weight*]env or "
                "[weight*]module:function"
            )
        weight = float(match["weight"]) if match["weight"] else 1.0
        if finite_float(weight) is None:
            raise ConfigError(
                f"reward={spec!r}: the weight {match['weight']} of {match['name']} is not finite in float32 (rewards "
                "are float32: a weight's size is at most 3.4e38)"
            )
        terms.append(RewardTerm(weight, match["name"]))
    names = [t.name for t in terms]
    if len(set(names)) != len(names):
        raise ConfigError(f"reward={spec!r} names a term twice: give it one weight")
    return terms


FROM_PYTHON = "rloo.fit"  # reward=rloo.fit:<name>: a callable handed to rloo.fit in this process
REGISTERED: dict[str, Callable] = {}


def function_name(function: Callable) -> str:
    """The `reward=` name of a Python callable: `module:function` where that imports back to this very function (a
    resume from the command line finds it), else `rloo.fit:<name>`, registered for this process (a lambda, a
    closure, a partial)."""
    module, qualname = getattr(function, "__module__", None), getattr(function, "__qualname__", "")
    if module and qualname.isidentifier():
        try:
            if getattr(importlib.import_module(module), qualname, None) is function:
                return f"{module}:{qualname}"
        except ImportError:
            pass
    base = re.sub(r"\W", "_", getattr(function, "__name__", type(function).__name__)).strip("_") or "function"
    name, n = base, 1
    while REGISTERED.get(name, function) is not function:
        n += 1
        name = f"{base}_{n}"
    REGISTERED[name] = function
    return f"{FROM_PYTHON}:{name}"


def load_function(name: str, key: str = "reward") -> Callable:
    """`module:function`, imported; a one-line ConfigError naming `key` if it is not there (checked before any
    model loads)."""
    module_name, _, function_name = name.partition(":")
    if module_name == FROM_PYTHON:
        if function_name not in REGISTERED:
            raise ConfigError(
                f"{key}: {name!r} was a function handed to rloo.fit in another process: hand it to rloo.fit again, "
                "or give it as module:function"
            )
        return REGISTERED[function_name]
    from rloo.utils.moved import MOVED

    module = import_user_module(name, key)
    function = getattr(module, function_name, None)
    if not callable(function) and module_name in MOVED:  # a module that became a package of the same name
        raise ConfigError(
            f"{key}: {module_name} moved to {MOVED[module_name]}: write {MOVED[module_name]}:{function_name}"
        )
    if not callable(function):
        raise ConfigError(f"{key}: {module_name} has no function {function_name!r}")
    return function


def is_conversational(prompts: list) -> bool:
    """Whether prompts are chat messages (TRL's conversational format): each one a list of {role, content} dicts."""
    return bool(prompts) and all(is_messages(p) for p in prompts)


def trl_form(prompts: list, completions: list[str]) -> tuple[list, list]:
    """prompts and completions as TRL gives them to reward functions: for conversational prompts, each completion
    as the assistant's message list `[{"role": "assistant", "content": text}]`; text prompts leave both as they are."""
    if not is_conversational(prompts):
        return prompts, completions
    return [list(p) for p in prompts], [  # a multi-turn episode's completion is its messages already
        c if isinstance(c, list) else [{"role": "assistant", "content": c}] for c in completions
    ]


def columns_asked_for(function: Callable, columns: dict[str, list]) -> dict[str, list]:
    """The dataset columns a reward function names as parameters (all of them for one that takes **kwargs)."""
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return columns
    return {p.name: columns[p.name] for p in parameters if p.name in columns}


NOT_APPLICABLE = float("-inf")  # a function's None in its values (nan: it failed there); Reward adds nothing for it


def keyword_parameters(function: Callable) -> set[str] | None:
    """Which of `prompts` and `completions` a reward function takes by keyword: the ones it names, both where it takes
    **kwargs (TRL's convention); None where it names neither (it takes them positionally, as its first two)."""
    parameters = inspect.signature(function).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return {"prompts", "completions"}
    return ({"prompts", "completions"} & set(parameters)) or None


def reward_arguments(function: Callable, prompts: list, completions: list, columns: dict) -> tuple[tuple, dict]:
    """How a reward function is called (keyword_parameters): its positional and keyword arguments, the data's other
    columns it asks for by name."""
    kwargs = columns_asked_for(function, columns)
    if (by_name := keyword_parameters(function)) is None:
        return (prompts, completions), kwargs
    named = {"prompts": prompts, "completions": completions}
    return (), kwargs | {key: value for key, value in named.items() if key in by_name}


def check_columns(reward: "Reward", available: list[str], where: str) -> None:
    """Every column a reward function needs (a parameter after prompts and completions, without a default) is a
    column of the data: one line before any model loads, not a TypeError at the first rollout."""
    for name, function in reward.functions.items():
        parameters = list(inspect.signature(function).parameters.values())
        if keyword_parameters(function) is not None:
            parameters = [p for p in parameters if p.name not in ("prompts", "completions")]
        else:
            parameters = parameters[2:]
        needed = [
            p.name
            for p in parameters
            if p.default is inspect.Parameter.empty
            and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        ]
        if missing := [column for column in needed if column not in available and column not in ARGUMENTS]:
            raise ConfigError(
                f"reward: {name} asks for {', '.join(missing)}, which {where} does not have "
                f"(columns: {', '.join(available) or 'none besides the prompt'})"
            )


def call_reward_function(
    name: str,
    function: Callable,
    prompts: list[str],
    completions: list[str],
    columns: dict[str, list] | None = None,
    timeout_s: float = 0,
    should_stop=None,
) -> tuple[Tensor, str | None]:
    """The function's scores `[N]` float32, nan where it failed, and what went wrong in one line (None: nothing).
    `columns`: the dataset row's other columns, one value per completion, passed by name to a function that asks
    for them: `def exact_answer(prompts, completions, answer)`. With `timeout_s` > 0 it runs under guard
    (rloo.rewards.user_code; 0: called directly, in the main thread, for graders that time themselves with
    signal.alarm).
    Anything it raises fails it, SystemExit included; KeyboardInterrupt still stops the run."""
    n, nothing = len(completions), torch.full((len(completions),), float("nan"))
    args, kwargs = reward_arguments(function, prompts, completions, columns or {})
    try:
        values = call_guarded(
            awaited(function), args, kwargs, timeout_s, should_stop, f"reward {name}", "reward_timeout_s"
        )
    except Interrupted:
        raise
    except (Exception, SystemExit) as error:  # a user's function: any error is its own
        return nothing, Failure.of(f"reward function {name} {raised(error)}", error)
    if callable(getattr(values, "tolist", None)) and getattr(values, "ndim", None) is not None:  # array, tensor
        if values.ndim != 1:
            return nothing, (
                f"reward function {name} returned a {values.ndim}-d {type(values).__name__} ({shown(values)}), not "
                "one number per completion (a list or a 1-d array)"
            )
        values = values.tolist()  # a bool array's values are bools, counted as 0 and 1 below
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__len__"):
        return nothing, (
            f"reward function {name} returned {type(values).__name__} ({shown(values)}), not one number per completion"
        )
    if len(values) != n:
        return nothing, f"reward function {name} returned {len(values)} values for {n} completions"
    values = [float(v) if type(v).__name__ in ("bool", "bool_") else v for v in values]  # as TRL casts them
    if wrong := [v for v in values if v is not None and not is_number(v)]:
        return nothing, (
            f"reward function {name} returned {type(wrong[0]).__name__} values ({shown(wrong[0])}), not numbers "
            "(a string is not a score: return float(...), or None where it does not apply)"
        )
    floats = [NOT_APPLICABLE if v is None else finite_float(v) for v in values]
    bad = [i for i, f in enumerate(floats) if f is None]
    scores = torch.tensor([float("nan") if f is None else f for f in floats], dtype=torch.float32)
    if bad:
        return scores, (
            f"reward function {name} returned a value that is not finite in float32 for {len(bad)} of {n} "
            f"completions (first: {shown(values[bad[0]])} at {bad[0]})"
        )
    return scores, None


def awaited(function: Callable) -> Callable:
    """`function`, its result awaited where it is a coroutine (an `async def` reward function, as TRL takes them):
    in this thread, or, where an event loop already runs here (a notebook), in a thread of its own."""

    def call(*args, **kwargs):
        result = function(*args, **kwargs)
        if not inspect.isawaitable(result):
            return result
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop runs in this thread
            return asyncio.run(awaitable_coroutine(result))
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, awaitable_coroutine(result)).result()

    return call


async def awaitable_coroutine(awaitable):
    return await awaitable


class Reward:
    """The weighted sum of the terms of `reward=` for decoded completions; `model_scores` supplies the reward
    model's term. Under reward_errors=mask a misbehaving function leaves nan where it failed (the caller masks)."""

    def __init__(self, terms: list[RewardTerm], on_error: str, timeout_s: float = 0):
        self.terms, self.on_error, self.timeout_s = terms, on_error, timeout_s
        self.should_stop = None  # set by rloo.train: whether SIGTERM came (a guarded call then stops waiting)
        self.functions = {t.name: load_function(t.name) for t in terms if t.name not in BUILT_IN}
        self.last_term_means: dict[str, float] = {}
        self.last_not_applicable: dict[str, int] = {}  # completions each term returned None for
        self.last_errors: list[str] = []
        self.log = RewardLog()  # what the functions logged with log_metric / log_extra (rloo.rewards.trl_arguments)
        self.trainer_state: TrainerState | None = None  # set by the training step before each call

    def judge_failure(self, error: str | None) -> None:
        """A function's failure (call_reward_function's line) as reward_errors says: raised in one line, from the
        user's own exception (raise), or kept in `last_errors` (mask)."""
        if error is not None and self.on_error == "raise":
            raise RewardFunctionError(error) from getattr(error, "cause", None)
        if error is not None:
            self.last_errors.append(error)

    def asks_for(self, argument: str) -> bool:
        """Whether some function takes `argument` (by name, or through **kwargs): what need not be built otherwise."""
        return any(argument in columns_asked_for(f, {argument: None}) for f in self.functions.values())

    @property
    def uses_model(self) -> bool:
        return any(t.name == MODEL for t in self.terms)

    def __call__(
        self,
        prompts: list,
        completions: list,
        model_scores: Tensor | None,
        columns: dict | None = None,
        env_returns: Tensor | None = None,
        completion_ids: list[list[int]] | None = None,
    ) -> Tensor:
        """sum over terms of weight * value, the functions called in TRL's form (`trl_form`: prompts as the data
        has them, text or messages); a term whose function returned None for a completion adds nothing to
        it (the weights are not renormalised), and a completion no term scored is a failure under reward_errors."""
        prompts, completions = trl_form(prompts, completions)
        columns = (columns or {}) | trl_arguments(self.log, self.trainer_state, completion_ids)
        total = torch.zeros(len(completions), dtype=torch.float32)
        scored = torch.zeros(len(completions), dtype=torch.bool)
        self.last_term_means, self.last_not_applicable, self.last_errors = {}, {}, []
        for term in self.terms:
            if term.name == MODEL:
                values = model_scores.float().cpu()
            elif term.name == ENV:  # the sum of the environment's rewards (0 where it gave none)
                values = env_returns.float().cpu()
            else:
                function = self.functions[term.name]
                values, error = call_reward_function(
                    term.name, function, prompts, completions, columns, self.timeout_s, self.should_stop
                )
                self.judge_failure(error)
            applies = values != NOT_APPLICABLE
            if term.name != MODEL:  # a function, or the environment
                self.last_not_applicable[term.name] = int((~applies).sum())
            finite = torch.isfinite(values)
            self.last_term_means[term.name] = float(values[finite].mean()) if finite.any() else float("nan")
            total += term.weight * torch.where(applies, values, 0.0)
            scored |= applies
        if not scored.all():
            error = (
                f"no term of reward={self.spec!r} scored {int((~scored).sum())} of {len(completions)} completions "
                "(each function returned None)"
            )
            if self.on_error == "raise":
                raise RewardFunctionError(error)
            self.last_errors.append(error)
            total[~scored] = float("nan")
        return total

    @property
    def spec(self) -> str:
        return " + ".join(f"{t.weight:g}*{t.name}" for t in self.terms)

    def columns_read(self, available: list[str]) -> list[str]:
        """The data columns of `available` that some reward function reads (every one for a function taking
        **kwargs), in the data's order: what an evaluation record keeps beside the completion it scored."""
        asked = set()
        for function in self.functions.values():
            asked |= set(columns_asked_for(function, dict.fromkeys(available)))
        return [name for name in available if name in asked]

    def function_total(self, values: dict) -> Tensor:
        """The weighted sum of the function terms (the reward model's left out) from `function_values`' output; as in
        __call__, a term that returned None for a completion adds nothing to it, and a failure (nan) leaves no sum."""
        total = torch.zeros(len(next(iter(values.values()))), dtype=torch.float32)
        for term in self.terms:
            if term.name != MODEL and (term.name != ENV or ENV in values):  # env: an episode's return, where given
                value = values[term.name.rsplit(":", 1)[-1]].float().cpu()
                total += term.weight * torch.where(value == NOT_APPLICABLE, 0.0, value)  # a failure (nan) stays
        return total

    def function_values(
        self, prompts: list, completions: list[str], columns: dict | None = None, completion_ids: list | None = None
    ) -> dict:
        """Each function term's values `[N]` (nan where it failed, NOT_APPLICABLE where it returned None), by its
        short name (after the colon): what held-out evaluation reports as eval/reward/<name>, over the finite ones.
        Guarded as in training: a function that fails stops the run in the same one line (reward_errors=raise), or
        leaves nan, counted as eval/reward/<name>_failed, with its line added to `last_errors` (mask; the evaluation
        empties it first). What the functions log with log_metric / log_extra here is not recorded: rloo's held-out
        metrics are eval/*, and an evaluation's samples are eval_samples.jsonl."""
        prompts, completions = trl_form(prompts, completions)
        columns = (columns or {}) | trl_arguments(RewardLog(), self.trainer_state, completion_ids)
        values = {}
        for name, function in self.functions.items():
            value, error = call_reward_function(
                name, function, prompts, completions, columns, self.timeout_s, self.should_stop
            )
            self.judge_failure(error)
            values[name.rsplit(":", 1)[-1]] = value
        return values
