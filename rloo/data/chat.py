"""Chat-message prompts: rendering them with the tokenizer's template, the system message every row gets
(`data.system_prompt`), and the one a template inserts where a conversation has none, which is said, never silent.

A prompt column holds plain text or a list of {role, content} messages (TRL's conversational format); a trailing
assistant message is the reference completion, and the rest is what the model is prompted with.
"""

from __future__ import annotations

from functools import lru_cache

from rloo.data.padding import left_pad
from rloo.utils.errors import ConfigError

# probe contents no real conversation holds, to see what a template adds around them
_PROBE_USER, _PROBE_SYSTEM = "rloo-probe-user-5c1e", "rloo-probe-system-5c1e"


def is_messages(value) -> bool:
    """Whether a prompt value is a list of chat messages, each a dict with a role and a content."""
    return isinstance(value, (list, tuple)) and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in value
    )


def has_system_message(messages: list[dict]) -> bool:
    return bool(messages) and messages[0]["role"] == "system"


def with_system_prompt(messages: list[dict], system_prompt: str | None) -> list[dict]:
    """`messages` with their leading system message set to `system_prompt` (added where there is none, replaced
    where there is one); None leaves them as they are. An empty string is an empty system message: where a template
    inserts its own default when a conversation has none (SmolLM2, Qwen2.5), that is how to have no system text."""
    if system_prompt is None:
        return list(messages)
    rest = list(messages[1:]) if has_system_message(messages) else list(messages)
    return [{"role": "system", "content": system_prompt}, *rest]


def render_prompt(
    value, tokenizer, where: str, system_prompt: str | None = None, tools: list[dict] | None = None
) -> tuple[str, str | None, list | None]:
    """(the prompt text the model sees, the reference from a trailing assistant message or None, and for chat
    messages the messages it was rendered from: the reference left out, `system_prompt` applied; None for text).
    `tools`: the JSON schemas of an environment's tools, which the chat template shows the model."""
    if isinstance(value, str):
        return value, None, None
    if not is_messages(value):
        raise ConfigError(
            f"{where} holds {type(value).__name__} {str(value)[:40]!r}: text, or a list of chat messages "
            "{role, content}"
        )
    messages = [dict(m, content=text_content(m["content"], where, i)) for i, m in enumerate(value)]
    reference = None
    if messages and messages[-1]["role"] == "assistant":
        reference = messages[-1]["content"]
        messages = messages[:-1]
    messages = with_system_prompt(messages, system_prompt)
    if tokenizer.chat_template is None:
        raise ConfigError(
            f"{where} holds chat messages but the tokenizer has no chat template: set model.chat_template"
        )
    return render_messages(tokenizer, messages, tools), reference, messages


def text_content(content, where: str, index: int) -> str:
    """A message's content as text: a string as it is; the parts form many datasets use
    (`[{"type": "text", "text": ...}, ...]`, which transformers' chat templates accept) as its texts joined, as
    those templates render them; anything else (a number, an image part) is one line."""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)) and all(isinstance(part, dict) for part in content):
        if all(part.get("type") == "text" and isinstance(part.get("text"), str) for part in content):
            return "".join(part["text"] for part in content)
        kinds = sorted({str(part.get("type")) for part in content} - {"text"}) or ["text without a string"]
        raise ConfigError(
            f"{where}: message {index}'s content has {', '.join(kinds)} parts: rloo trains text models, give "
            "{'type': 'text', 'text': ...} parts"
        )
    raise ConfigError(
        f"{where}: message {index}'s content is {type(content).__name__} {str(content)[:40]!r}: text, or a list of "
        "{'type': 'text', 'text': ...} parts"
    )


def render_messages(tokenizer, messages: list[dict], tools: list[dict] | None = None) -> str:
    """Chat messages as the prompt text the model sees: the template's rendering with its generation prompt (and the
    tools' schemas, where given, as the tool-calling template shows them)."""
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)


