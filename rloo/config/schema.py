"""The shape of the composed training config: for every key, its type, its range and its resume policy.

One dataclass per config group, and `RunKeys` for the keys of the run around the algorithm (models, data, sampling,
evaluation, checkpoints, Trainer, loggers). The keys an algorithm reads are declared once, on its config dataclass
(rloo/algorithms/, found through rloo/algorithms/registry.py), with `key` below: the schema of a composed config is
RunKeys plus the fields of its algorithm's config (`schema_of`). Values and their documentation live in the YAML
(conf/); nothing here has a default. `check_config` walks a composed config against the schema of its `algorithm`
and raises a one-line `ConfigError` naming the key:

- a key no schema knows, or one that only another algorithm reads ("kl_coef does nothing with algo=dpo");
- a value of the wrong type, outside its range, or not one of its choices.

Resume policy, per key: FIXED keys define the run (a resume that changes one is refused); APPLIED keys take
effect from the resumed rollout on and the change is logged. An open group (trainer extras, logger, judge,
paths, bootstrap) has one policy for everything under it.
"""

from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass
from functools import lru_cache
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from rloo.algorithms.registry import ALGORITHMS
from rloo.data.settings import SplitSpec
from rloo.generation.settings import REPLY_ROLES, ROLLOUT_PRECISIONS, SAMPLERS
from rloo.utils.errors import ConfigError
from rloo.utils.keys import APPLIED, FIXED, group, key

FROZEN_DTYPES = ("float32", "bfloat16", "float16")
REWARD_ERRORS = ("raise", "mask")


# ---- sampling (conf/sampling.yaml, shared with python -m rloo.evaluate) --------------------------------------
@dataclass
class EvalKeys:
    num_prompts: int = key(APPLIED, low=1)
    batch_size: int = key(APPLIED, low=1)
    greedy: bool = key(APPLIED)
    max_new_tokens: int = key(APPLIED, low=1)
    judge_timeout_s: float = key(APPLIED, low=0)
    before: bool = key(APPLIED)  # training only
    after: bool = key(APPLIED)  # training only
    samples_per_prompt: int = key(APPLIED, low=0)  # training only, as the three below
    pass_k: list[int] = key(APPLIED)
    correct_at: float = key(APPLIED)
    answer: str | None = key(APPLIED)


@dataclass
class SamplingKeys:
    response_length: int = key(FIXED, low=1)
    temperature: float = key(FIXED, low=0, low_open=True)
    top_k: int = key(FIXED, low=0)
    top_p: float = key(FIXED, low=0, high=1, low_open=True)
    stop_token: str | None = key(FIXED, choices=("eos", None))
    lean_decode: bool = key(APPLIED)
    sampler: str = key(APPLIED, choices=SAMPLERS)
    cuda_graph: bool = key(APPLIED)
    eval: EvalKeys = key(APPLIED)


# ---- groups -----------------------------------------------------------------------------------------------------
@dataclass
class ModelKeys:
    name: str = key(FIXED)
    policy: str | None = key(FIXED)
    reference: str | None = key(FIXED)
    reward_model: str | None = key(FIXED)
    tokenizer: str | None = key(FIXED)
    chat_template: str | None = key(FIXED)
    pad_token: str | None = key(FIXED)
    frozen_dtype: str = key(FIXED, choices=FROZEN_DTYPES)
    lora: bool = key(FIXED)


@dataclass
class DataKeys:
    name: str = key(FIXED)
    train: SplitSpec = key(FIXED)
    validation: SplitSpec = key(FIXED)
    max_prompt_length: int = key(FIXED, low=1)
    truncate_prompts: bool = key(FIXED)
    system_prompt: str | None = key(FIXED)
    shuffle: bool = key(FIXED)
    num_workers: int = key(APPLIED, low=0)


@dataclass
class EnvKeys:
    name: str = key(FIXED)
    environment: dict = group(FIXED)  # Hydra's _target_ (the class), _partial_: true, its keyword arguments
    max_turns: int = key(FIXED, low=1)
    max_episode_tokens: int = key(FIXED, low=1)
    reply_role: str = key(FIXED, choices=REPLY_ROLES)
    timeout_s: float = key(APPLIED, low=0)


