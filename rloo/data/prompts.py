"""Prompts for RL: `PromptDataModule` over HF `datasets`, left-padded, with exact rollout counts.

A prompt column holds plain text or a list of chat messages; a trailing assistant message is the
reference completion and the rest is rendered with the tokenizer's chat template (rloo.data.chat).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch
from lightning import LightningDataModule
from torch.utils.data import DataLoader, Sampler

from rloo.data.chat import (
    has_system_message,
    is_empty_prompt,
    render_prompt,
    renders_system_messages,
    template_system_prompt,
)
from rloo.data.padding import left_pad
from rloo.data.settings import SplitSpec
from rloo.utils.errors import ConfigError

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}


def load_split(spec: SplitSpec, key: str = "data") -> datasets.Dataset:
    """A local file (.jsonl/.json/.parquet/.csv), a `save_to_disk` dir, or a hub id. Anything that cannot be read,
    or holds no rows, is a one-line ConfigError naming `key` (data.train, data.validation) and the file."""
    path = Path(spec.path).expanduser()
    where = f"{key}.path={spec.path!r}"
    if path.is_dir():
        try:
            loaded = datasets.load_from_disk(str(path))
        except Exception as error:  # datasets raises several kinds for a dir that is not one of its own
            raise ConfigError(f"{where} is not a datasets.save_to_disk dir ({_first_line(error)})") from None
        if isinstance(loaded, datasets.DatasetDict):
            if spec.split not in loaded:
                raise ConfigError(f"{key}.split={spec.split!r} is not in {path} (splits: {', '.join(loaded)})")
            loaded = loaded[spec.split]
        dataset = loaded
    elif path.suffix in FILE_BUILDERS:
        if not path.is_file():
            raise ConfigError(f"{where} does not exist")
        if path.stat().st_size == 0:
            raise ConfigError(f"{where} is empty: no prompts")
        if (bad := _undecodable_line(path)) is not None:
            raise ConfigError(f"{where} is not UTF-8 text: {bad}; save it as UTF-8")
        try:
            dataset = datasets.load_dataset(FILE_BUILDERS[path.suffix], data_files=str(path), split="train")
        except Exception as error:
            raise ConfigError(
                f"{where} cannot be read as {path.suffix[1:]}: {_malformed_line(path) or _first_line(error)}"
            ) from None
    else:
        try:
            dataset = datasets.load_dataset(spec.path, split=spec.split)
        except Exception as error:
            raise ConfigError(
                f"{where} is not a local file or dir and cannot be loaded as a dataset id ({_first_line(error)})"
            ) from None
    if len(dataset) == 0:
        raise ConfigError(f"{where} holds no rows")
    return dataset


def _first_line(error: Exception) -> str:
    """The first line of what went wrong: of the innermost cause, where datasets wraps it (its
    DatasetGenerationError says only that an error occurred; pyarrow's cause names the column and the row)."""
    while error.__cause__ is not None:
        error = error.__cause__
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0][:200]}" if text else type(error).__name__


def _undecodable_line(path: Path) -> str | None:
    """The first line of a text file (.jsonl, .json, .csv) that is not UTF-8, said with its number and the byte."""
    if path.suffix not in (".jsonl", ".json", ".csv"):
        return None
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                return f"line {number} has byte 0x{line[error.start]:02x} at column {error.start + 1}"
    return None


def _malformed_line(path: Path) -> str | None:
    """The first line of a .jsonl file that is not a JSON object, said with its number."""
    if path.suffix != ".jsonl":
        return None
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                if not isinstance(json.loads(line), dict):
                    return f"line {number} is not a JSON object"
            except json.JSONDecodeError as error:
                return f"line {number} is not JSON ({error.msg})"
    return None