def with_observation(prompt, observation: str):
    """A prompt with an environment's first observation appended: to the last message's content for chat messages
    (TRL's environment convention), to the text for a text prompt."""
    if isinstance(prompt, str):
        return prompt + observation
    last = dict(prompt[-1])
    last["content"] = last["content"] + observation
    return [*prompt[:-1], last]


def template_system_prompt(tokenizer) -> str | None:
    """The system message the tokenizer's chat template inserts where a conversation has none (SmolLM2's "You are a
    helpful AI assistant named SmolLM, trained by Hugging Face"), or None where it inserts none, has no template
    or takes no system role. Found by rendering one user turn alone and after a system turn: a template that inserts
    its own renders the first as the second with its default text in the system turn's place."""
    template = getattr(tokenizer, "chat_template", None)
    return None if template is None else _inserted_system(tokenizer, str(template))


def renders_system_messages(tokenizer) -> bool:
    """Whether the tokenizer's chat template renders a system message's content (some drop it, some raise)."""
    template = getattr(tokenizer, "chat_template", None)
    return template is not None and _probes(tokenizer, str(template))[1] is not None


@lru_cache(maxsize=8)
def _probes(tokenizer, template: str) -> tuple[str | None, str | None]:
    """The template's rendering of one user turn, and of a system turn before it (None where it raises or drops
    the system turn's content)."""
    user = [{"role": "user", "content": _PROBE_USER}]
    try:
        alone = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    except Exception:
        return None, None
    try:
        both = tokenizer.apply_chat_template(
            [{"role": "system", "content": _PROBE_SYSTEM}, *user], tokenize=False, add_generation_prompt=True
        )
    except Exception:  # a template without a system role
        return alone, None
    return alone, both if _PROBE_SYSTEM in both else None


def _inserted_system(tokenizer, template: str) -> str | None:
    alone, both = _probes(tokenizer, template)
    if alone is None or both is None:
        return None
    head, tail = both.split(_PROBE_SYSTEM, 1)
    if not (alone.startswith(head) and alone.endswith(tail) and len(alone) >= len(head) + len(tail)):
        return None
    return alone[len(head) : len(alone) - len(tail)].strip() or None


def is_empty_prompt(value) -> bool:
    """A prompt with nothing to answer: null, blank text, or chat messages whose contents are all blank."""
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, (list, tuple)) and all(isinstance(m, dict) for m in value):
        return not any(str(m.get("content") or "").strip() for m in value)
    return False  # render_prompt names what it is


def completion_text(completion) -> str:
    """A completion's text in either of TRL's forms: the string, or the last message's content of a message list
    (`[{"role": "assistant", "content": text}]`), for reward functions that take both."""
    return completion if isinstance(completion, str) else str(completion[-1]["content"])


def prompt_text(prompt) -> str:
    """A prompt's text in either form: the string, or its messages' contents joined by newlines."""
    return prompt if isinstance(prompt, str) else "\n".join(str(m.get("content") or "") for m in prompt)


def observed_prompts(prompts: list, prompt_ids: list[list[int]], observations: list, tokenizer, tools=None):
    """Each episode's prompt (as the data has it) and its token ids, left-padded (`[N, P]` ids and mask), with its
    environment's first observation appended (with_observation: for chat messages to the last message, TRL's
    convention, rendered again through the template with the tools); an episode without one keeps its own."""
    out_prompts, out_ids = [], []
    for prompt, ids, observation in zip(prompts, prompt_ids, observations):
        if observation is not None:
            prompt = with_observation(prompt, observation)
            text = prompt if isinstance(prompt, str) else render_messages(tokenizer, prompt, tools)
            ids = tokenizer(text, add_special_tokens=False).input_ids
        out_prompts.append(prompt)
        out_ids.append(list(ids))
    return (out_prompts, *left_pad(out_ids, tokenizer.pad_token_id))
