"""Behaviour tests for the toy TL;DR task, its preference data and tokenizer."""

import pytest
from transformers import AutoTokenizer

from rloo.toy import task
from rloo.toy.preferences import make_preference_pairs
from rloo.toy.task import (
    ALL_WORDS,
    FILLER_WORDS,
    TIC_WORDS,
    TOPIC_WORDS,
    ideal_summary,
    make_examples,
    make_splits,
    oracle_judge,
    oracle_score,
    post_topics,
)
from rloo.toy.tokenizer import build_task_tokenizer

# Hand-written post with topics cat, boat, rain (n_topics = 3).
PROMPT = "POST: the cat was really on my boat then rain today\n\nTL;DR:"


@pytest.fixture(scope="module")
def tokenizer():
    return build_task_tokenizer()


@pytest.fixture(scope="module")
def splits():
    return make_splits()


def test_vocabulary_is_disjoint_lowercase_single_words():
    assert len(set(ALL_WORDS)) == len(ALL_WORDS)
    assert all(w.isalpha() and w.islower() for w in ALL_WORDS)


@pytest.mark.parametrize(
    "completion, expected",
    [
        (" cat boat rain", 1.0),
        ("cat boat rain", 1.0),  # whitespace does not matter
        (" cat boat", 1 / 3),  # 2 hits - 1 miss
        (" boat rain", 1 / 3),
        (" cat", -1 / 3),  # 1 hit - 2 misses
        (" cat boat rain lol", 2 / 3),  # one extra (tic)
        (" the cat boat rain", 2 / 3),  # one extra (filler from the post)
        (" cat boat rain dog", 2 / 3),  # hallucinated topic is an extra
        (" cat cat boat rain", 2 / 3),  # duplicate is an extra
        (" cat boat rain rain rain", 1 / 3),
        (" boat cat rain", 2.5 / 3),  # order error costs 0.5
        (" rain boat cat lol", 1.5 / 3),  # order error + extra
        (" cat boat rain<|endoftext|> lol", 1.0),  # text after EOS is ignored
        ("", -1.0),  # 0 hits - 3 misses
        ("   \n ", -1.0),
        (" ###@@ \x00 漢字", -2.0),  # three garbage words, 3 misses
    ],
)
def test_oracle_score_hand_examples(completion, expected):
    assert oracle_score(PROMPT, completion) == pytest.approx(expected)


def test_oracle_score_two_and_four_topics():
    two = "POST: so dog and my lamp was\n\nTL;DR:"
    assert oracle_score(two, " dog lamp") == pytest.approx(1.0)
    assert oracle_score(two, " dog") == pytest.approx(0.0)
    four = "POST: pizza the book it snow we horse\n\nTL;DR:"
    assert oracle_score(four, " pizza book snow") == pytest.approx(0.5)
    assert oracle_score(four, " pizza book snow horse anyway") == pytest.approx(0.75)


def test_oracle_score_works_inside_chat_template():
    chat = "User: " + PROMPT + "\n\nAssistant:"
    assert oracle_score(chat, " cat boat rain") == 1.0


def test_oracle_rejects_non_task_prompt():
    with pytest.raises(ValueError):
        oracle_score("hello there", " cat")


def test_oracle_judge():
    assert oracle_judge(PROMPT, " cat boat rain", " cat boat") == 1.0
    assert oracle_judge(PROMPT, " cat lol", " cat boat") == 0.0
    assert oracle_judge(PROMPT, " cat boat lol", " cat boat the") == 0.5
    assert oracle_judge(PROMPT, "", "") == 0.5


def test_ideal_summary():
    assert ideal_summary(PROMPT) == " cat boat rain"
    assert task.modal_human_summary(PROMPT) == " cat boat"


def test_examples_format_and_structure():
    for ex in make_examples(500, seed=3):
        prompt = ex["prompt"]
        assert prompt.startswith("POST: ") and prompt.endswith("\n\nTL;DR:")
        words = prompt[len("POST: ") : -len("\n\nTL;DR:")].split(" ")
        assert 6 <= len(words) <= 12
        topics = [w for w in words if w in TOPIC_WORDS]
        assert 2 <= len(topics) <= 4 and len(set(topics)) == len(topics)
        assert all(w in TOPIC_WORDS or w in FILLER_WORDS for w in words)
        assert oracle_score(prompt, ideal_summary(prompt)) == 1.0
        assert ex["reference"].startswith(" ") and "<|endoftext|>" not in ex["reference"]


def test_the_hard_shape_draws_longer_posts_with_more_topics_and_its_pairs_follow_it():
    from collections import Counter

    from rloo.toy.task import PostShape, post_topics

    hard = PostShape(length=(12, 24), topics=(3, 4, 5, 6))
    examples = make_examples(2000, seed=3, shape=hard)
    lengths = [len(task.post_words(ex["prompt"])) for ex in examples]
    counts = Counter(len(post_topics(ex["prompt"])) for ex in examples)
    assert min(lengths) == 12 and max(lengths) == 24
    assert set(counts) == {3, 4, 5, 6} and min(counts.values()) > 400  # uniform: about 500 each
    assert all(3 <= len(post_topics(p["prompt"])) <= 6 for p in make_preference_pairs(200, seed=3, shape=hard))
    assert make_examples(50, seed=7) == make_examples(50, seed=7, shape=PostShape())  # the default is unchanged
    with pytest.raises(ValueError, match="topic counts"):
        PostShape(length=(2, 4), topics=(3,))  # more topics than the shortest post has words
    with pytest.raises(ValueError, match="post length"):
        PostShape(length=(5, 4))


