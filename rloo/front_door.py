"""`rloo.fit`: a training run from Python (a notebook, a script), the same run `python -m rloo.train` makes.

    import rloo
    summary = rloo.fit(["k=4", "total_episodes=2048"], reward=[correct, brevity], reward_weights=[1.0, 0.1],
                       train_dataset=train_ds, eval_dataset=eval_ds, output_dir="runs/first")

Overrides are the command line's (`key=value`, `group=option`, or a dict), composed and checked by the same code: a key
rloo does not read is refused as on the command line. Reward functions are Python callables (TRL's signature, see
rloo.rewards.scoring) or `module:function` strings, `"model"` for the reward model; data is a `datasets.Dataset`, a list
of row dicts, or a path as `data.train.path` takes it. A Dataset is saved into the run dir (`data/train`, `data/eval`),
so that the run dir holds what it trained on and resumes from the command line too. The run writes the same run
dir, logs and summary.json, and returns the summary; `resume="auto"` with the same output_dir continues it.
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from rloo.run.handed_in import model_overrides
from rloo.utils.errors import ConfigError


class FitResult(dict):
    """What rloo.fit returns: the run's summary (this dict, as summary.json has it), its run dir, and the trained
    policy and its tokenizer, loaded from the run's policy/ when first asked for."""

    def __init__(self, summary: dict, run_dir: Path):
        super().__init__(summary)
        self.run_dir = run_dir

    @property
    def summary(self) -> dict:
        return dict(self)

    @cached_property
    def policy(self):
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self.policy_dir)

    @cached_property
    def tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.policy_dir)

    @property
    def policy_dir(self) -> Path:
        if not (self.run_dir / "policy").is_dir():
            raise FileNotFoundError(
                f"{self.run_dir / 'policy'}: the run exported no policy (status {self.get('status')})"
            )
        return self.run_dir / "policy"


def fit(
    overrides: Sequence[str] | Mapping[str, object] = (),
    *,
    model=None,
    tokenizer=None,
    reward: Callable | str | Sequence[Callable | str] | None = None,
    reward_weights: Sequence[float] | None = None,
    train_dataset=None,
    eval_dataset=None,
    output_dir: str | Path | None = None,
    config_dir: str | Path | None = None,
    resume: str | None = None,
    callbacks: Sequence[object] = (),
) -> FitResult:
    """Train, and return a FitResult: the run's summary (as summary.json), its run dir and the trained policy.
    `model`: a PreTrainedModel or PeftModel with its `tokenizer` (saved into the run dir: rloo.run.handed_in), or a
    path or hub id; `callbacks`: Lightning callbacks, handed to the Trainer beside rloo's own. Errors in the settings
    raise ConfigError (one line) before any model loads; the run's own failures raise as the command line would
    report them."""
    from rloo.run.cli import hydra_quoted, quiet_font_cache_notice

    quiet_font_cache_notice()
    argv = as_overrides(overrides)
    if config_dir is not None:  # the user's conf/: its groups' options beside rloo's (Hydra's search path)
        argv.append(f"hydra.searchpath=[{hydra_quoted('file://' + str(Path(config_dir).expanduser().resolve()))}]")
    if reward is not None:
        argv.append(f"reward={reward_spec(reward, reward_weights)}")
    elif reward_weights is not None:
        raise ConfigError("reward_weights is given without reward: give the reward functions it weighs")
    out = run_dir(output_dir, resume)
    argv += [f"paths.output_dir={out}"] + ([f"resume={resume}"] if resume is not None else [])
    from rloo.run.cli import compose_train_config, preflight
    from rloo.run.command_line import CommandLine
    from rloo.run.loggers import end_wandb_run
    from rloo.run.pipeline import run
    from rloo.run.run_dir_guard import check_fresh, take
    from rloo.utils import ownership

    # the command line's checks, then the run dir's (and it taken), before anything is written; a resume's own
    # settings first (with_the_runs_own_overrides); what the command line says on stderr, said here too
    argv = preflight(argv, say=lambda line: print(line, file=sys.stderr))
    check_fresh("output_dir", out, resume is not None)
    take(out)
    given = {o.key_or_group for o in CommandLine.parse(argv).overrides}  # the caller's data keys win over the data's
    failed = True
    try:
        with run_logging(out):
            suggested = data_overrides(train_dataset, eval_dataset, out)
            suggested += model_overrides(model, tokenizer, out, logging.getLogger("rloo").info)
            data = [a for a, o in zip(suggested, CommandLine.parse(suggested).overrides) if o.key_or_group not in given]
            save_overrides(out, argv + data)
            cfg = compose_train_config(argv + data)
            try:
                summary = run(cfg, callbacks=check_callbacks(callbacks))
                failed = False
            finally:
                end_wandb_run(failed)
    finally:  # the run dir is this process's while the run lasts, and free again once it returns or raises
        ownership.release(out)
    return FitResult(summary, out)


