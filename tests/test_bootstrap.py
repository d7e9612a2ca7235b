"""The embedded task's bootstrap: real (tiny) SFT and reward-model runs, the cache, and the entry points."""

import copy
import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    GPTNeoXForCausalLM,
    GPTNeoXForSequenceClassification,
)

from rloo.toy import bootstrap
from rloo.toy.bootstrap import MARKER, artifacts_dir, build_architecture, build_tokenizer, ensure_artifacts
from rloo.toy.evaluation import pair_accuracy
from rloo.toy.reward_stage import bradley_terry_loss, collate_pairs, encode_pairs, pair_scores
from rloo.toy.sft_stage import collate_sft, encode_sft_examples, sft_loss
from tests.e2e import HANG_GUARD_S

ROOT = Path(__file__).resolve().parent.parent
DEFAULTS = OmegaConf.to_container(OmegaConf.load(ROOT / "conf/bootstrap/toy.yaml"))
# Command-line form of TINY, for the entry points.
TINY_OVERRIDES = [
    "bootstrap.task.n_train=256",
    "bootstrap.task.n_validation=32",
    "bootstrap.task.n_test=16",
    "bootstrap.architecture.hidden_size=64",
    "bootstrap.architecture.num_layers=2",
    "bootstrap.architecture.num_heads=2",
    "bootstrap.architecture.intermediate_size=128",
    "bootstrap.sft.epochs=1",
    "bootstrap.sft.batch_size=64",
    "bootstrap.reward.num_pairs=128",
    "bootstrap.reward.num_heldout_pairs=64",
    "bootstrap.reward.epochs=1",
]


def tiny_config():
    cfg = OmegaConf.create(copy.deepcopy(DEFAULTS))
    for override in TINY_OVERRIDES:
        key, value = override.split("=")
        OmegaConf.update(cfg, key.removeprefix("bootstrap."), int(value))
    return OmegaConf.to_container(cfg)