def tokenize_prompts(
    dataset: datasets.Dataset,
    spec: SplitSpec,
    tokenizer,
    max_prompt_length: int,
    truncate: bool,
    key: str = "data",
    system_prompt: str | None = None,
    tools: list[dict] | None = None,
) -> tuple[list[dict], int, int]:
    """Render and tokenize every row; empty prompts are dropped, prompts over max_prompt_length dropped or
    left-truncated; chat messages get `system_prompt` (rloo.data.chat.with_system_prompt; None: as they are).

    Returns rows {prompt, reference, prompt_ids, columns, messages}, the number of prompts dropped (or truncated)
    for their length, and the number dropped as empty; `columns` holds the row's other columns by name, for reward
    functions that ask for them (an `answer`, say); `messages` the chat messages the prompt was rendered from, as
    TRL's conversational reward functions get them (None for a text prompt).
    """
    for name, column in (("prompt_column", spec.prompt_column), ("reference_column", spec.reference_column)):
        if column is not None and column not in dataset.column_names:
            raise ConfigError(
                f"{key}.{name}={column!r} is not a column of {spec.path} (columns: {', '.join(dataset.column_names)})"
            )
    rows, over_length, empty = [], 0, 0
    for index, example in enumerate(dataset):
        if is_empty_prompt(example[spec.prompt_column]):
            empty += 1
            continue
        prompt, reference, messages = render_prompt(
            example[spec.prompt_column],
            tokenizer,
            f"{key}.prompt_column={spec.prompt_column!r} at row {index} of {spec.path}",
            system_prompt,
            tools,
        )
        if spec.reference_column is not None:
            reference = example[spec.reference_column]
            if reference is not None and not isinstance(reference, str):
                raise ConfigError(
                    f"{key}.reference_column={spec.reference_column!r} at row {index} of {spec.path} "
                    f"holds {type(reference).__name__}: text or null"
                )
        ids = tokenizer(prompt, add_special_tokens=False).input_ids
        if len(ids) > max_prompt_length:
            over_length += 1
            if not truncate:
                continue
            ids = ids[-max_prompt_length:]  # keep the end: it holds the question and the generation prompt
        columns = {name: value for name, value in example.items() if name != spec.prompt_column}
        rows.append(
            {"prompt": prompt, "reference": reference, "prompt_ids": ids, "columns": columns, "messages": messages}
        )
    return rows, over_length, empty


def system_prompt_note(rows: list[dict], tokenizer, system_prompt: str | None, where: str) -> tuple[str | None, dict]:
    """What the log and summary.json say of the system message: the line where the tokenizer's template inserts one
    the data does not have (None where it does not), and the counts. `data.system_prompt` on text prompts does
    nothing: refused."""
    chats = [row["messages"] for row in rows if row["messages"] is not None]
    if system_prompt is not None and not chats:
        raise ConfigError(
            f"data.system_prompt={system_prompt!r} sets the system message of chat-message prompts, and {where} holds "
            "text prompts: remove it, or give prompts as lists of {role, content} messages"
        )
    if system_prompt is not None and not renders_system_messages(tokenizer):
        raise ConfigError(
            f"data.system_prompt={system_prompt!r} would do nothing: the tokenizer's chat template does not render "
            "system messages; remove it, or set model.chat_template to one that does"
        )
    inserted = template_system_prompt(tokenizer) if chats else None
    without = sum(not has_system_message(messages) for messages in chats)
    if inserted is None or without == 0:
        return None, {}
    line = (
        f"data: {where}: the chat template adds a system message the data does not have to {without} of "
        f"{len(rows)} prompts: {inserted[:100]!r} (data.system_prompt='...' sets one for every row, '' leaves it "
        "empty)"
    )
    return line, {"template_system_prompt": inserted, "prompts_given_it": without}


