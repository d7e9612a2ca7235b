"""Every algorithm `algo=` can choose, one record each: its LightningModule and its config class
(rloo/algorithms/configs.py). The config class is the schema of the keys the algorithm reads (type, range, choices and
resume policy on each field, rloo.config.schema), its cross-key rules (`check`) and the typed settings its module
reads: a key cannot validate and then reach no code.

The REINFORCE family is one step (rloo.algorithms.policy_gradient) and one config class (EstimatorConfig); its named
algorithms differ only by the values their conf/algo/*.yaml give its keys. PPO (a value model) and DPO (pairs) are
modules of their own on the shared base.

Adding an algorithm (docs/extending.md): its YAML in conf/algo/ and a line here; a new kind of step, a module and a
config class too. Nothing is imported until asked (`load`): reading the registry, or validating a config, loads no
Lightning or torch.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

CONFIGS = "rloo.algorithms.configs"


@dataclass(frozen=True)
class Algorithm:
    name: str  # the `algorithm` key its conf/algo/*.yaml sets
    module: str  # the Python module holding its LightningModule
    module_class: str  # its LightningModule: (policy, reference, reward_model, tokenizer, config)
    config_class: str  # its config dataclass in rloo/algorithms/configs.py
    value_model: bool = False  # trains a value model beside the policy, passed after the reward model (PPO)

    def config(self) -> type:
        """The config class (imports neither Lightning nor torch)."""
        return getattr(importlib.import_module(CONFIGS), self.config_class)

    def load(self) -> tuple[type, type]:
        """(LightningModule class, config class)."""
        return getattr(importlib.import_module(self.module), self.module_class), self.config()


STEP = ("rloo.algorithms.policy_gradient", "PolicyGradientModule", "EstimatorConfig")  # the one policy-gradient step

POLICY_GRADIENT_FAMILY = (  # conf/algo/<name>.yaml: values of the one step's keys
    "rloo",
    "raft",
    "reinforce",
    "vanilla_pg",
    "grpo",
    "dr_grpo",
    "dapo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "gspo",
)

ALGORITHMS: dict[str, Algorithm] = {
    spec.name: spec
    for spec in (
        *(Algorithm(name, *STEP) for name in POLICY_GRADIENT_FAMILY),
        Algorithm("ppo", "rloo.algorithms.ppo", "PPOModule", "PPOConfig", value_model=True),
        Algorithm("dpo", "rloo.algorithms.dpo", "DPOModule", "DPOConfig"),
    )
}