def check_callbacks(callbacks: Sequence[object]) -> list:
    """Lightning callbacks for the Trainer; anything else is one line, before any model loads."""
    from lightning.pytorch.callbacks import Callback

    callbacks = [callbacks] if isinstance(callbacks, Callback) else list(callbacks)
    for callback in callbacks:
        if not isinstance(callback, Callback):
            raise ConfigError(f"callbacks: {callback!r} is not a lightning.pytorch.callbacks.Callback")
    return callbacks


def save_overrides(out: Path, argv: list[str]) -> None:
    """The run's overrides where Hydra keeps a command-line run's (.hydra/overrides.yaml), on its first session only,
    so that `resume=<run dir>` continues it with its own settings from the command line or from rloo.fit."""
    from rloo.run.cli import SAVED_OVERRIDES
    from rloo.run.command_line import CommandLine
    from rloo.utils import atomic

    path = out / SAVED_OVERRIDES
    if path.exists():
        return
    import yaml

    from rloo.run.cli import anchored

    here = Path.cwd().resolve()  # relative paths saved resolved: a resume from any directory finds them
    lines = [anchored(o, here) for o in CommandLine.parse(argv).overrides if o.key_or_group != "resume"]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, yaml.safe_dump(lines, default_flow_style=False), "the run's overrides")


def as_overrides(overrides: Sequence[str] | Mapping[str, object]) -> list[str]:
    """Command-line overrides from a list of `key=value` strings or a dict {key: value}."""
    if isinstance(overrides, str):
        raise ConfigError(f"overrides={overrides!r}: give a list of key=value strings or a dict, not one string")
    if isinstance(overrides, Mapping):
        return [f"{key}={_value(value)}" for key, value in overrides.items()]
    return [str(o) for o in overrides]


def _value(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_value(v) for v in value) + "]"
    return str(value)


def reward_spec(reward, weights: Sequence[float] | None) -> str:
    """`reward=` for callables, names and `"model"`: 'rloo.fit:correct + 0.1*my_rewards:brevity'."""
    from rloo.rewards.scoring import function_name

    terms = list(reward) if isinstance(reward, (list, tuple)) else [reward]
    if weights is not None and len(weights) != len(terms):
        raise ConfigError(f"reward_weights has {len(weights)} weights for {len(terms)} reward functions: one each")
    names = [term if isinstance(term, str) else function_name(term) if callable(term) else None for term in terms]
    if None in names:
        wrong = terms[names.index(None)]
        raise ConfigError(f"reward: {wrong!r} is not a callable, 'model' or a 'module:function' string")
    weights = weights if weights is not None else [1.0] * len(terms)
    return " + ".join(f"{float(w)!r}*{name}" for w, name in zip(weights, names))


def run_dir(output_dir: str | Path | None, resume: str | None) -> Path:
    """output_dir, or a new outputs/<date>/<time> as the command line makes (a resume needs the dir it continues)."""
    if output_dir is not None:
        return Path(output_dir).expanduser().resolve()
    if resume is not None and resume != "auto":
        return Path(resume).expanduser().resolve()
    if resume == "auto":
        raise ConfigError("resume='auto' continues the run in output_dir: give output_dir")
    from rloo.run.resolvers import unique_dir

    return Path(unique_dir(time.strftime("outputs/%Y-%m-%d/%H-%M-%S"))).resolve()


