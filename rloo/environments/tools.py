"""TRL's tool environments, run as rloo environments: a class as TRL 1.16's `environment_factory` takes it (its public
methods are the tools, with type hints and Google-style docstrings; `reset(**columns)` may return text that is appended
to the prompt's last user message; an optional `get_reward()` scores the finished episode), or plain functions
(`tools=[fn, ...]`, here `FunctionTools`). The tools reach the model through the tokenizer's tool-calling chat template
(`apply_chat_template(..., tools=...)`, rloo.data.chat); each turn is read for tool calls, each call made, and the
results go back as `tool` messages; a turn without a call ends the episode.

Tool calls are read with the tokenizer's own response parser where it has one (transformers' `parse_response`), else
in the Hermes form that Qwen, Hermes and SmolLM3 templates use: `<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`. A tool that raises answers `{"error": "..."}` as TRL's does, and the episode goes on.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Callable

from rloo.generation.environment import Step
from rloo.utils.errors import ConfigError

RESERVED = ("reset", "get_reward", "close", "step")  # methods of an environment class that are not tools
HERMES_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def is_tool_environment(cls: type) -> bool:
    """A class written for TRL's environment_factory: reset, and tools in place of step."""
    return callable(getattr(cls, "reset", None)) and not callable(getattr(cls, "step", None))


def tools_of(instance) -> list[Callable]:
    """The tools an environment offers: FunctionTools' functions, or its public methods but reset, get_reward,
    close and step."""
    if isinstance(instance, FunctionTools):
        return list(instance.functions)
    return [
        member
        for name, member in inspect.getmembers(instance, predicate=inspect.ismethod)
        if name not in RESERVED and not name.startswith("_")
    ]


def tool_schemas(instance) -> list[dict]:
    """The JSON schemas of an environment's tools, as a chat template's `tools=` takes them (transformers'
    get_json_schema: type hints and a Google-style docstring); a one-line ConfigError naming a tool it cannot read."""
    from transformers.utils import get_json_schema

    schemas = []
    for tool in tools_of(instance):
        try:
            schemas.append(get_json_schema(tool))
        except Exception as error:  # noqa: BLE001 (transformers' TypeError or its DocstringParsingException)
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConfigError(f"tool {tool.__name__}: {first} (a tool needs type hints and a docstring)") from None
    return schemas


class FunctionTools:
    """Plain functions as a tool environment (TRL's `tools=[fn, ...]`): no state, each episode's calls made on them.
    `functions`: callables or their dotted names (package.module.function)."""

    def __init__(self, functions: list):
        from rloo.rewards.user_code import import_user_module

        self.functions = []
        for item in functions:
            if isinstance(item, str):
                module_name, _, name = item.rpartition(".")
                item = getattr(import_user_module(f"{module_name}:{name}", "env.environment.functions"), name, None)
            if not callable(item):
                raise ConfigError(f"env.environment.functions: {item!r} is not a function")
            self.functions.append(item)

    def reset(self, **columns) -> None:
        return None


def parse_tool_calls(text: str, tokenizer=None) -> list[tuple[str, dict]]:
    """The tool calls of a turn, (name, arguments) each: the tokenizer's own parser where it has a response template,
    else the Hermes form. A call that is not JSON with a name and an arguments object is not a call."""
    if tokenizer is not None and getattr(tokenizer, "response_template", None):
        try:
            parsed = tokenizer.parse_response(text)
            calls = [c.get("function", c) for c in parsed.get("tool_calls") or []]
            return [(c["name"], c.get("arguments") or {}) for c in calls if isinstance(c.get("name"), str)]
        except Exception:  # noqa: BLE001 (a malformed response is plain text, as TRL reads it)
            return []
    calls = []
    for body in HERMES_CALL.findall(text):
        try:
            call = json.loads(body)
        except json.JSONDecodeError:
            continue
        arguments = call.get("arguments", {}) if isinstance(call, dict) else None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                continue
        if isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(arguments, dict):
            calls.append((call["name"], arguments))
    return calls


class ToolCalling:
    """rloo's environment protocol over a TRL tool environment (`instance`: an environment_factory class's instance,
    or FunctionTools): reset(row) calls reset(**row) and returns its observation; step reads the turn's tool calls and
    answers with their results as `tool` messages (info: calls and failures), or ends the episode where the turn made
    none; get_reward and close are the instance's."""

    def __init__(self, instance, tokenizer=None):
        self.instance, self.tokenizer = instance, tokenizer
        self.rloo_wraps = instance  # what reward functions taking `environments` get (GuardedEnvironment)
        self.tools = {tool.__name__: tool for tool in tools_of(instance)}
        if callable(getattr(instance, "get_reward", None)):
            self.get_reward = instance.get_reward

    def reset(self, row: dict) -> str | None:
        return self.instance.reset(**row)

    def step(self, action: str) -> Step:
        calls = parse_tool_calls(action, self.tokenizer)
        if not calls:
            return Step(None, None, terminated=True)
        messages, failures = [], 0
        for name, arguments in calls:
            try:
                if name not in self.tools:
                    raise ValueError(f"Tool {name} not found.")
                result = self.tools[name](**arguments)
            except Exception as error:  # noqa: BLE001 (the tool's failure is its answer, as in TRL)
                failures, result = failures + 1, {"error": str(error)}
            messages.append({"role": "tool", "name": name, "content": str(result)})
        return Step(messages, None, False, info={"tool_calls": float(len(calls)), "tool_failures": float(failures)})

    def close(self) -> None:
        close = getattr(self.instance, "close", None)
        if callable(close):
            close()