class EpisodeSampler(Sampler[int]):
    """Exactly `num_samples` indices over all ranks: seeded reshuffled passes over the dataset, back to back, from
    index `start` of that stream on (a resumed run skips what it trained on; its length stays the whole run's, as
    Lightning counts the batches already done). Rank `rank` of `world` takes every world-th index of the stream,
    from its own offset, so each rank's batches are whole prompts and together the ranks cover the stream once.

    One Lightning epoch is then the whole run, so the progress bar ends where training ends.
    """

    def __init__(
        self,
        dataset_size: int,
        num_samples: int,
        seed: int,
        shuffle: bool = True,
        start: int = 0,
        rank: int = 0,
        world: int = 1,
    ):
        self.dataset_size, self.num_samples, self.seed, self.shuffle = dataset_size, num_samples, seed, shuffle
        self.start, self.rank, self.world = start, rank, world

    def stream(self):
        """The indices of every rank, from `start` on."""
        data_pass, position = self.start // self.dataset_size, self.start // self.dataset_size * self.dataset_size
        while position < self.num_samples:
            generator = torch.Generator().manual_seed(self.seed + data_pass)
            order = (
                torch.randperm(self.dataset_size, generator=generator)
                if self.shuffle
                else torch.arange(self.dataset_size)
            )
            chunk = order[: self.num_samples - position].tolist()
            yield from ((position + i, index) for i, index in enumerate(chunk) if position + i >= self.start)
            position += len(chunk)
            data_pass += 1

    def __iter__(self):
        return (index for position, index in self.stream() if position % self.world == self.rank)

    def __len__(self) -> int:
        return self.num_samples // self.world


