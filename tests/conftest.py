"""Shared fixtures: the toy tokenizer, tiny random GPT-NeoX models (tests/tiny_models.py; no download, no
bootstrap), and the embedded task built once per test run (under `pytest -n`, once for all workers)."""

import atexit
import os
import shutil
import tempfile

import pytest

from tests.tiny_models import tiny_model

pytest_plugins = ["tests.chat_server"]  # the loopback chat-completions `server` fixture

os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# caches the tests' in-process compositions write (data=arithmetic's splits) stay out of the user's ~/.cache
# (a directory this suite made is removed when it ends: a run leaves nothing behind in the temp dir)
if "RLOO_CACHE_DIR" not in os.environ:
    os.environ["RLOO_CACHE_DIR"] = tempfile.mkdtemp(prefix="rloo-test-cache-")
    atexit.register(shutil.rmtree, os.environ["RLOO_CACHE_DIR"], ignore_errors=True)


@pytest.fixture(scope="session")
def tokenizer():
    from rloo.toy.tokenizer import build_task_tokenizer

    return build_task_tokenizer()


@pytest.fixture
def policy(tokenizer):
    return tiny_model("gpt_neox", tokenizer)


@pytest.fixture
def reward_model(tokenizer):
    return tiny_model("gpt_neox", tokenizer, reward=True, seed=1)


@pytest.fixture(scope="session")
def tiny_run_assets(tmp_path_factory, tokenizer):
    """A saved tiny policy, reward model and toy jsonl splits, for runs that skip the bootstrap."""
    import json

    from rloo.toy.task import make_splits

    root = tmp_path_factory.mktemp("assets")
    tiny_model("gpt_neox", tokenizer).save_pretrained(root / "policy")
    tokenizer.save_pretrained(root / "policy")
    tiny_model("gpt_neox", tokenizer, reward=True, seed=1).save_pretrained(root / "reward_model")
    for split, rows in make_splits(seed=0, n_train=64, n_validation=16, n_test=4).items():
        with open(root / f"{split}.jsonl", "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return root


@pytest.fixture(scope="session")
def embedded_task(tmp_path_factory):
    """The embedded task at the tests' size (bootstrap=fast: a tiny SFT policy and reward model), built once per test
    run, in this process, into `<base>/cache`; returns `base`. Every test that needs the task shares it, and
    `finished_run` trains from it."""
    from omegaconf import OmegaConf

    from rloo.run.cli import compose_train_config
    from rloo.toy.bootstrap import ensure_artifacts

    base = tmp_path_factory.mktemp("e2e")
    bootstrap = OmegaConf.to_container(compose_train_config(["debug=fast"]).bootstrap, resolve=True)
    cache = base / "cache"
    if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n: the workers share one cache, which the first builds
        cache = tmp_path_factory.getbasetemp().parent / "embedded-task-cache"  # (the cache's lock: the rest wait)
        (base / "cache").symlink_to(cache, target_is_directory=True)
    ensure_artifacts(bootstrap, cache, log=lambda line: None)
    return base


@pytest.fixture(scope="session")
def finished_run(embedded_task):
    """One tiny `python -m rloo.train` run on the shared embedded task, for the subprocess tests (all marked slow)."""
    from tests.e2e import train

    base = embedded_task
    result = train(base / "run", base / "cache", "num_ppo_epochs=2", "num_mini_batches=2", "eval_every=2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return base, result


def pytest_collection_modifyitems(config, items):
    """The fast tier starts no training process: a test outside the `slow` tier may not ask for `finished_run` (a real
    `python -m rloo.train`); it builds on `embedded_task` instead."""
    for item in items:
        if "finished_run" in getattr(item, "fixturenames", ()) and item.get_closest_marker("slow") is None:
            raise pytest.UsageError(f"{item.nodeid} uses finished_run (a training process) but is not marked slow")
