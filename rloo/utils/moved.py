"""Modules that moved when the tree was laid out by layer, old -> new: a `module:function` (reward=, eval.answer) or
a `_target_` that names an old path is refused in one line naming the new one, rather than an ImportError."""

from __future__ import annotations

MOVED = {
    "rloo.pipeline": "rloo.run.pipeline",
    "rloo.cli": "rloo.run.cli",
    "rloo.assemble": "rloo.run.assemble",
    "rloo.callbacks": "rloo.run.callbacks",
    "rloo.resolvers": "rloo.run.resolvers",
    "rloo.loggers": "rloo.run.loggers",
    "rloo.model_card": "rloo.run.model_card",
    "rloo.memory_plan": "rloo.run.memory_plan",
    "rloo.schema": "rloo.config.schema",
    "rloo.config": "rloo.config.checks",
    "rloo.heldout": "rloo.evaluation.heldout",
    "rloo.pass_at_k": "rloo.evaluation.pass_at_k",
    "rloo.sampling": "rloo.generation.sampling",
    "rloo.decode": "rloo.generation.decode",
    "rloo.static_decode": "rloo.generation.static_decode",
    "rloo.forward": "rloo.generation.forward",
    "rloo.fast_paths": "rloo.generation.fast_paths",
    "rloo.rollout": "rloo.generation.rollout",
    "rloo.environments.toy": "rloo.toy.topic_recall",
    "rloo.models": "rloo.models.loading",
    "rloo.lora": "rloo.models.lora",
    "rloo.sharding": "rloo.models.sharding",
    "rloo.mlp_recompute": "rloo.models.mlp_recompute",
    "rloo.packaged": "rloo.models.packaged",
    "rloo.scoring": "rloo.rewards.scoring",
    "rloo.user_code": "rloo.rewards.user_code",
    "rloo.data": "rloo.data.prompts",
    "rloo.errors": "rloo.utils.errors",
    "rloo.keys": "rloo.utils.keys",
    "rloo.atomic": "rloo.utils.atomic",
    "rloo.cache": "rloo.utils.cache",
    "rloo.memory": "rloo.utils.memory",
    "rloo.ownership": "rloo.utils.ownership",
    "rloo.resume": "rloo.utils.resume",
    "rloo.estimators": "rloo.objectives",
    "rloo.algorithms.rloo": "rloo.algorithms.policy_gradient",
    "rloo.algorithms.grpo": "rloo.algorithms.policy_gradient",
    "rloo.algorithms.raft": "rloo.algorithms.policy_gradient",
    "rloo.algorithms.reinforce": "rloo.algorithms.policy_gradient",
}


def moved_target(dotted: str) -> str | None:
    """A one-line reason for a `_target_` (module.attribute) naming an rloo module that moved and is no longer there
    (looked up without importing it); None otherwise."""
    import importlib.util

    module, _, attribute = dotted.rpartition(".")
    if module not in MOVED or importlib.util.find_spec(module) is not None:
        return None
    return f"{dotted}: {module} moved to {MOVED[module]}; write {MOVED[module]}.{attribute}"
