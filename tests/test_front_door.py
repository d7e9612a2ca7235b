"""rloo.fit as a researcher coming from TRL uses it: a model object (a PreTrainedModel or a PeftModel) with its
tokenizer, saved into the run dir so the run resumes; a result holding the summary, the run dir and the trained
policy; Lightning callbacks passed through; TRL's config names refused with rloo's."""

import json
import warnings

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback

from rloo.utils.errors import ConfigError

FAST = {"debug": "fast", "logger": "csv", "judge": "none", "eval.before": "false"}


def embedded_policy(embedded_task):
    """The embedded task's SFT policy and tokenizer, loaded as a user loads their own."""
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rloo.run.cli import compose_train_config
    from rloo.toy.bootstrap import ensure_artifacts

    bootstrap = OmegaConf.to_container(compose_train_config(["debug=fast"]).bootstrap, resolve=True)
    artifacts = ensure_artifacts(bootstrap, embedded_task / "cache", log=lambda line: None)
    return AutoModelForCausalLM.from_pretrained(artifacts.policy), AutoTokenizer.from_pretrained(artifacts.policy)


class CountsRollouts(Callback):
    def __init__(self):
        self.rollouts = 0

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.rollouts += 1


def test_a_model_object_trains_and_the_result_holds_the_trained_policy(embedded_task, tmp_path, monkeypatch):
    import rloo

    monkeypatch.setenv("RLOO_CACHE_DIR", str(embedded_task / "cache"))
    policy, tokenizer = embedded_policy(embedded_task)
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    counter, out = CountsRollouts(), tmp_path / "run"
    result = rloo.fit(FAST, model=policy, tokenizer=tokenizer, output_dir=out, callbacks=[counter])
    assert result["status"] == "finished" and result.summary["rollouts"] == 3 and result.run_dir == out
    assert counter.rollouts == 3  # the callback ran in the Trainer, once per rollout
    saved = out / "models" / "policy"
    assert f"model.policy={saved}" in yaml.safe_load((out / ".hydra" / "overrides.yaml").read_text())
    trained = dict(result.policy.named_parameters())
    assert set(trained) == set(before) and any(not torch.equal(trained[n], before[n]) for n in before)
    assert all(torch.equal(p, before[n]) for n, p in policy.named_parameters())  # the caller's object unchanged
    assert result.tokenizer.vocab_size == tokenizer.vocab_size
    # the run dir resumes with the same model, and refuses another
    assert rloo.fit(FAST, model=policy, tokenizer=tokenizer, output_dir=out, resume="auto")["status"] == "finished"
    with torch.no_grad():
        next(policy.parameters()).add_(1.0)
    with pytest.raises(ConfigError, match=r"^model differs from the one .*models/policy holds"):
        rloo.fit(FAST, model=policy, tokenizer=tokenizer, output_dir=out, resume="auto")


def test_a_peft_model_trains_fresh_adapters_of_its_shape_on_its_merged_weights(embedded_task, tmp_path, monkeypatch):
    from peft import LoraConfig, get_peft_model

    import rloo

    monkeypatch.setenv("RLOO_CACHE_DIR", str(embedded_task / "cache"))
    policy, tokenizer = embedded_policy(embedded_task)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["query_key_value", "dense"])
    with warnings.catch_warnings():  # peft reads transformers' deprecated is_gradient_checkpointing: the user's call
        warnings.simplefilter("ignore", FutureWarning)
        peft_model = get_peft_model(policy, config)
    out = tmp_path / "lora"
    result = rloo.fit(FAST, model=peft_model, tokenizer=tokenizer, output_dir=out)
    assert result["status"] == "finished"
    run_config = yaml.safe_load((out / "config.yaml").read_text())
    assert run_config["model"]["lora"] is True
    assert run_config["lora"] == {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["dense", "query_key_value"]}
    assert any("lora_" in name for name, _ in peft_model.named_parameters())  # the caller's keeps its adapters
    assert not any("lora_" in name for name, _ in result.policy.named_parameters())  # exported merged


def test_what_fit_cannot_take_is_one_line_before_any_model_loads(tmp_path):
    import rloo

    policy = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match=r"^model is a Linear object: hand in its tokenizer too"):
        rloo.fit(FAST, model=policy, output_dir=tmp_path / "a")
    with pytest.raises(ConfigError, match=r"^model is a Linear: a transformers PreTrainedModel, a peft PeftModel"):
        rloo.fit(FAST, model=policy, tokenizer=object(), output_dir=tmp_path / "b")
    with pytest.raises(ConfigError, match=r"^callbacks: 3 is not a lightning.pytorch.callbacks.Callback"):
        rloo.fit(FAST, callbacks=[3], output_dir=tmp_path / "c")
    for trl, ours in (("num_generations", "k"), ("beta", "kl_coef"), ("max_completion_length", "response_length")):
        with pytest.raises(ConfigError) as caught:
            rloo.fit(FAST | {trl: 4}, output_dir=tmp_path / "d")
        assert str(caught.value).startswith(f"{trl} is TRL's name (GRPOConfig / RLOOConfig): rloo's is {ours}")
    assert not (tmp_path / "d" / "policy").exists()


def test_the_docs_table_of_trls_names_is_the_one_fit_refuses_by():
    from pathlib import Path

    from rloo.config.trl_names import markdown_table

    docs = (Path(__file__).parents[1] / "docs" / "extending.md").read_text()
    assert markdown_table() in docs
    assert json.dumps(markdown_table())  # plain text