@dataclass
class PrecisionKeys:
    name: str = key(FIXED)
    trainer: str = key(FIXED)  # Lightning's precision flag


@dataclass
class LoraKeys:
    r: int = key(FIXED, low=1)
    alpha: float = key(FIXED, low=0, low_open=True)
    dropout: float = key(FIXED, low=0, high=1)
    target_modules: str | list[str] = key(FIXED)  # auto | all-linear | layer names


# ---- the run around the algorithm (conf/train.yaml); the algorithm's own keys are on its config class ------------
@dataclass
class RunKeys(SamplingKeys):
    algorithm: str = key(FIXED, choices=tuple(ALGORITHMS))
    seed: int = key(FIXED, low=0)
    reward: str = key(FIXED)
    reward_errors: str = key(APPLIED, choices=REWARD_ERRORS)
    reward_timeout_s: float = key(APPLIED, low=0)
    rollout: str | None = key(FIXED)  # module:function: an external rollout (rloo.generation.external)
    fp32_lm_head: bool = key(FIXED)
    rollout_precision: str = key(APPLIED, choices=ROLLOUT_PRECISIONS)
    mlp_recompute: bool = key(APPLIED)
    activation_checkpointing: bool = key(APPLIED)
    total_episodes: int = key(APPLIED, low=1)
    sample_every: int = key(APPLIED, low=0)
    progress_every: int = key(APPLIED, low=0)
    num_samples_logged: int = key(APPLIED, low=0)
    eval_every: int = key(APPLIED, low=0)
    checkpoint_every: int = key(APPLIED, low=0)
    checkpoint_minutes: float = key(APPLIED, low=0)
    keep_checkpoints: int = key(APPLIED, low=-1)
    resume: str | None = key(APPLIED)
    lora: LoraKeys = key(FIXED)
    model: ModelKeys = key(FIXED)
    data: DataKeys = key(FIXED)
    env: EnvKeys = key(FIXED)  # env=none: an empty group
    precision: PrecisionKeys = key(FIXED)
    trainer: dict = group(APPLIED)  # Lightning Trainer arguments; devices and num_nodes are fixed (below)
    logger: dict | None = group(APPLIED)
    judge: dict | None = group(APPLIED)
    paths: dict = group(APPLIED)
    bootstrap: dict | None = group(FIXED)  # the embedded task's artifacts are its cache key


FIXED_TRAINER_KEYS = ("devices", "num_nodes")  # the world size: each rank's data shard and random states


@lru_cache(maxsize=None)
def schema_for(config_class: type) -> type:
    """RunKeys plus the keyed fields of an algorithm's config class (rloo/algorithms/): the schema of a composed
    config of that algorithm."""
    hints = typing.get_type_hints(config_class)
    own = [
        (f.name, hints[f.name], field(metadata=f.metadata))
        for f in fields(config_class)
        if "resume" in f.metadata  # not `derived`
    ]
    return make_dataclass(f"{config_class.__name__}Keys", own, bases=(RunKeys,))


def common_schema() -> type:
    """The schema of the keys every algorithm reads: RunKeys plus rloo.algorithms.configs.OnlineRLConfig's."""
    from rloo.algorithms.configs import OnlineRLConfig

    return schema_for(OnlineRLConfig)


# ---- walking a config against a schema ------------------------------------------------------------------------------
def schema_of(algorithm: str) -> type:
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"algorithm={algorithm!r} is not allowed: one of {', '.join(ALGORITHMS)} (choose with algo=)")
    return schema_for(ALGORITHMS[algorithm].config())


def fields_of(schema: type) -> dict:
    hints = typing.get_type_hints(schema)
    return {f.name: (hints[f.name], f.metadata) for f in fields(schema)}