def bootstrap_model(cls, tokenizer, **arch):
    """A random model of the bootstrap's tiny architecture (`build_architecture`), as the bootstrap stages build it."""
    torch.manual_seed(0)
    config = build_architecture(
        dict(tiny_config()["architecture"], **arch), len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id
    )
    if cls is GPTNeoXForSequenceClassification:
        config.num_labels = 1
    return cls(config).eval()


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(DEFAULTS)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Two concurrent ensure_artifacts calls on one cache dir (threads: flock locks per open file, so they contend)."""
    cache_dir = tmp_path_factory.mktemp("cache")
    logs, results = [[], []], [None, None]

    def call(i):
        results[i] = ensure_artifacts(tiny_config(), cache_dir, log=logs[i].append)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return cache_dir, results, logs


def test_concurrent_calls_build_once(built):
    cache_dir, results, logs = built
    assert results[0] is not None and results[1] is not None
    assert results[0].root == results[1].root == artifacts_dir(tiny_config(), cache_dir)
    builders = [log for log in logs if any("building" in line for line in log)]
    assert len(builders) == 1
    stage_lines = [line for line in builders[0] if line.startswith("[bootstrap] ")]
    for stage in ("data", "tokenizer", "sft", "reward", "report"):
        assert any(line.startswith(f"[bootstrap] {stage}: ") and line.endswith(" s)") for line in stage_lines), stage
    # nothing but the finished dir and its lock is left in the cache
    assert sorted(p.name for p in cache_dir.iterdir()) == sorted([results[0].root.name, results[0].root.name + ".lock"])


def test_artifacts_are_complete_and_load(built):
    artifacts = built[1][0]
    assert json.loads((artifacts.root / MARKER).read_text())["report"] == artifacts.report
    tokenizer = AutoTokenizer.from_pretrained(artifacts.tokenizer)
    assert tokenizer.padding_side == "left" and tokenizer.pad_token == "[PAD]"
    policy = AutoModelForCausalLM.from_pretrained(artifacts.policy)
    assert policy.config.model_type == "gpt_neox" and policy.config.num_hidden_layers == 2
    assert policy.config.rope_parameters["partial_rotary_factor"] == 0.25 and policy.config.use_parallel_residual
    assert not policy.config.tie_word_embeddings
    assert AutoTokenizer.from_pretrained(artifacts.policy).get_vocab() == tokenizer.get_vocab()
    reward_model = AutoModelForSequenceClassification.from_pretrained(artifacts.reward_model)
    assert reward_model.config.num_labels == 1 and reward_model.config.pad_token_id == tokenizer.pad_token_id
    for split, n in (("train", 256), ("validation", 32), ("test", 16)):
        rows = [json.loads(line) for line in Path(artifacts.data[split]).read_text().splitlines()]
        assert len(rows) == n and set(rows[0]) == {"prompt", "reference"}
    report = artifacts.report
    assert report["sft_loss_final"] < report["sft_loss_initial"] - 0.5  # SFT learns even in one tiny epoch
    for key in ("sft_win_rate_vs_reference", "sft_ended_with_eos", "rm_heldout_accuracy", "rm_train_accuracy"):
        assert 0.0 <= report[key] <= 1.0
    assert -1.0 <= report["rm_oracle_spearman"] <= 1.0 and -1.0 <= report["rm_oracle_pearson"] <= 1.0
    assert set(report["seconds"]) == {"data", "tokenizer", "sft", "reward", "report"}


def test_second_call_reuses_without_rebuilding(built):
    cache_dir, results, _ = built
    marker = results[0].root / MARKER
    mtime = marker.stat().st_mtime_ns
    log = []
    again = ensure_artifacts(tiny_config(), cache_dir, log=log.append)
    assert again == results[0] and log == [] and marker.stat().st_mtime_ns == mtime


def test_cache_key():
    cfg = tiny_config()
    other = copy.deepcopy(cfg)
    other["sft"]["lr"] *= 2
    assert artifacts_dir(cfg, "/c") != artifacts_dir(other, "/c")
    assert artifacts_dir(cfg, "/c") == artifacts_dir(OmegaConf.create(cfg), "/c")  # DictConfig or dict
    reordered = dict(reversed(list(cfg.items())))
    assert artifacts_dir(reordered, "/c") == artifacts_dir(cfg, "/c")
    assert artifacts_dir(cfg, "/c").name.startswith("toy-") and len(artifacts_dir(cfg, "/c").name) == 16


def test_failed_build_leaves_no_half_cache(tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(bootstrap, "train_sft_policy", fail)
    (tmp_path / (artifacts_dir(tiny_config(), tmp_path).name + ".tmp-stale")).mkdir()  # from an earlier killed build
    with pytest.raises(RuntimeError, match="killed"):
        ensure_artifacts(tiny_config(), tmp_path, log=lambda line: None)
    assert [p.name for p in tmp_path.iterdir()] == [artifacts_dir(tiny_config(), tmp_path).name + ".lock"]


def test_bradley_terry_loss_by_hand():
    chosen, rejected = torch.tensor([2.0, 0.5]), torch.tensor([1.0, 1.5])
    # -log sigmoid(d) = log(1 + exp(-d)), d = +1 and -1
    expected = (math.log(1 + math.exp(-1.0)) + math.log(1 + math.exp(1.0))) / 2
    assert bradley_terry_loss(chosen, rejected).item() == pytest.approx(expected, abs=1e-6)


def test_pair_scores_match_unpadded_forward(tokenizer):
    """The padded rollout layout scores each sequence as HF's own classifier does on it alone."""
    model = bootstrap_model(GPTNeoXForSequenceClassification, tokenizer)
    pairs = [
        {"prompt": "POST: the cat was on my boat\n\nTL;DR:", "chosen": " cat boat", "rejected": " cat lol"},
        {"prompt": "POST: rain\n\nTL;DR:", "chosen": " rain", "rejected": " rain rain the dog"},
    ]
    rows = encode_pairs(tokenizer, pairs)
    with torch.no_grad():
        chosen, rejected = pair_scores(model, collate_pairs(tokenizer.pad_token_id)(rows))
        alone = [
            model(input_ids=torch.tensor([prompt + completion])).logits[0, 0]
            for prompt, c, r in rows
            for completion in (c, r)
        ]
    assert torch.allclose(torch.stack([chosen, rejected], 1).flatten(), torch.stack(alone), atol=1e-5)
    expected = -torch.nn.functional.logsigmoid(torch.stack(alone[0::2]) - torch.stack(alone[1::2])).mean()
    assert bradley_terry_loss(chosen, rejected).item() == pytest.approx(expected.item(), abs=1e-5)


