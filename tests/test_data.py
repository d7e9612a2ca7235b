"""PromptDataModule: local formats, chat-message prompts, length filtering, left padding, exact rollout counts."""

import copy
import json

import datasets
import pytest
import torch

from rloo.data.prompts import EpisodeSampler, PromptDataModule, SplitSpec, left_pad, load_split, tokenize_prompts
from rloo.utils.errors import ConfigError

ROWS = [
    {"prompt": f"POST: the {w} was there\n\nTL;DR:", "reference": f" {w}"}
    for w in ("cat", "dog", "boat", "rain", "car")
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "arrow", "saved_dir"])
def test_local_formats_load_the_same_rows(tmp_path, kind):
    dataset = datasets.Dataset.from_list(ROWS)
    if kind == "jsonl":
        path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    elif kind == "parquet":
        path = tmp_path / "p.parquet"
        dataset.to_parquet(str(path))
    elif kind == "arrow":  # an Arrow stream file, as datasets writes its shards
        dataset.save_to_disk(str(tmp_path / "shards"))
        path = next((tmp_path / "shards").glob("*.arrow")).rename(tmp_path / "p.arrow")
    else:
        path = tmp_path / "saved"
        datasets.DatasetDict({"train": dataset}).save_to_disk(str(path))
    loaded = load_split(SplitSpec(path=str(path), split="train", prompt_column="prompt", reference_column=None))
    assert loaded["prompt"] == [r["prompt"] for r in ROWS]