def check_config(cfg: DictConfig, algorithm: str) -> None:
    """Every key of `cfg` (a composed training config) is known to `algorithm` and holds an allowed value."""
    _check_node(cfg, schema_of(algorithm), "", algorithm)


def _check_node(node: DictConfig, schema: type, prefix: str, algorithm: str) -> None:
    known = fields_of(schema)
    for name in node.keys():
        if name not in known:
            raise unknown_key_error(f"{prefix}{name}", algorithm)
    raw = OmegaConf.to_container(node, resolve=False)  # each value as written: a mapping, None, "${...}", "???"
    for name, (annotation, meta) in known.items():  # in the schema's order: a key before what interpolates it
        path = f"{prefix}{name}"
        if name not in node:
            continue
        value = raw[name]
        if meta.get("open"):  # checked by what builds it (Lightning, the judge, the logger)
            if not (value is None or isinstance(value, dict)):
                raise ConfigError(f"{path}={value!r} is not allowed: a config group (a mapping of keys)")
            continue
        inner = _dataclass_of(annotation)
        if inner is not None:
            if not isinstance(value, dict):
                raise ConfigError(f"{path}={value!r} is not allowed: a mapping with the keys of {name} in conf/")
            _check_node(node[name], inner, f"{path}.", algorithm)
            continue
        check_value(path, value if OmegaConf.is_missing(node, name) else node[name], annotation, meta)


def _dataclass_of(annotation) -> type | None:
    return annotation if is_dataclass(annotation) else None


RENAMED_KEYS = {  # old key -> what replaced it
    "env.target": "env.environment._target_ (package.module.Class), with env.environment._partial_=true",
    "env.kwargs": "the environment's keyword arguments beside env.environment._target_",
    "overlong_cache": "overlong_buffer, a fraction of response_length (DAPO's 4,096 of 20,480 is 0.2)",
}


def unknown_key_error(path: str, algorithm: str) -> ConfigError:
    """A key `algorithm` does not read: one that another algorithm reads, or one that no config has (with the
    closest name at its level, for a typo)."""
    readers = [a for a in sorted(ALGORITHMS) if a != algorithm and resume_policy(path, a) is not None]
    if readers:
        return ConfigError(f"{path} does nothing with algo={algorithm}: only {', '.join(readers)} read it; remove it")
    if path in RENAMED_KEYS:
        return ConfigError(f"{path} is not a config key of python -m rloo.train: it is now {RENAMED_KEYS[path]}")
    from rloo.config.trl_names import trl_name_error

    if trl := trl_name_error(path):
        return ConfigError(trl)
    parent, _, name = path.rpartition(".")
    schema = field_at(parent, schema_of(algorithm))[0] if parent else schema_of(algorithm)
    close = difflib.get_close_matches(name, list(fields_of(schema)), n=1) if is_dataclass(schema) else []
    hint = f"; did you mean {parent + '.' if parent else ''}{close[0]}?" if close else ""
    return ConfigError(f"{path} is not a config key of python -m rloo.train{hint}")


def check_keys(cfg: DictConfig, paths: tuple[str, ...], schema: type = RunKeys) -> None:
    """The leaves at `paths` (dotted) that `cfg` has, each against its field of `schema`."""
    for path in paths:
        value = OmegaConf.select(cfg, path, default=_ABSENT)
        if value is not _ABSENT:
            annotation, meta = field_at(path, schema)
            check_value(path, value, annotation, meta)


_ABSENT = object()


def check_value(path: str, value: Any, annotation, meta: dict) -> None:
    """One leaf: its type (from the annotation), then its choices or range."""
    allowed_types = (
        typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, _union_type()) else (annotation,)
    )
    optional = type(None) in allowed_types
    if value is None:
        if optional or (meta.get("choices") and None in meta["choices"]):
            return
        raise ConfigError(f"{path}=None is not allowed: {_describe(allowed_types, meta)}")
    if not any(_is_instance(value, t) for t in allowed_types if t is not type(None)):
        raise ConfigError(f"{path}={value!r} is not allowed: {_describe(allowed_types, meta)}")
    choices = meta.get("choices")
    if choices and value not in choices:
        raise ConfigError(
            f"{path}={value!r} is not allowed: one of {', '.join(str(c) for c in choices if c is not None)}"
            + (" or null" if None in choices else "")
        )
    low, high, low_open = meta.get("low"), meta.get("high"), meta.get("low_open")
    if low is not None or high is not None:
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and value > high
        if too_low or too_high:
            raise ConfigError(f"{path}={value!r} is not allowed: {_describe(allowed_types, meta)}")