def test_sft_loss_is_completion_token_nll(tokenizer):
    """Left-padded prompts and right-padded completions give the NLL of the reference + EOS tokens alone."""
    model = bootstrap_model(GPTNeoXForCausalLM, tokenizer)
    examples = [
        {"prompt": "POST: the cat was on my boat\n\nTL;DR:", "reference": " cat"},
        {"prompt": "POST: rain\n\nTL;DR:", "reference": " rain lol the dog"},
    ]
    rows = encode_sft_examples(tokenizer, examples)
    assert all(completion[-1] == tokenizer.eos_token_id for _, completion in rows)
    nll = []
    with torch.no_grad():
        loss = sft_loss(model, collate_sft(tokenizer.pad_token_id)(rows))
        for prompt, completion in rows:
            logprobs = model(input_ids=torch.tensor([prompt + completion])).logits[0].log_softmax(-1)
            positions = torch.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)
            nll += (-logprobs[positions, torch.tensor(completion)]).tolist()
    assert loss.item() == pytest.approx(sum(nll) / len(nll), abs=1e-5)


def test_reward_model_beats_chance_on_heldout_pairs(tokenizer, tmp_path):
    cfg = tiny_config()
    cfg["reward"] |= {"init": "random", "num_pairs": 512, "num_heldout_pairs": 256, "epochs": 2, "batch_size": 32}
    report = bootstrap.train_reward_model(cfg, tokenizer, bootstrap.reward_pairs(cfg), tmp_path / "rm")
    reward_model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")
    heldout = pair_accuracy(reward_model, tokenizer, bootstrap.reward_pairs(cfg, heldout=True))
    assert heldout > 0.65, (heldout, report)  # 0.76-0.83 over five seeds


def run_entry_point(module, tmp_path, *overrides):
    env = dict(os.environ, RLOO_CACHE_DIR=str(tmp_path / "cache"))
    result = subprocess.run(
        [sys.executable, "-m", module, *TINY_OVERRIDES, *overrides, f"hydra.run.dir={tmp_path}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_sft_entry_point_writes_a_loadable_policy(tmp_path):
    result = run_entry_point("rloo.sft", tmp_path)
    assert f"SFT policy saved to {tmp_path / 'policy'}" in result.stdout
    assert "sft_win_rate_vs_reference=" in result.stdout
    policy = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    assert policy.config.hidden_size == 64
    assert AutoTokenizer.from_pretrained(tmp_path / "policy").pad_token == "[PAD]"


@pytest.mark.slow
def test_reward_entry_point_writes_a_loadable_reward_model(tmp_path):
    result = run_entry_point("rloo.reward", tmp_path)  # policy=null: trains the SFT policy it starts from first
    assert f"reward model saved to {tmp_path / 'reward_model'}" in result.stdout
    assert "rm_heldout_accuracy=" in result.stdout and (tmp_path / "policy").is_dir()
    reward_model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "reward_model")
    assert reward_model.config.num_labels == 1 and reward_model.config.hidden_size == 64
    assert (tmp_path / ".hydra" / "config.yaml").exists()


def test_reward_entry_point_rejects_a_missing_policy(tmp_path, monkeypatch, capsys):
    from tests.test_cli import run_module

    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setenv("RLOO_CACHE_DIR", str(tmp_path / "cache"))
    assert run_module("rloo.reward", f"policy={tmp_path / 'nope'}", f"hydra.run.dir={tmp_path}") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: policy=")