def test_left_pad():
    ids, mask = left_pad([[5, 6, 7], [8]], pad_token_id=1)
    assert ids.tolist() == [[5, 6, 7], [1, 1, 8]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_long_prompts_are_dropped_or_left_truncated_and_counted(tokenizer):
    rows = ROWS + [{"prompt": "POST: " + "the " * 80 + "cat\n\nTL;DR:", "reference": " cat"}]
    dataset = datasets.Dataset.from_list(rows)
    spec = SplitSpec(path="mem", split="train", prompt_column="prompt", reference_column="reference")
    kept, over, _ = tokenize_prompts(dataset, spec, tokenizer, max_prompt_length=32, truncate=False)
    assert over == 1 and len(kept) == 5
    kept, over, _ = tokenize_prompts(dataset, spec, tokenizer, max_prompt_length=32, truncate=True)
    assert over == 1 and len(kept) == 6 and len(kept[-1]["prompt_ids"]) == 32
    tail = tokenizer(rows[-1]["prompt"], add_special_tokens=False).input_ids[-32:]
    assert kept[-1]["prompt_ids"] == tail  # the end of the prompt (the generation cue) survives


def test_tldr_format_messages_are_rendered_with_the_recipe_template(tmp_path, tokenizer):
    """The published data layout on small local files: train has messages [user, assistant]; eval has
    prompt/completion."""
    from tests.test_config import composed

    train = write_jsonl(
        tmp_path / "train.jsonl",
        [
            {
                "messages": [
                    {"role": "user", "content": "SUBREDDIT: r/pets\n\nTITLE: cat\n\nPOST: my cat\n\nTL;DR:"},
                    {"role": "assistant", "content": " my cat is great"},
                ]
            }
        ]
        * 3,
    )
    validation = write_jsonl(
        tmp_path / "validation.jsonl",
        [{"prompt": "SUBREDDIT: r/pets\n\nTITLE: dog\n\nPOST: my dog\n\nTL;DR:", "completion": " dog"}] * 2,
    )
    cfg = composed("model=pythia1b", f"data.train.path={train}", f"data.validation.path={validation}")
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = cfg.model.chat_template
    dm = PromptDataModule(
        tok,
        SplitSpec(**cfg.data.train),
        SplitSpec(**cfg.data.validation),
        cfg.data.max_prompt_length,
        cfg.data.truncate_prompts,
        prompts_per_rollout=1,
        num_rollouts=2,
        seed=0,
        shuffle=True,
        num_workers=0,
        log=lambda *_: None,
    )
    dm.setup()
    assert dm.train_rows[0]["prompt"] == "User: SUBREDDIT: r/pets\n\nTITLE: cat\n\nPOST: my cat\n\nTL;DR:\n\nAssistant:"
    assert dm.train_rows[0]["reference"] == " my cat is great"
    assert dm.eval_rows(5)[0]["reference"] == " dog" and len(dm.eval_rows(5)) == 2


def test_missing_column_names_the_column_and_file(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    spec = SplitSpec(path=str(path), split="train", prompt_column="query", reference_column=None)
    with pytest.raises(ConfigError, match="query.*p.jsonl"):
        tokenize_prompts(load_split(spec), spec, tokenizer, 64, False)


def test_episode_sampler_yields_exact_count_with_full_reshuffled_passes():
    sampler = EpisodeSampler(dataset_size=5, num_samples=12, seed=3)
    indices = list(sampler)
    assert len(indices) == len(sampler) == 12
    assert sorted(indices[:5]) == sorted(indices[5:10]) == list(range(5))  # each pass covers the dataset once
    assert indices[:5] != indices[5:10]  # and is reshuffled
    assert list(EpisodeSampler(5, 12, seed=3)) == indices  # seeded


def test_train_dataloader_has_one_batch_per_rollout(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "p.jsonl", ROWS)
    spec = SplitSpec(path=str(path), split="train", prompt_column="prompt", reference_column="reference")
    dm = PromptDataModule(
        tokenizer,
        spec,
        spec,
        64,
        False,
        prompts_per_rollout=2,
        num_rollouts=7,
        seed=0,
        shuffle=True,
        num_workers=0,
        log=lambda *_: None,
    )
    dm.setup()
    batches = list(dm.train_dataloader())
    assert len(batches) == 7
    for batch in batches:
        assert batch["prompt_ids"].shape[0] == 2
        assert (batch["prompt_mask"][:, -1] == 1).all()  # left padded: the last position is always real
        assert torch.equal(batch["prompt_ids"] == tokenizer.pad_token_id, batch["prompt_mask"] == 0)


def test_bytes_that_are_not_utf8_are_named_by_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n')  # latin-1 e-acute on line 2
    spec = SplitSpec(path=str(path), split="train", prompt_column="prompt", reference_column=None)
    with pytest.raises(ConfigError) as caught:
        load_split(spec, "data.train")
    assert str(caught.value) == (
        f"data.train.path={str(path)!r} is not UTF-8 text: line 2 has byte 0xe9 at column 16; save it as UTF-8"
    )


def test_empty_prompts_are_dropped_and_counted_and_all_empty_is_one_line(tmp_path, tokenizer):
    """Blank text, null and chat messages with blank contents ask nothing: dropped and counted like over-long
    prompts; a split with nothing else stops in one line, before any model loads."""
    rows = [
        {"prompt": "POST: the cat was there\n\nTL;DR:"},
        {"prompt": ""},
        {"prompt": "  \n\t"},
        {"prompt": None},
    ]
    spec = SplitSpec(path="mem", split="train", prompt_column="prompt", reference_column=None)
    kept, over, empty = tokenize_prompts(datasets.Dataset.from_list(rows), spec, tokenizer, 64, False)
    assert (len(kept), over, empty) == (1, 0, 3) and kept[0]["prompt"].startswith("POST: the cat")
    chats = [{"prompt": [{"role": "system", "content": ""}, {"role": "user", "content": " "}]}]
    assert tokenize_prompts(datasets.Dataset.from_list(chats), spec, tokenizer, 64, False) == ([], 0, 1)

    path = write_jsonl(tmp_path / "blank.jsonl", rows[1:3])
    blank = SplitSpec(path=str(path), split="train", prompt_column="prompt", reference_column=None)
    module = PromptDataModule(tokenizer, blank, blank, 64, False, 2, 1, seed=0, shuffle=False, num_workers=0, log=print)
    with pytest.raises(ConfigError, match=r"^data.train: every prompt of .*blank.jsonl is empty \(2 rows of blank"):
        module.setup("fit")