def _union_type():
    import types

    return types.UnionType


def _is_instance(value, base) -> bool:
    if base is bool:
        return isinstance(value, bool)
    if base is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if base is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if base is str:
        return isinstance(value, str)
    if typing.get_origin(base) is list:
        item = typing.get_args(base)[0]
        return isinstance(value, (list, ListConfig)) and len(value) > 0 and all(_is_instance(v, item) for v in value)
    return True


def _describe(allowed_types: tuple, meta: dict) -> str:
    base = next(t for t in allowed_types if t is not type(None))
    low, high, low_open = meta.get("low"), meta.get("high"), meta.get("low_open")
    if base is bool:
        text = "true or false"
    elif typing.get_origin(base) is list:
        text = "a non-empty list of integers" if typing.get_args(base)[0] is int else "a non-empty list of names"
    elif base is int:
        text = (
            "a positive integer"
            if low == 1 and high is None
            else f"an integer >= {low}"
            if low is not None and high is None
            else "an integer"
        )
    elif base is float:
        bracket = "(" if low_open else "["
        text = f"a number in {bracket}{low if low is not None else '-inf'}, {high if high is not None else 'inf'}]"
    else:
        text = "a string"
    if meta.get("choices"):
        text = "one of " + ", ".join(str(c) for c in meta["choices"] if c is not None)
    return text + (", or null" if type(None) in allowed_types else "")


# ---- resume policy ---------------------------------------------------------------------------------------------
def field_at(path: str, schema: type) -> tuple:
    """(annotation, metadata) of the field at a dotted path of `schema`; an open group answers for all below it.
    KeyError where the schema has no such key."""
    annotation, meta = schema, {}
    for part in path.split("."):
        if meta.get("open"):
            return annotation, meta
        if not is_dataclass(annotation) or part not in fields_of(annotation):
            raise KeyError(path)
        annotation, meta = fields_of(annotation)[part]
    return annotation, meta


def resume_policy(path: str, algorithm: str) -> str | None:
    """FIXED or APPLIED for a dotted key of the composed config; None for a key the schema does not know."""
    if path.startswith("trainer.") and path.split(".")[1] in FIXED_TRAINER_KEYS:
        return FIXED
    try:
        return field_at(path, schema_of(algorithm) if algorithm in ALGORITHMS else common_schema())[1]["resume"]
    except KeyError:
        return None


def leaves(container: dict, prefix: str = "") -> dict[str, Any]:
    """Dotted path -> value of every leaf of a plain (resolved) config dict."""
    out = {}
    for name, value in container.items():
        path = f"{prefix}{name}"
        if isinstance(value, dict) and value:
            out.update(leaves(value, f"{path}."))
        else:
            out[path] = value
    return out


def compare_configs(previous: dict, current: dict) -> tuple[list[str], list[str]]:
    """(refused, applied): one `key: old -> new` line per changed leaf of a resumed run's config, by its resume
    policy (fixed: the run cannot continue with it changed; applied: takes effect from the resumed rollout on). A
    key the schema does not know counts as fixed."""
    before, after = leaves(previous), leaves(current)
    refused, applied = [], []
    for path in sorted(set(before) | set(after)):
        if path == "resume" or before.get(path) == after.get(path):  # resume= is how a run continues
            continue
        line = f"{path}: {before.get(path)!r} -> {after.get(path)!r}"
        (applied if resume_policy(path, current.get("algorithm", "rloo")) == APPLIED else refused).append(line)
    return refused, applied
