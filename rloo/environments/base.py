"""An environment, as `env.target` names it: a Python class with

    reset(row)           a new episode for one data row: {"prompt": as the data has it, **its other columns}
    step(action_text)    the model's turn as text -> (reply, reward, done)

`reply` is the environment's answer (text, or None for none), `reward` a float or None (none this turn), `done`
whether the episode ends. An episode's return is the sum of its rewards (0 where it gave none, as when max_turns or
the token budget cut it off before its end): the reward term `env` (`reward=env`, or `'env + 0.5*m:f'`). One
instance per episode, built with `env.kwargs`; every call runs under the user-code guard (rloo.rewards.user_code:
`env.timeout_s`, SIGTERM), and anything it raises or returns wrongly stops the run in one line naming the class and
what it did (EnvironmentFailed).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Callable

from rloo.generation.settings import EpisodeSettings
from rloo.rewards.user_code import Interrupted, call_guarded, import_user_module, one_line
from rloo.utils.errors import ConfigError, EnvironmentFailed


@dataclass(frozen=True)
class Step:
    """What an environment said to one turn."""

    reply: str | None
    reward: float | None
    done: bool


def load_environment(target: str) -> Callable:
    """The class `module:Class` names; a one-line ConfigError where it does not import or is not a class."""
    module_name, _, name = str(target).partition(":")
    if not module_name or not name:
        raise ConfigError(f"env.target={target!r}: give the environment class as module:Class")
    module = import_user_module(str(target), "env.target")
    found = getattr(module, name, None)
    if not isinstance(found, type) or not all(callable(getattr(found, m, None)) for m in ("reset", "step")):
        raise ConfigError(f"env.target={target!r} is not a class with reset(row) and step(action_text)")
    return found


class GuardedEnvironment:
    """One episode's environment, every call under guard: a failure, a timeout or a malformed step is one line."""

    def __init__(self, target: str, cls: Callable, kwargs: dict, timeout_s: float, should_stop=None):
        self.target, self.timeout_s, self.should_stop = target, timeout_s, should_stop
        self.instance = self._call(cls, (), dict(kwargs), "building it")

    def _call(self, function, args: tuple, kwargs: dict, doing: str):
        try:
            return call_guarded(function, args, kwargs, self.timeout_s, self.should_stop, "rloo-env", "env.timeout_s")
        except (Interrupted, KeyboardInterrupt):
            raise
        except BaseException as error:  # noqa: BLE001 (the environment's failure, said in one line)
            raise EnvironmentFailed(f"environment {self.target} failed {doing}: {one_line(error)}") from None

    def reset(self, row: dict) -> None:
        self._call(self.instance.reset, (row,), {}, "in reset(row)")

    def step(self, action: str) -> Step:
        result = self._call(self.instance.step, (action,), {}, "in step(action_text)")
        if isinstance(result, Step):
            reply, reward, done = result.reply, result.reward, result.done
        elif isinstance(result, tuple) and len(result) == 3:
            reply, reward, done = result
        else:
            raise EnvironmentFailed(
                f"environment {self.target}: step returned {type(result).__name__}, not (reply, reward, done)"
            )
        if reply is not None and not isinstance(reply, str):
            raise EnvironmentFailed(f"environment {self.target}: step's reply is {type(reply).__name__}: text or None")
        if reward is not None and (
            not isinstance(reward, numbers.Real) or isinstance(reward, bool) or not math.isfinite(reward)
        ):
            raise EnvironmentFailed(f"environment {self.target}: step's reward is {reward!r}: a finite number or None")
        if not isinstance(done, bool):
            raise EnvironmentFailed(f"environment {self.target}: step's done is {done!r}: True or False")
        return Step(reply, None if reward is None else float(reward), done)


@dataclass
class EnvironmentSpec:
    """`env=` as the run uses it: the class, how to build and guard it, and the shape of an episode."""

    target: str
    cls: Callable
    kwargs: dict
    timeout_s: float
    episode: EpisodeSettings
    should_stop: Callable | None = None  # set by rloo.train: whether SIGTERM came

    def start(self, row: dict) -> GuardedEnvironment:
        """A new environment for one episode of `row`, reset."""
        environment = GuardedEnvironment(self.target, self.cls, self.kwargs, self.timeout_s, self.should_stop)
        environment.reset(row)
        return environment
