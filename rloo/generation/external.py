"""An external rollout (`rollout=module:function`, TRL's `rollout_func` contract): a harness of the user's (an agent
framework, a simulator, an inference server) samples each rollout in place of the policy:

    rollout(prompts, module) -> {"prompt_ids": [[int]], "completion_ids": [[int]], "logprobs": [[float]], ...}

`prompts`: each episode's prompt as the data has it (chat messages or text), k per prompt, prompt-major; `module`:
the LightningModule (its `policy`, `tokenizer`, `config`), as TRL hands its trainer. One row per prompt given, in
that order. Optional `env_mask` (per token: 1 the model's, 0 inserted by the harness: tool output, an environment's
reply) keeps the inserted tokens out of the loss, the KL and the ratios, as the engine's episodes do; any other field
reaches the reward functions by name (a list: one value per row; anything else: the same for every row). The record
it becomes is the engine's (rloo.generation.episodes.Sampled), so everything after sampling is the same code.
"""

from __future__ import annotations

import math
import numbers

from rloo.data.padding import left_pad
from rloo.generation.episodes import Episode, Sampled, episode_tensors
from rloo.utils.errors import RewardFunctionError

REQUIRED = ("prompt_ids", "completion_ids", "logprobs")


def sampled_from_external(output, rows: int, eos_token_id: int, pad_token_id: int, device, name: str):
    """`output` of the rollout function `name` for `rows` prompts as a Sampled record, and the extra fields for the
    reward functions (one value per row each); a one-line error naming the function and the field it got wrong."""

    def fail(what: str):
        raise RewardFunctionError(f"rollout={name}: {what}")

    if not isinstance(output, dict):
        fail(f"returned {type(output).__name__}, not a dict with {', '.join(REQUIRED)}")
    if missing := [key for key in REQUIRED if key not in output]:
        fail(f"returned no {', '.join(missing)} (it must return {', '.join(REQUIRED)})")
    fields = {key: output[key] for key in (*REQUIRED, "env_mask") if key in output}
    for key, value in fields.items():
        if not isinstance(value, (list, tuple)) or len(value) != rows:
            fail(
                f"{key} holds {len(value) if isinstance(value, (list, tuple)) else type(value).__name__} rows, not "
                f"{rows} (one per prompt given)"
            )
    episodes = []
    for row in range(rows):
        tokens, logprobs = list(fields["completion_ids"][row]), list(fields["logprobs"][row])
        own = list(fields["env_mask"][row]) if "env_mask" in fields else [1] * len(tokens)
        if not all(isinstance(t, numbers.Integral) and t >= 0 for t in [*tokens, *fields["prompt_ids"][row]]):
            fail(f"row {row}: prompt_ids and completion_ids are token ids (non-negative ints)")
        if len(logprobs) != len(tokens) or len(own) != len(tokens):
            fail(f"row {row}: {len(tokens)} completion ids, {len(logprobs)} logprobs, {len(own)} env_mask entries")
        if not all(isinstance(v, numbers.Real) and math.isfinite(v) for v in logprobs) or set(own) - {0, 1}:
            fail(f"row {row}: logprobs are finite numbers and env_mask holds 0 or 1")
        model_tokens = [t for t, o in zip(tokens, own) if o]
        episodes.append(
            Episode(
                tokens=tokens,
                own=[int(o) for o in own],
                logprobs=[float(lp) if o else 0.0 for lp, o in zip(logprobs, own)],
                turns=1,
                terminated=True,
                plain=True,  # ended by its stop token, as far as the missing-EOS rules go
                last_turn_ended=bool(model_tokens) and model_tokens[-1] == eos_token_id,
            )
        )
    prompt_ids, prompt_mask = left_pad([list(p) for p in fields["prompt_ids"]], pad_token_id)
    made = episode_tensors(episodes, pad_token_id, device)
    sampled = Sampled(prompt_ids.to(device), prompt_mask.to(device), **made, episodes=episodes)
    extras = {}
    for key, value in output.items():
        if key in (*REQUIRED, "env_mask", "logprob_token_ids"):
            continue
        if isinstance(value, (list, tuple)) and len(value) != rows:
            fail(f"{key} holds {len(value)} values, not {rows} (one per row, or one value for all)")
        extras[key] = list(value) if isinstance(value, (list, tuple)) else [value] * rows
    return sampled, extras
