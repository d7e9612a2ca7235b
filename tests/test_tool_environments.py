"""TRL's tool environments run unchanged: a class written as TRL 1.16's docs write an `environment_factory`
environment, and a `tools=[...]` list of plain functions, through a tool-calling chat template written here. The
policy is a tiny Llama made into a bigram model (its blocks add nothing, so each token's logits are its own
embedding's): after an assistant header it calls the tool, after the call it ends its turn."""

import json

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rloo.data.chat import render_messages
from rloo.data.padding import left_pad
from rloo.environments.base import EnvironmentSpec
from rloo.environments.tools import FunctionTools, ToolCalling, parse_tool_calls, tool_schemas
from rloo.generation.episodes import close_all, sample_episodes
from rloo.generation.settings import EpisodeSettings
from rloo.rewards.scoring import Reward, RewardTerm
from tests.builders import sampling
from tests.tiny_models import tiny_model

CALL = '<tool_call>{"name": "increment", "arguments": {"a": 2}}</tool_call>'
TEMPLATE = (  # Hermes-style tool calling, as Qwen's and SmolLM3's templates render it
    "{%- if tools %}<|im_start|>system\nYou may call these tools: {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class IncrementEnv:
    """As TRL's docs write an environment_factory environment: public methods are its tools."""

    def __init__(self):
        self._counter = 0

    def reset(self, **kwargs) -> str | None:
        self._counter = 0
        return None

    def increment(self, a: int) -> int:
        """
        Increment the integer by a specified value

        Args:
            a: The value to increment by

        Returns:
            The incremented integer.
        """
        self._counter += a
        return self._counter

    def get_reward(self) -> float:
        return float(self._counter)


def increment(a: int) -> int:
    """
    Add a value to 10.

    Args:
        a: The value to add

    Returns:
        The sum.
    """
    return 10 + a


def chat_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level, no merges (every text round-trips), the chat markers special and the whole tool call one token."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    core = Tokenizer(models.BPE({c: i for i, c in enumerate(sorted(alphabet))}, []))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core)
    tokenizer.add_special_tokens({"eos_token": "<|im_end|>", "pad_token": "<|pad|>"})
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.add_tokens([CALL])
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def calling_policy(tokenizer):
    """A tiny Llama whose next token depends on the current token only: after a newline (the end of the assistant
    header) the tool call, after the call the end of the turn."""
    model = tiny_model(
        "llama",
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        max_position_embeddings=1024,
    )
    newline = tokenizer("\n", add_special_tokens=False).input_ids[-1]
    call, eos = tokenizer.convert_tokens_to_ids(CALL), tokenizer.eos_token_id
    with torch.no_grad():
        for layer in model.model.layers:  # the blocks add nothing: the residual stream is the token's embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        for token, axis in ((newline, 0), (call, 1)):
            embed[token] = 0.0
            embed[token, axis] = 1.0
        head[call] = 0.0
        head[call, 0] = 50.0  # newline -> the call
        head[eos] = 0.0
        head[eos, 1] = 50.0  # the call -> the end of the turn
    return model


def play(tokenizer, policy, environments, prompts, max_turns=3, lean=True):
    from dataclasses import replace

    ids, mask = left_pad([tokenizer(p, add_special_tokens=False).input_ids for p in prompts], tokenizer.pad_token_id)
    return sample_episodes(
        policy,
        ids,
        mask,
        replace(sampling(6, greedy=True), lean_decode=lean),
        len(prompts),
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        environments=environments,
        settings=EpisodeSettings(max_turns, 120, "tool"),
        tokenizer=tokenizer,
        chat=True,
    )


def test_tool_calls_are_read_in_the_hermes_form():
    assert parse_tool_calls(f"thinking {CALL} and {CALL}") == [("increment", {"a": 2})] * 2
    assert parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>') == [("f", {"x": 1})]
    assert parse_tool_calls("<tool_call>not json</tool_call> 4") == []  # plain text, as TRL reads it
    assert parse_tool_calls("The answer is 4") == []


def test_the_tools_schemas_reach_the_prompt_through_the_template():
    tokenizer = chat_tokenizer()
    schemas = tool_schemas(IncrementEnv())
    assert [s["function"]["name"] for s in schemas] == ["increment"]  # reset and get_reward are not tools
    assert schemas[0]["function"]["parameters"]["properties"]["a"]["type"] == "integer"
    text = render_messages(tokenizer, [{"role": "user", "content": "count"}], schemas)
    assert text.startswith("<|im_start|>system\nYou may call these tools: ") and json.dumps(schemas)[:40] in text
    assert [s["function"]["name"] for s in tool_schemas(FunctionTools(["tests.test_tool_environments.increment"]))] == [
        "increment"
    ]


@pytest.mark.parametrize("lean", [True, False])
def test_an_environment_factory_class_runs_unchanged(lean):
    """IncrementEnv as TRL's docs write it: the model calls `increment` each turn, each result goes back as a `tool`
    message through the template, the episode is cut at max_turns (truncated, said so), get_reward scores the
    finished episode, and reward functions that take `environments` get the instances."""
    tokenizer = chat_tokenizer()
    spec = EnvironmentSpec(
        "tests.test_tool_environments.IncrementEnv",
        lambda: ToolCalling(IncrementEnv(), tokenizer),
        5.0,
        EpisodeSettings(3, 120, "tool"),
        tools=tool_schemas(IncrementEnv()),
    )
    messages = [[{"role": "user", "content": "count to six"}]] * 2
    environments = spec.start_all([{"prompt": m} for m in messages])
    prompts = [render_messages(tokenizer, m, spec.tools) for m in messages]
    sampled = play(tokenizer, calling_policy(tokenizer), environments, prompts, lean=lean)
    for episode in sampled.episodes:
        assert [m["role"] for m in episode.messages] == ["assistant", "tool", "assistant", "tool", "assistant"]
        assert [m["content"] for m in episode.messages if m["role"] == "tool"] == ["2", "4"]
        assert all(m["content"] == CALL for m in episode.messages if m["role"] == "assistant")
        assert episode.truncated and not episode.terminated and episode.turns == 3
        assert episode.episode_return == 6.0  # get_reward after the third call
        assert episode.info == {"tool_calls": 1.0, "tool_failures": 0.0}
    # the tool's reply entered through the template, after the model's own end of turn
    reply = tokenizer.decode(sampled.completion_ids[0][sampled.episode_mask[0].bool()], skip_special_tokens=False)
    assert "<|im_end|>\n<|im_start|>tool\n2<|im_end|>\n<|im_start|>assistant\n" in reply
    seen = []

    def counted(completions, environments, **kwargs):
        seen.append(environments)
        return [float(e._counter) for e in environments]

    import tests.test_tool_environments as here

    here.counted = counted
    reward = Reward([RewardTerm(1.0, "tests.test_tool_environments:counted")], "raise")
    columns = {"environments": [e.user_environment for e in environments]}
    scores = reward(messages, [e.messages for e in sampled.episodes], None, columns)
    assert scores.tolist() == [6.0, 6.0] and all(type(e) is IncrementEnv for e in seen[0])
    close_all(environments)


def test_a_tools_list_of_plain_functions_runs_unchanged():
    tokenizer = chat_tokenizer()
    tools = FunctionTools([increment])
    spec = EnvironmentSpec("tools", lambda: ToolCalling(FunctionTools([increment]), tokenizer), 5.0, None)
    environments = spec.start_all([{"prompt": []}])
    prompt = render_messages(tokenizer, [{"role": "user", "content": "add"}], tool_schemas(tools))
    sampled = play(tokenizer, calling_policy(tokenizer), environments, [prompt], max_turns=2)
    episode = sampled.episodes[0]
    assert [m["content"] for m in episode.messages if m["role"] == "tool"] == ["12"]
    assert episode.truncated and episode.episode_return == 0.0  # plain functions own no reward


def test_a_tool_that_raises_answers_with_its_error_and_the_episode_goes_on():
    def increment(a: int) -> int:
        """
        Fails.

        Args:
            a: ignored
        """
        raise RuntimeError("counter offline")

    step = ToolCalling(FunctionTools([increment])).step(CALL)
    assert step.reply == [{"role": "tool", "name": "increment", "content": "{'error': 'counter offline'}"}]
    assert not step.done and step.info == {"tool_calls": 1.0, "tool_failures": 1.0}
    assert ToolCalling(FunctionTools([increment])).step("The answer is 4").terminated  # no call: the answer


def test_an_environment_factory_class_trains_and_evaluates_through_rloo_fit(tmp_path):
    """The same class named by Hydra's _target_ (env=environment_factory), chat data with its columns, reward=env:
    a real run trains on its episodes and evaluates them, get_reward scoring each; eval_samples.jsonl keeps each
    episode's turns with their roles."""
    import rloo

    tokenizer = chat_tokenizer()
    calling_policy(tokenizer).save_pretrained(tmp_path / "policy")
    tokenizer.save_pretrained(tmp_path / "policy")
    rows = [{"prompt": [{"role": "user", "content": f"count {i}"}], "reference": "6"} for i in range(16)]
    summary = rloo.fit(
        {
            "bootstrap": "none",
            "model.policy": str(tmp_path / "policy"),
            "model.tokenizer": str(tmp_path / "policy"),
            "env": "environment_factory",
            "env.environment._target_": "tests.test_tool_environments.IncrementEnv",
            "env.max_turns": 2,
            "env.max_episode_tokens": 100,
            "reward": "env",
            "judge": "none",
            "logger": "csv",
            "k": 2,
            "rollout_batch_size": 4,
            "micro_batch_size": 4,
            "generation_batch_size": 4,
            "total_episodes": 8,
            "response_length": 4,
            "eval.num_prompts": 4,
            "data.max_prompt_length": 400,
        },
        train_dataset=rows,
        eval_dataset=rows,
        output_dir=tmp_path / "run",
    )
    assert summary["status"] == "finished"
    for evaluation in (summary["initial"], summary["final"]):
        assert evaluation["eval/reward/env"] == 4.0 and evaluation["eval/truncated"] == 1.0
    record = json.loads((tmp_path / "run" / "eval_samples.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in record["messages"]] == ["assistant", "tool", "assistant"]
    assert record["truncated"] is True and record["turns"] == 2


# ---- an external rollout: TRL's rollout_func contract ----------------------------------------------------------------
CALLS = []


def canned_rollout(prompts, module):
    """An external harness: each prompt answered with its own first word and the end token, the middle token marked
    as the harness's (env_mask 0), and a field of its own for the reward functions."""
    tokenizer = module.tokenizer
    CALLS.append(list(prompts))
    out = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "judged_by": []}
    for prompt in prompts:
        word = prompt.split()[1]
        ids = tokenizer(" " + word + " ok", add_special_tokens=False).input_ids[:2] + [tokenizer.eos_token_id]
        out["prompt_ids"].append(tokenizer(prompt, add_special_tokens=False).input_ids)
        out["completion_ids"].append(ids)
        out["logprobs"].append([-1.0] * len(ids))
        out["env_mask"].append([1, 0, 1])
        out["judged_by"].append("harness-" + word)
    return out


def reads_the_harness_field(completions, judged_by=None, **kwargs):
    """The harness's field in training; held-out evaluation samples with the policy itself, which sets no such field:
    there the function does not apply (None), as a reward function that needs a training-only field says."""
    if judged_by is None:
        return [None] * len(completions)
    return [float(j.startswith("harness-")) for j in judged_by]


def test_an_external_rollout_samples_in_the_policys_place(embedded_task, tmp_path, monkeypatch):
    """rollout=module:function: the function gets each episode's prompt (k per prompt), its completions train the
    policy, its env_mask keeps its own tokens out of the loss, and its extra field reaches the reward functions."""
    import rloo

    monkeypatch.setenv("RLOO_CACHE_DIR", str(embedded_task / "cache"))
    CALLS.clear()
    summary = rloo.fit(
        {"debug": "fast", "logger": "csv", "judge": "none", "rollout": "tests.test_tool_environments:canned_rollout"},
        reward="tests.test_tool_environments:reads_the_harness_field",
        output_dir=tmp_path / "run",
    )
    assert summary["status"] == "finished"
    from omegaconf import OmegaConf

    k = OmegaConf.load(tmp_path / "run" / "config.yaml").k
    assert CALLS and len(CALLS[0]) % k == 0 and CALLS[0][0] == CALLS[0][k - 1]  # k per prompt, prompt-major
    import csv

    rows = list(csv.DictReader(open(next((tmp_path / "run").rglob("metrics.csv")))))
    scored = [float(r["reward/reads_the_harness_field"]) for r in rows if r.get("reward/reads_the_harness_field")]
    assert scored and all(v == 1.0 for v in scored)
    lengths = [float(r["completions/mean_length"]) for r in rows if r.get("completions/mean_length")]
    assert lengths and all(v == 2.0 for v in lengths)  # the model's two tokens; the harness's one is not counted


def test_an_external_rollout_that_returns_the_wrong_shape_is_one_line():
    from rloo.generation.external import sampled_from_external
    from rloo.utils.errors import RewardFunctionError

    with pytest.raises(RewardFunctionError, match=r"^rollout=m:f: returned no logprobs \(it must return"):
        sampled_from_external({"prompt_ids": [[1]], "completion_ids": [[2]]}, 1, 0, 1, "cpu", "m:f")
    with pytest.raises(RewardFunctionError, match=r"^rollout=m:f: completion_ids holds 1 rows, not 2"):
        sampled_from_external(
            {"prompt_ids": [[1]] * 2, "completion_ids": [[2]], "logprobs": [[0.0]]}, 2, 0, 1, "cpu", "m:f"
        )
    with pytest.raises(RewardFunctionError, match=r"row 0: 1 completion ids, 2 logprobs"):
        sampled_from_external(
            {"prompt_ids": [[1]], "completion_ids": [[2]], "logprobs": [[0.0, 0.0]]}, 1, 0, 1, "cpu", "m:f"
        )
