"""A tiny Pythia-style byte-level BPE tokenizer for the toy task.

The full 256-byte alphabet is kept so any text (including garbage a policy
emits) encodes and decodes losslessly; merges are learned on task text so
every task word with its leading space becomes a single token.
"""

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from rloo.toy.task import ALL_WORDS, make_examples

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "[PAD]"
# 256 bytes + 2 specials leave no room for merges at the brief's 256, so the
# default is 512 (a Pythia-like multiple of 128).  On the task corpus BPE runs
# out of merges before that; the real size is len(tokenizer) (see tests).
DEFAULT_VOCAB_SIZE = 512
MODEL_MAX_LENGTH = 128

# User turns render as "User: <content>\n\n"; assistant turns as
# "Assistant:<content>" + EOS (completions carry their own leading space);
# add_generation_prompt appends "Assistant:".
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\n\n' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ 'Assistant:' + message['content'] + eos_token }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


def train_tokenizer(texts, vocab_size=DEFAULT_VOCAB_SIZE):
    """Train a byte-level BPE tokenizer on texts and wrap it for transformers."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        unk_token=None,
        pad_token=PAD_TOKEN,
        padding_side="left",
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def task_corpus(n_examples=2000, seed=0):
    """Training text for the tokenizer: examples plus every word and chat marker."""
    texts = [ex["prompt"] + ex["reference"] for ex in make_examples(n_examples, seed)]
    # Guarantee rare words are seen often enough to be merged into one token.
    texts += [" " + " ".join(ALL_WORDS)] * 10
    texts += ["User: POST: \n\nAssistant:"] * 10
    return texts


def build_task_tokenizer(vocab_size=DEFAULT_VOCAB_SIZE):
    """The canonical tokenizer for the toy task."""
    return train_tokenizer(task_corpus(), vocab_size)