class RolloutLoader(DataLoader):
    """The train loader, resumable as Lightning asks: where a resumed run's loader starts is set from the
    checkpoint's own rollout counter (PromptDataModule.first_rollout, by rloo.utils.resume), so it keeps no state of its
    own to save or load."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def collate_rows(rows: list[dict], pad_token_id: int) -> dict:
    """A batch of prompt rows: their ids left-padded `[B, P]` with the mask, their other columns, their messages."""
    prompt_ids, prompt_mask = left_pad([row["prompt_ids"] for row in rows], pad_token_id)
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "columns": [row["columns"] for row in rows],
        "prompt_messages": [row["messages"] for row in rows],  # None for text prompts
    }


@dataclass
class PromptBatches:
    """The train loader's batches without a DataLoader: `sampler`'s indices into `rows`, `batch_size` at a time (the
    last short one dropped, as the loader drops it), each collated as the loader collates it."""

    rows: list[dict]
    sampler: EpisodeSampler
    batch_size: int
    pad_token_id: int

    def __iter__(self):
        batch = []
        for index in self.sampler:
            batch.append(self.rows[index])
            if len(batch) == self.batch_size:
                yield collate_rows(batch, self.pad_token_id)
                batch = []


class PromptDataModule(LightningDataModule):
    """Train prompts for rollouts and held-out (prompt, reference) pairs for evaluation."""

    def __init__(
        self,
        tokenizer,
        train: SplitSpec,
        validation: SplitSpec,
        max_prompt_length: int,
        truncate_prompts: bool,
        prompts_per_rollout: int,
        num_rollouts: int,
        seed: int,
        shuffle: bool,
        num_workers: int,
        log=print,
        system_prompt: str | None = None,
        tools: list[dict] | None = None,
    ):
        super().__init__()
        self.tokenizer, self.train_spec, self.validation_spec = tokenizer, train, validation
        self.max_prompt_length, self.truncate_prompts = max_prompt_length, truncate_prompts
        self.prompts_per_rollout, self.num_rollouts = prompts_per_rollout, num_rollouts
        self.seed, self.shuffle, self.num_workers, self.log_fn = seed, shuffle, num_workers, log
        self.system_prompt = system_prompt  # data.system_prompt: every chat row's system message (None: as given)
        self.tools = tools  # an environment's tool schemas, which chat prompts show the model (None: no tools)
        self.train_rows: list[dict] | None = None
        self.validation_rows: list[dict] | None = None
        self.first_rollout = 0  # a resumed run starts at the prompts of this rollout (rloo.utils.resume)
        self.counts: dict[str, dict[str, int]] = {}  # per split: prompts kept, dropped (or truncated) and why

    @property
    def num_train_prompts(self) -> int:
        return len(self.train_rows) if self.train_rows is not None else 0

    def setup(self, stage: str | None = None) -> None:
        if self.train_rows is not None:
            return
        self.train_rows = self._prepare("train", self.train_spec)
        self.validation_rows = self._prepare("validation", self.validation_spec)

    def _prepare(self, name: str, spec: SplitSpec) -> list[dict]:
        dataset = load_split(spec, f"data.{name}")
        rows, over, empty = tokenize_prompts(
            dataset,
            spec,
            self.tokenizer,
            self.max_prompt_length,
            self.truncate_prompts,
            f"data.{name}",
            self.system_prompt,
            self.tools,
        )
        if self.tools and not all(row["messages"] is not None for row in rows):
            raise ConfigError(
                f"data.{name} ({spec.path}) holds text prompts, and the environment's tools reach the model through "
                "the chat template: give chat-message prompts"
            )
        action = "truncated" if self.truncate_prompts else "dropped"
        self.log_fn(
            f"data: {name}: {len(rows)} prompts from {spec.path}; {over} longer than "
            f"{self.max_prompt_length} tokens {action}; {empty} empty dropped"
        )
        self.counts[name] = {"prompts": len(rows), f"over_length_{action}": over, "empty_dropped": empty}
        note, counts = system_prompt_note(rows, self.tokenizer, self.system_prompt, f"data.{name} ({spec.path})")
        if note is not None:
            self.log_fn(note)
        self.counts[name] |= counts
        if empty == len(dataset):
            raise ConfigError(
                f"data.{name}: every prompt of {spec.path} is empty ({empty} rows of blank "
                f"{spec.prompt_column!r}): nothing to sample from"
            )
        if not rows:
            raise ConfigError(
                f"data.max_prompt_length={self.max_prompt_length} drops every prompt of data.{name} "
                f"({spec.path}): raise it, or set data.truncate_prompts=true"
            )
        return rows

    def collate(self, rows: list[dict]) -> dict:
        return collate_rows(rows, self.tokenizer.pad_token_id)

    def train_sampler(self, first_rollout: int) -> EpisodeSampler:
        """This rank's prompt indices from rollout `first_rollout` to the run's end."""
        # the sampler splits the prompts across ranks itself (the Trainer runs with use_distributed_sampler=False)
        rank, world_size = (self.trainer.global_rank, self.trainer.world_size) if self.trainer is not None else (0, 1)
        per_rollout = self.prompts_per_rollout * world_size
        return EpisodeSampler(
            len(self.train_rows),
            self.num_rollouts * per_rollout,
            self.seed,
            self.shuffle,
            start=first_rollout * per_rollout,
            rank=rank,
            world=world_size,
        )

    def rollout_batches(self, first_rollout: int) -> "PromptBatches":
        """The train loader's batches from rollout `first_rollout` on, as a picklable iterable (a producer process
        draws them in its own order: rloo.service.producer)."""
        return PromptBatches(
            self.train_rows, self.train_sampler(first_rollout), self.prompts_per_rollout, self.tokenizer.pad_token_id
        )

    def train_dataloader(self) -> DataLoader:
        sampler = self.train_sampler(self.first_rollout)
        # its own generator for the workers' base seed: a resumed run's global random state stays the checkpoint's
        return RolloutLoader(
            self.train_rows,
            batch_size=self.prompts_per_rollout,
            sampler=sampler,
            collate_fn=self.collate,
            num_workers=self.num_workers,
            drop_last=True,
            generator=torch.Generator().manual_seed(self.seed),
        )

    def extra_prompts(self, count: int, rollout: int, round_: int) -> dict:
        """`count` train prompts for a rollout's extra sampling round (DAPO's dynamic sampling), drawn from the seed,
        the rollout's number, the round and the rank alone: a resumed run draws the same ones."""
        rank = self.trainer.global_rank if self.trainer is not None else 0
        generator = torch.Generator().manual_seed(((self.seed * 1_000_003 + rollout) * 1_009 + round_) * 1_013 + rank)
        picked = torch.randint(len(self.train_rows), (count,), generator=generator).tolist()
        return self.collate([self.train_rows[i] for i in picked])

    def eval_rows(self, num_prompts: int) -> list[dict]:
        """The first `num_prompts` held-out rows (fixed, so before/after compare the same prompts)."""
        return self.validation_rows[:num_prompts]