def test_generators_are_deterministic_given_seed():
    assert make_examples(50, seed=7) == make_examples(50, seed=7)
    assert make_examples(50, seed=7) != make_examples(50, seed=8)
    assert make_preference_pairs(50, seed=7) == make_preference_pairs(50, seed=7)
    assert make_preference_pairs(50, seed=7) != make_preference_pairs(50, seed=8)
    small = make_splits(seed=1, n_train=100, n_validation=50, n_test=50)
    assert small == make_splits(seed=1, n_train=100, n_validation=50, n_test=50)


def test_splits_sizes_and_no_overlap(splits):
    assert {k: len(v) for k, v in splits.items()} == {"train": 20000, "validation": 2000, "test": 2000}
    prompts = {k: [ex["prompt"] for ex in v] for k, v in splits.items()}
    assert all(len(set(p)) == len(p) for p in prompts.values())
    train = set(prompts["train"])
    assert not train & set(prompts["validation"])
    assert not train & set(prompts["test"])
    assert not set(prompts["validation"]) & set(prompts["test"])
    # Splits come from different streams, not shifted copies of one.
    assert prompts["train"][:10] != prompts["validation"][:10]


def test_reference_habit_rates():
    n_drop = n_tic = n_swap = n_swap_eligible = n_differ = 0
    examples = make_examples(2000, seed=11)
    for ex in examples:
        topics = post_topics(ex["prompt"])
        ref = ex["reference"].split()
        n_drop += topics[-1] not in ref
        n_tic += any(w in TIC_WORDS for w in ref)
        kept = [w for w in ref if w in TOPIC_WORDS]
        if len(kept) >= 2:
            n_swap_eligible += 1
            n_swap += kept != [w for w in topics if w in kept]
        n_differ += ex["reference"] != ideal_summary(ex["prompt"])
    n = len(examples)
    assert n_drop / n == pytest.approx(task.HUMAN_DROP_LAST_PROB, abs=0.04)
    assert n_tic / n == pytest.approx(task.HUMAN_TIC_PROB, abs=0.04)
    assert n_swap / n_swap_eligible == pytest.approx(task.HUMAN_SWAP_PROB, abs=0.03)
    # Matches the ideal only if nothing fired (swap is always eligible then).
    p_same = (1 - task.HUMAN_DROP_LAST_PROB) * (1 - task.HUMAN_TIC_PROB) * (1 - task.HUMAN_SWAP_PROB)
    assert n_differ / n == pytest.approx(1 - p_same, abs=0.04)


def test_preference_pairs_are_strict_and_diverse():
    pairs = make_preference_pairs(2000, seed=5)
    assert len(pairs) == 2000 and set(pairs[0]) == {"prompt", "chosen", "rejected"}
    for p in pairs:
        assert oracle_score(p["prompt"], p["chosen"]) > oracle_score(p["prompt"], p["rejected"])
    rejected = [p["rejected"].split() for p in pairs]
    assert any(any(w in TIC_WORDS for w in r) for r in rejected)
    assert any(len(r) == 0 for r in rejected)
    assert any(len(r) != len(set(r)) for r in rejected)  # duplicates
    hallucinated = [w for p, r in zip(pairs, rejected) for w in r if w in TOPIC_WORDS and w not in p["prompt"].split()]
    assert hallucinated
    assert sum(p["chosen"] == ideal_summary(p["prompt"]) for p in pairs) > 100


def test_simulated_win_rates(splits):
    rates = task.simulated_win_rates(splits["validation"])
    print(f"\nsimulated win rates over 2000 validation prompts: {rates}")
    # Ideal wins unless the reference equals it (prob p_same, a tie = 0.5).
    p_same = (1 - task.HUMAN_DROP_LAST_PROB) * (1 - task.HUMAN_TIC_PROB) * (1 - task.HUMAN_SWAP_PROB)
    assert rates["ideal_vs_reference"] == pytest.approx(1 - p_same / 2, abs=0.03)
    # Imitating the human mode does not beat the humans: RL has headroom.
    assert rates["modal_human_vs_reference"] < 0.5


def test_tokenizer_special_tokens_and_settings(tokenizer):
    assert tokenizer.eos_token == tokenizer.bos_token == "<|endoftext|>"
    assert tokenizer.pad_token == "[PAD]" and tokenizer.pad_token_id != tokenizer.eos_token_id
    assert tokenizer.padding_side == "left" and tokenizer.model_max_length == 128
    assert len(tokenizer) <= 512
    batch = tokenizer(["POST: cat\n\nTL;DR:", PROMPT], padding=True)
    assert batch["input_ids"][0][0] == tokenizer.pad_token_id
    assert batch["attention_mask"][0][0] == 0


def test_every_task_word_is_one_token(tokenizer):
    for word in ALL_WORDS:
        assert len(tokenizer(" " + word).input_ids) == 1, word


def test_tokenizer_round_trip(tokenizer):
    texts = [PROMPT, " cat boat rain", "", " ###@@ \x00 漢字 é"]
    for ex in make_examples(200, seed=2):
        texts += [ex["prompt"], ex["reference"], ex["prompt"] + ex["reference"]]
    for text in texts:
        ids = tokenizer(text).input_ids
        assert len(ids) <= 128
        assert tokenizer.decode(ids) == text


def test_chat_template(tokenizer):
    messages = [{"role": "user", "content": PROMPT}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == "User: " + PROMPT + "\n\nAssistant:"
    assert oracle_score(rendered, " cat boat rain") == 1.0


def test_save_and_reload_offline(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded(PROMPT).input_ids == tokenizer(PROMPT).input_ids
    assert loaded.decode(loaded(PROMPT).input_ids) == PROMPT
    assert (loaded.pad_token, loaded.eos_token, loaded.padding_side) == ("[PAD]", "<|endoftext|>", "left")
    assert loaded.model_max_length == 128
    assert loaded.chat_template == tokenizer.chat_template
