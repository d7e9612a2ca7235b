"""The embedded task's bootstrap: data splits, tokenizer, SFT policy and reward model, built once and cached.

The cache key is the whole `bootstrap` config block (conf/bootstrap/toy.yaml) plus TASK_VERSION. The entry is
built, locked, staged, hashed and checked on every use by rloo.utils.cache, as every cache of the project is.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM, GPTNeoXForSequenceClassification

from rloo.toy.evaluation import evaluate, pair_accuracy
from rloo.toy.preferences import make_preference_pairs
from rloo.toy.reward_stage import RewardModelModule, collate_pairs, encode_pairs
from rloo.toy.sft_stage import SFTModule, collate_sft, encode_sft_examples, sft_loss
from rloo.toy.task import PostShape, make_splits, split_seed
from rloo.toy.tokenizer import task_corpus, train_tokenizer
from rloo.utils import atomic, cache
from rloo.utils.errors import SIGTERM_EXIT_CODE

# Bump when task, tokenizer or training code changes what a given config builds.
TASK_VERSION = "toy-v2"
MARKER = "artifacts.json"


@dataclass
class ToyArtifacts:
    root: Path
    tokenizer: str  # save_pretrained dir
    policy: str  # SFT policy, save_pretrained dir (tokenizer included)
    reward_model: str  # sequence classifier with one label (tokenizer included)
    data: dict[str, str]  # split -> jsonl with columns prompt, reference
    report: dict  # measured numbers of the build


def build_architecture(arch_cfg, vocab_size: int, pad_token_id: int, eos_token_id: int) -> GPTNeoXConfig:
    """A Pythia-shaped GPT-NeoX config: partial rotary (25%), parallel residual, untied embeddings, no dropout."""
    return GPTNeoXConfig(
        vocab_size=vocab_size,
        hidden_size=arch_cfg["hidden_size"],
        num_hidden_layers=arch_cfg["num_layers"],
        num_attention_heads=arch_cfg["num_heads"],
        intermediate_size=arch_cfg["intermediate_size"],
        max_position_embeddings=arch_cfg["max_positions"],
        hidden_act="gelu",
        rotary_pct=0.25,
        rotary_emb_base=10000,
        use_parallel_residual=True,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        classifier_dropout=0.0,
        tie_word_embeddings=False,
        bos_token_id=eos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )


def _plain(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg


def artifacts_dir(bootstrap_cfg, cache_dir) -> Path:
    canonical = json.dumps(_plain(bootstrap_cfg), sort_keys=True, separators=(",", ":")) + TASK_VERSION
    return Path(cache_dir) / f"toy-{hashlib.sha256(canonical.encode()).hexdigest()[:12]}"


def build_tokenizer(bootstrap_cfg):
    return train_tokenizer(task_corpus(seed=bootstrap_cfg["seed"]), bootstrap_cfg["tokenizer"]["vocab_size"])


def post_shape(bootstrap_cfg) -> PostShape:
    task = bootstrap_cfg["task"]
    return PostShape(tuple(task["post_length"]), tuple(task["topics"]))


def task_splits(bootstrap_cfg) -> dict[str, list[dict]]:
    task = bootstrap_cfg["task"]
    return make_splits(
        bootstrap_cfg["seed"], task["n_train"], task["n_validation"], task["n_test"], post_shape(bootstrap_cfg)
    )


def reward_pairs(bootstrap_cfg, heldout: bool = False) -> list[dict]:
    """Training pairs, or held-out pairs from an unrelated seed."""
    reward = bootstrap_cfg["reward"]
    n = reward["num_heldout_pairs"] if heldout else reward["num_pairs"]
    return make_preference_pairs(
        n, split_seed(bootstrap_cfg["seed"], "reward-heldout" if heldout else "reward-train"), post_shape(bootstrap_cfg)
    )


def _fit(module: L.LightningModule, rows: list, collate, stage_cfg: dict, seed: int, out_dir: Path) -> None:
    loader = DataLoader(
        rows,
        batch_size=stage_cfg["batch_size"],
        shuffle=True,
        collate_fn=collate,
        generator=torch.Generator().manual_seed(seed),
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=stage_cfg["epochs"],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=sys.stdout.isatty(),  # a log file gets the stage's one line, not the bar's frames
        gradient_clip_val=stage_cfg["max_grad_norm"],
        default_root_dir=out_dir,
    )
    module.model.train()  # the before-training probe left it in eval mode
    try:
        trainer.fit(module, loader)
    except SIGTERMException:  # Lightning's own is a SystemExit without a code, which would exit 0
        print(f"rloo: stopped by SIGTERM while building {out_dir.name}; nothing of this stage was kept", flush=True)
        raise SystemExit(SIGTERM_EXIT_CODE) from None
    module.model.eval()


@torch.no_grad()
def _mean_sft_loss(model, rows: list, collate, batch_size: int = 256) -> float:
    model.eval()
    losses = [sft_loss(model, collate(rows[s : s + batch_size])) for s in range(0, len(rows), batch_size)]
    return float(torch.stack(losses).mean())


def train_sft_policy(bootstrap_cfg, tokenizer, examples: list[dict], out_dir) -> dict:
    """SFT a random-init policy on (prompt, reference) examples; save it with the tokenizer into out_dir."""
    cfg, sft = _plain(bootstrap_cfg), _plain(bootstrap_cfg)["sft"]
    seed = split_seed(cfg["seed"], "sft")
    L.seed_everything(seed, verbose=False)
    model = GPTNeoXForCausalLM(
        build_architecture(cfg["architecture"], len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
    )
    rows, collate = encode_sft_examples(tokenizer, examples), collate_sft(tokenizer.pad_token_id)
    probe = rows[:512]  # a fixed subset for the before/after loss
    loss_initial = _mean_sft_loss(model, probe, collate)
    _fit(SFTModule(model, sft["lr"], warmup_ratio=sft["warmup_ratio"]), rows, collate, sft, seed, Path(out_dir))
    atomic.save_pretrained(model, tokenizer, Path(out_dir), "the SFT policy")  # whole or absent
    return {"sft_loss_initial": loss_initial, "sft_loss_final": _mean_sft_loss(model, probe, collate)}


def train_reward_model(bootstrap_cfg, tokenizer, pairs: list[dict], out_dir, policy_dir=None) -> dict:
    """Bradley-Terry train a sequence classifier on preference pairs; save it with the tokenizer into out_dir.

    With reward.init=sft its transformer starts from the SFT policy in policy_dir (the score head is new).
    """
    cfg, reward = _plain(bootstrap_cfg), _plain(bootstrap_cfg)["reward"]
    seed = split_seed(cfg["seed"], "reward")
    L.seed_everything(seed, verbose=False)
    config = build_architecture(cfg["architecture"], len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id)
    config.num_labels = 1
    model = GPTNeoXForSequenceClassification(config)
    if reward["init"] == "sft":
        if policy_dir is None:
            raise ValueError("bootstrap.reward.init='sft' needs an SFT policy dir to start from (policy_dir)")
        model.gpt_neox.load_state_dict(GPTNeoXForCausalLM.from_pretrained(policy_dir).gpt_neox.state_dict())
    elif reward["init"] != "random":
        raise ValueError(f"bootstrap.reward.init={reward['init']!r} is not allowed: sft or random")
    rows, collate = encode_pairs(tokenizer, pairs), collate_pairs(tokenizer.pad_token_id)
    _fit(
        RewardModelModule(model, reward["lr"], warmup_ratio=reward["warmup_ratio"]),
        rows,
        collate,
        reward,
        seed,
        Path(out_dir),
    )
    atomic.save_pretrained(model, tokenizer, Path(out_dir), "the reward model")
    return {"rm_train_accuracy": pair_accuracy(model, tokenizer, pairs[:1024])}


def measure(bootstrap_cfg, policy, reward_model, tokenizer, validation: list[dict]) -> dict:
    """The report numbers of a policy (and reward model, or None) on the validation examples."""
    cfg = _plain(bootstrap_cfg)
    heldout = reward_pairs(cfg, heldout=True) if reward_model is not None else None
    return evaluate(policy, reward_model, tokenizer, validation, heldout, cfg["eval"]["max_new_tokens"])


def format_report(report: dict) -> str:
    return ", ".join(f"{k}={v:.3f}" for k, v in report.items() if isinstance(v, float))


def _load(root: Path) -> ToyArtifacts:
    saved = json.loads((root / MARKER).read_text())
    return ToyArtifacts(
        root=root,
        tokenizer=str(root / "tokenizer"),
        policy=str(root / "policy"),
        reward_model=str(root / "reward_model"),
        data={split: str(root / "data" / f"{split}.jsonl") for split in saved["splits"]},
        report=saved["report"],
    )


def _build(cfg: dict, root: Path, log) -> dict:
    seconds: dict[str, float] = {}

    def stage(name, fn, summary):
        start = time.perf_counter()
        result = fn()
        seconds[name] = round(time.perf_counter() - start, 1)
        log(f"[bootstrap] {name}: {summary(result)} ({seconds[name]:.1f} s)")
        return result

    def write_splits():
        splits = task_splits(cfg)
        (root / "data").mkdir()
        for split, rows in splits.items():
            (root / "data" / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        return splits

    def make_tokenizer():
        tokenizer = build_tokenizer(cfg)
        tokenizer.save_pretrained(root / "tokenizer")
        return tokenizer

    splits = stage("data", write_splits, lambda s: " / ".join(f"{len(rows)} {name}" for name, rows in s.items()))
    tokenizer = stage("tokenizer", make_tokenizer, lambda t: f"byte-level BPE, {len(t)} tokens")
    sft, reward = cfg["sft"], cfg["reward"]
    report = stage(
        "sft",
        lambda: train_sft_policy(cfg, tokenizer, splits["train"], root / "policy"),
        lambda r: (
            f"{len(splits['train'])} examples x {sft['epochs']} epochs, "
            f"loss {r['sft_loss_initial']:.2f} -> {r['sft_loss_final']:.2f}"
        ),
    )
    report |= stage(
        "reward",
        lambda: train_reward_model(
            cfg, tokenizer, reward_pairs(cfg), root / "reward_model", policy_dir=root / "policy"
        ),
        lambda r: (
            f"{reward['num_pairs']} pairs x {reward['epochs']} epochs from {reward['init']} init, "
            f"train accuracy {r['rm_train_accuracy']:.3f}"
        ),
    )
    policy = GPTNeoXForCausalLM.from_pretrained(root / "policy")
    reward_model = GPTNeoXForSequenceClassification.from_pretrained(root / "reward_model")
    report |= stage(
        "report",
        lambda: measure(cfg, policy, reward_model, tokenizer, splits["validation"]),
        lambda r: (
            f"SFT win rate {r['sft_win_rate_vs_reference']:.3f}, RM held-out accuracy {r['rm_heldout_accuracy']:.3f}"
        ),
    )
    report["seconds"] = seconds
    return {"splits": list(splits), "report": report}


def damage(root: Path) -> str | None:
    """What is wrong with a cached artifacts dir (a file changed, missing or added since it was built), or None."""
    return cache.damage(root, MARKER)


def ensure_artifacts(bootstrap_cfg, cache_dir, log=print) -> ToyArtifacts:
    """The cached artifacts for this bootstrap config, built first if missing or damaged (one builder at a time)."""
    cfg, root = _plain(bootstrap_cfg), artifacts_dir(bootstrap_cfg, Path(cache_dir).expanduser())

    def build(staging: Path) -> dict:
        log(f"[bootstrap] building the embedded task's artifacts in {root}")
        started = time.perf_counter()
        record = _build(cfg, staging, log)
        log(f"[bootstrap] done in {time.perf_counter() - started:.1f} s: " + format_report(record["report"]))
        return record

    cache.entry(root, build, "[bootstrap] the embedded task's cache", log, manifest=MARKER)
    return _load(root)
