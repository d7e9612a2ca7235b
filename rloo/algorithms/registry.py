"""Every algorithm `algo=` can choose, one record each: where its LightningModule and its config class live, and what
the run checks differ by. The config class is the schema of the keys the algorithm reads (type, range, choices and
resume policy on each field, rloo.schema) and the typed settings its module reads: a key cannot validate and then
reach no code.

Adding an algorithm (docs/extending.md): its YAML in conf/algo/, a module in rloo/algorithms/ with its config
dataclass and LightningModule, and a line here. rloo.schema, rloo.config, rloo.assemble and the tests read this.
Nothing is imported until asked (`load`), so reading the registry loads no Lightning.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Algorithm:
    name: str  # the `algorithm` key its conf/algo/*.yaml sets
    module: str  # the Python module holding both classes
    module_class: str  # its LightningModule: (policy, reference, reward_model, tokenizer, config)
    config_class: str  # its config dataclass (rloo/algorithms/base.py's OnlineRLConfig or a subclass)
    min_k: int = 1  # 2 where each completion is compared with the others of its prompt
    trains_on_pairs: bool = False  # a micro-batch holds whole prompts' pairs (DPO)
    value_model: bool = False  # trains a value model beside the policy, passed after the reward model (PPO)

    def load(self) -> tuple[type, type]:
        """(LightningModule class, config class)."""
        module = importlib.import_module(self.module)
        return getattr(module, self.module_class), getattr(module, self.config_class)


ALGORITHMS: dict[str, Algorithm] = {
    spec.name: spec
    for spec in (
        Algorithm("rloo", "rloo.algorithms.rloo", "RLOOModule", "RLOOConfig", min_k=2),
        Algorithm("raft", "rloo.algorithms.raft", "RAFTModule", "RAFTConfig", min_k=2),
        Algorithm("reinforce", "rloo.algorithms.reinforce", "ReinforceModule", "ReinforceConfig"),
        Algorithm("vanilla_pg", "rloo.algorithms.reinforce", "VanillaPGModule", "RLOOConfig"),
        Algorithm("ppo", "rloo.algorithms.ppo", "PPOModule", "PPOConfig", value_model=True),
        Algorithm("dpo", "rloo.algorithms.dpo", "DPOModule", "DPOConfig", min_k=2, trains_on_pairs=True),
        Algorithm("grpo", "rloo.algorithms.grpo", "GroupModule", "GroupConfig", min_k=2),
        Algorithm("dr_grpo", "rloo.algorithms.grpo", "GroupModule", "GroupConfig", min_k=2),
        Algorithm("dapo", "rloo.algorithms.grpo", "GroupModule", "GroupConfig", min_k=2),
        Algorithm("reinforce_pp", "rloo.algorithms.grpo", "GroupModule", "GroupConfig", min_k=2),
        Algorithm("gspo", "rloo.algorithms.grpo", "GroupModule", "GroupConfig", min_k=2),
    )
}
