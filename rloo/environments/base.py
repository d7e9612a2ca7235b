"""An environment, as `env.environment` names it (Hydra's `_target_`, built by its instantiate as a `_partial_`
factory, the class's keyword arguments beside `_target_`): a Python class with

    reset(row)           a new episode for one data row: {"prompt": as the data has it, **its other columns}
    step(action_text)    the model's turn as text -> (reply, reward, done), or
                         (reply, reward, terminated, truncated[, info]), or a rloo.generation.environment.Step
    close()              optional: runs once each episode is over, also when the run fails

`reply` is the environment's answer (text, or None for none), `reward` a float or None (none this turn), `done`
(`terminated`) whether the episode ends, `truncated` whether the environment cut it short, `info` a dict of numbers
(their means logged as env/<name>). An episode's return is the sum of its rewards (0 where it gave none, as when
max_turns or the token budget cut it off before its end): the reward term `env` (`reward=env`, or
`'env + 0.5*m:f'`). One instance per episode; every call runs under the user-code guard
(rloo.rewards.user_code: `env.timeout_s`, SIGTERM), and anything it raises or returns wrongly stops the run in one
line naming the class and what it did (EnvironmentFailed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rloo.generation.environment import Step
from rloo.generation.settings import EpisodeSettings
from rloo.rewards.user_code import Interrupted, call_guarded, import_user_module, located
from rloo.utils.errors import ConfigError, EnvironmentFailed
from rloo.utils.numbers import finite_float, shown


def environment_class(target: str, key: str = "env.environment._target_") -> type:
    """The class a dotted `_target_` names (`package.module.Class`, as Hydra's instantiate reads it), imported; a
    one-line ConfigError naming `key` where it does not import or is not a class with reset and step."""
    module_name, _, name = str(target).rpartition(".")
    if not module_name or not name:
        raise ConfigError(f"{key}={target!r}: give the environment class as package.module.Class")
    module = import_user_module(f"{module_name}:{name}", key)
    found = getattr(module, name, None)
    if not isinstance(found, type) or not callable(getattr(found, "reset", None)):
        raise ConfigError(
            f"{key}={target!r} is not a class with reset(row) and step(action_text), nor one written for TRL's "
            "environment_factory (reset and tool methods)"
        )
    return found


class GuardedEnvironment:
    """One episode's environment, every call under guard: a failure, a timeout or a malformed step is one line."""

    def __init__(self, target: str, factory: Callable, timeout_s: float, should_stop=None):
        self.target, self.timeout_s, self.should_stop = target, timeout_s, should_stop
        self.instance = self._call(factory, (), {}, "building it")
        self.observation: str | None = None  # what reset returned: text appended to the prompt

    def _call(self, function, args: tuple, kwargs: dict, doing: str):
        try:
            return call_guarded(function, args, kwargs, self.timeout_s, self.should_stop, "rloo-env", "env.timeout_s")
        except (Interrupted, KeyboardInterrupt):
            raise
        except BaseException as error:  # noqa: BLE001 (the environment's failure, said in one line)
            raise EnvironmentFailed(f"environment {self.target} failed {doing}: {located(error)}") from error

    def reset(self, row: dict) -> str | None:
        """A new episode of `row`; its first observation (text appended to the prompt), or None."""
        observation = self._call(self.instance.reset, (row,), {}, "in reset(row)")
        if observation is not None and not isinstance(observation, str):
            raise EnvironmentFailed(
                f"environment {self.target}: reset returned {type(observation).__name__}: text (an observation "
                "appended to the prompt) or None"
            )
        return observation

    def step(self, action: str) -> Step:
        result = self._call(self.instance.step, (action,), {}, "in step(action_text)")
        if isinstance(result, Step):
            fields = (result.reply, result.reward, result.terminated, result.truncated, result.info)
        elif isinstance(result, tuple) and len(result) == 3:
            fields = (*result, False, {})
        elif isinstance(result, tuple) and len(result) in (4, 5):
            fields = (*result, {}) if len(result) == 4 else result
        else:
            raise EnvironmentFailed(
                f"environment {self.target}: step returned {type(result).__name__}, not (reply, reward, done) or "
                "(reply, reward, terminated, truncated[, info])"
            )
        return self._checked(*fields)

    def _checked(self, reply, reward, terminated, truncated, info) -> Step:
        messages = isinstance(reply, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in reply
        )
        if reply is not None and not isinstance(reply, str) and not messages:
            raise EnvironmentFailed(
                f"environment {self.target}: step's reply is {type(reply).__name__}: text, chat messages "
                "({'role', 'content'} with text) or None"
            )
        if reward is not None and finite_float(reward) is None:
            raise EnvironmentFailed(
                f"environment {self.target}: step's reward is {shown(reward)}: a number finite in float32, or None"
            )
        for name, flag in (("done", terminated), ("truncated", truncated)):
            if not isinstance(flag, bool):
                raise EnvironmentFailed(f"environment {self.target}: step's {name} is {flag!r}: True or False")
        if not isinstance(info, dict) or any(finite_float(v) is None for v in info.values()):
            raise EnvironmentFailed(
                f"environment {self.target}: step's info is {shown(info)}: a dict of finite numbers"
            )
        return Step(
            reply,
            None if reward is None else finite_float(reward),
            terminated,
            truncated,
            {str(k): finite_float(v) for k, v in info.items()},
        )

    @property
    def user_environment(self):
        """The user's own environment object (inside rloo's TRL tool adapter, the class TRL's factory made): what
        reward functions that take `environments` get."""
        return getattr(self.instance, "rloo_wraps", self.instance)

    @property
    def get_reward(self):
        """The environment's own get_reward(), under guard, where it has one (else None: the engine skips it)."""
        own = getattr(self.instance, "get_reward", None)
        if not callable(own):
            return None

        def guarded() -> float | None:
            reward = self._call(own, (), {}, "in get_reward()")
            if reward is not None and finite_float(reward) is None:
                raise EnvironmentFailed(
                    f"environment {self.target}: get_reward returned {shown(reward)}: a number finite in float32"
                )
            return None if reward is None else finite_float(reward)

        return guarded

    def close(self) -> None:
        """The environment's own close(), where it has one (a sandbox, a connection), under the same guard."""
        close = getattr(self.instance, "close", None)
        if callable(close):
            self._call(close, (), {}, "in close()")


@dataclass
class EnvironmentSpec:
    """`env=` as the run uses it: the class, how to build and guard it, and the shape of an episode."""

    target: str  # the class's dotted name, for messages
    factory: Callable  # () -> one new environment (Hydra's instantiate of env.environment, _partial_)
    timeout_s: float
    episode: EpisodeSettings
    should_stop: Callable | None = None  # set by rloo.train: whether SIGTERM came
    tools: list[dict] | None = None  # the JSON schemas of a tool environment's tools, which chat prompts show

    def start_all(self, rows: list[dict]) -> list[GuardedEnvironment]:
        """A new, reset environment for each of `rows`; where one fails, those already made are closed."""
        made = []
        try:
            for row in rows:
                made.append(self.start(row))
        except BaseException:
            from rloo.generation.episodes import close_all

            close_all(made)
            raise
        return made

    def start(self, row: dict) -> GuardedEnvironment:
        """A new environment for one episode of `row`, reset (its first observation kept as `observation`)."""
        environment = GuardedEnvironment(self.target, self.factory, self.timeout_s, self.should_stop)
        environment.observation = environment.reset(row)
        return environment