def data_overrides(train_dataset, eval_dataset, out: Path) -> list[str]:
    """data.train / data.validation for what was handed in; without eval_dataset, the held-out evaluation reads
    train_dataset's prompts (said in the log)."""
    argv, train = [], None
    if train_dataset is not None:
        train = split_path(train_dataset, out, "train")
        argv += [f"data.train.path={train}", "data.train.split=train", *reference_column(train_dataset, "train")]
    if eval_dataset is not None:
        argv += [f"data.validation.path={split_path(eval_dataset, out, 'eval')}", "data.validation.split=train"]
        argv += reference_column(eval_dataset, "validation")
    elif train is not None:
        logging.getLogger("rloo").info("rloo.fit: no eval_dataset; held-out evaluation reads train_dataset's prompts")
        argv += [f"data.validation.path={train}", "data.validation.split=train"]
        argv += reference_column(train_dataset, "validation")
    return argv


def reference_column(data, split: str) -> list[str]:
    """A Dataset's own `reference` column where it has one, else none (the config's default names the embedded
    task's); a path's columns are the config's to name."""
    if isinstance(data, (str, Path)):
        return []
    columns = data.column_names if hasattr(data, "column_names") else list(data[0]) if data else []
    return [f"data.{split}.reference_column={'reference' if 'reference' in columns else 'null'}"]


def split_path(data, out: Path, name: str) -> str:
    """A path as data.<split>.path takes it; a Dataset (or a list of row dicts) saved into the run dir as
    data/<name>, once: a resumed run finds it there, and a different dataset handed to that run is refused."""
    import datasets

    if isinstance(data, (str, Path)):
        return str(Path(data).expanduser().resolve()) if Path(data).expanduser().exists() else str(data)  # or a hub id
    if isinstance(data, list):
        data = datasets.Dataset.from_list(data)
    if isinstance(data, datasets.DatasetDict):
        raise ConfigError(f"{name}_dataset is a DatasetDict ({', '.join(data)}): hand in one split, e.g. ds['train']")
    if not isinstance(data, datasets.Dataset):
        raise ConfigError(f"{name}_dataset is a {type(data).__name__}: a datasets.Dataset, a list of dicts or a path")
    if len(data) == 0:
        raise ConfigError(f"{name}_dataset has no rows: hand in prompts to train on")
    target = out / "data" / name
    if target.is_dir():
        if rows_hash(datasets.load_from_disk(str(target))) != rows_hash(data):
            raise ConfigError(f"{name}_dataset differs from the one {target} holds: this run dir trained on that one")
        return str(target)
    from rloo.utils import atomic

    target.parent.mkdir(parents=True, exist_ok=True)
    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # one bar per save, in the middle of the run's log
    try:
        atomic.save_dir(lambda tmp: data.save_to_disk(str(tmp)), target, f"{name}_dataset")
    finally:
        if shown:
            datasets.enable_progress_bars()
    return str(target)


def rows_hash(data) -> str:
    """sha256 of the rows as JSON: the same rows give the same hash, however the Dataset was made or stored."""
    import hashlib
    import json

    digest = hashlib.sha256()
    for row in data:
        digest.update(json.dumps(row, sort_keys=True, default=str).encode() + b"\n")
    return digest.hexdigest()


@contextmanager
def run_logging(out: Path) -> Iterable[None]:
    """What Hydra's job logging gives a command-line run: messages on stdout and in <run dir>/train.log."""
    root, formatter = logging.getLogger(), logging.Formatter("%(message)s")
    out.mkdir(parents=True, exist_ok=True)
    handlers = [logging.StreamHandler(sys.stdout), logging.FileHandler(out / "train.log")]
    level = root.level
    for handler in handlers:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.setLevel(level)
        for handler in handlers:
            root.removeHandler(handler)
            handler.close()
