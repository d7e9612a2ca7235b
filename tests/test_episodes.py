"""Multi-turn episodes (env=): the environment's tokens are context, never action (not in the loss, the KL or the
ratios); turns and replies alternate as the environment says; an environment that misbehaves is one line; every
algorithm of the shared step trains on episodes."""

import copy
import inspect
import math
import re
import threading
import time

import numpy as np
import pytest
import torch
from transformers import PreTrainedTokenizerFast

from rloo.algorithms.policy_gradient import PolicyGradientModule
from rloo.data.padding import left_pad
from rloo.environments.base import EnvironmentSpec, GuardedEnvironment, Step, environment_class
from rloo.generation.environment import reply_text
from rloo.generation.episodes import Episode, episode_tensors, sample_episodes
from rloo.generation.rollout import Rollout
from rloo.generation.settings import EpisodeSettings
from rloo.models.loading import freeze
from rloo.utils.errors import ConfigError, EnvironmentFailed
from tests.builders import sampling, train_config
from tests.tiny_models import FAMILIES, tiny_model


class Scripted:
    """Replies "next" twice, then ends the episode with a reward of the number of turns."""

    def reset(self, row):
        self.turns = 0

    def step(self, action):
        self.turns += 1
        return (None, float(self.turns), True) if self.turns == 3 else (" next\n\nTL;DR:", None, False)


class Raises(Scripted):
    def step(self, action):
        raise ValueError("no such move")


class Hangs(Scripted):
    def step(self, action):
        time.sleep(30)


class Malformed(Scripted):
    def step(self, action):
        return "only a reply"


def spec(cls, timeout_s=5.0, max_turns=3, max_episode_tokens=40) -> EnvironmentSpec:
    return EnvironmentSpec(
        f"tests.test_episodes.{cls.__name__}", cls, timeout_s, EpisodeSettings(max_turns, max_episode_tokens)
    )


def run_episodes(policy, tokenizer, prompts, environments, sampling, settings, batch_size, lean=True) -> list[Episode]:
    """The rollout engine over text prompts (token lists), left-padded as a batch holds them."""
    from dataclasses import replace

    ids, mask = left_pad(prompts, tokenizer.pad_token_id)
    sampled = sample_episodes(
        policy,
        ids,
        mask,
        replace(sampling, lean_decode=lean),
        batch_size,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        environments=environments,
        settings=settings,
        tokenizer=tokenizer,
    )
    return sampled.episodes


# ---- the environment's tokens are never action --------------------------------------------------------------------
def hand_built_rollout(tokenizer) -> Rollout:
    """Two episodes of one prompt (k = 2): model tokens, then three of the environment's, then the model's again."""
    prompt = tokenizer("POST: my dog and the car\n\nTL;DR:", add_special_tokens=False).input_ids
    own_a, env, own_b = [5, 9, 7], tokenizer(" more\n\nTL;DR:", add_special_tokens=False).input_ids, [11, 4]
    episodes = [
        Episode(tokens=own_a + env + own_b, own=[1] * 3 + [0] * len(env) + [1] * 2, logprobs=[-1.0] * (5 + len(env))),
        Episode(tokens=own_b + env + own_a, own=[1] * 2 + [0] * len(env) + [1] * 3, logprobs=[-2.0] * (5 + len(env))),
    ]
    made = episode_tensors(episodes, tokenizer.pad_token_id, "cpu")
    n, width = 2, made["completion_ids"].shape[1]
    prompt_ids = torch.tensor([prompt, prompt])
    return Rollout(
        prompt_ids,
        torch.ones_like(prompt_ids),
        made["completion_ids"],
        made["completion_mask"],
        torch.ones(n, dtype=torch.bool),
        made["generation_logprobs"] * made["completion_mask"],
        torch.full((n, width), -1.5) * made["completion_mask"],
        torch.tensor([1.0, 0.0]),
        made["episode_mask"],
        torch.zeros(n, dtype=torch.int64),
    )


@pytest.mark.parametrize("algorithm", ["rloo", "grpo", "dr_grpo", "gspo"])
def test_environment_tokens_are_never_in_the_loss_the_kl_or_the_ratios(policy, tokenizer, reward_model, algorithm):
    config = train_config(algorithm, 1, k=2, rollout_batch_size=2, micro_batch_size=2, generation_batch_size=2)
    module = PolicyGradientModule(policy, freeze(copy.deepcopy(policy)), freeze(reward_model), tokenizer, config)
    rollout = hand_built_rollout(tokenizer)
    own, env = rollout.completion_mask.bool(), rollout.episode_mask.bool() & ~rollout.completion_mask.bool()
    assert env.sum() >= 2 and env.sum() % 2 == 0 and own.sum() == 10  # the same reply in both episodes

    def step(r: Rollout):
        module.policy.zero_grad()
        logprobs, _ = module.policy_forward(r)
        targets = module.rewards_and_advantages(r, logprobs.detach())
        mask = module.loss_mask(r)
        loss, stats = module.policy_loss(
            r, mask, targets.advantages, logprobs, logprobs.detach() + 0.1 * r.completion_mask, logprobs.detach()
        )
        loss.backward()
        grads = [p.grad.clone() for p in module.policy.parameters() if p.grad is not None]
        return logprobs.detach(), targets, loss.detach(), stats, grads

    logprobs, targets, loss, stats, grads = step(rollout)
    # the policy's log-probs: 0 at the environment's tokens, and at the model's those of a plain forward over the
    # whole episode (an independent reference: the model's own logits, at the sampling temperature)
    assert torch.all(logprobs[env] == 0)
    logits = module.policy(input_ids=rollout.input_ids, attention_mask=rollout.attention_mask).logits.float()
    width = rollout.prompt_ids.shape[1]
    reference = torch.log_softmax(logits[:, width - 1 : -1] / config.sampling.temperature, -1)
    reference = reference.gather(-1, rollout.completion_ids[..., None])[..., 0]
    assert torch.allclose(logprobs[own], reference[own], atol=1e-5)
    # garbage where the environment spoke, in every per-token record: the same loss, statistics and gradients
    spoiled = copy.copy(rollout)
    spoiled.ref_logprobs = torch.where(env, torch.tensor(-40.0), rollout.ref_logprobs)
    spoiled.generation_logprobs = torch.where(env, torch.tensor(25.0), rollout.generation_logprobs)
    _, targets2, loss2, stats2, grads2 = step(spoiled)
    assert torch.equal(loss, loss2) and all(torch.equal(a, b) for a, b in zip(grads, grads2))
    assert torch.equal(targets.advantages, targets2.advantages) and torch.equal(targets.rewards, targets2.rewards)
    assert {k: float(v) for k, v in stats.items()} == {k: float(v) for k, v in stats2.items()}


# ---- turns and replies ----------------------------------------------------------------------------------------------
def test_turns_and_replies_alternate_until_the_environment_says_done(policy, tokenizer):
    environments = [spec(Scripted).start({"prompt": "x"}) for _ in range(2)]
    prompt = tokenizer("POST: my dog\n\nTL;DR:", add_special_tokens=False).input_ids
    settings = EpisodeSettings(max_turns=5, max_episode_tokens=200)
    episodes = run_episodes(policy, tokenizer, [prompt, prompt], environments, sampling(4), settings, 2)
    reply = tokenizer(" next\n\nTL;DR:", add_special_tokens=False).input_ids
    for episode in episodes:
        assert episode.turns == 3 and episode.terminated and episode.episode_return == 3.0  # Scripted ends at turn 3
        assert not episode.truncated
        runs, flags = [], episode.own  # maximal runs of equal flags: turn, reply, turn, reply, turn
        for flag in flags:
            if runs and runs[-1][0] == flag:
                runs[-1][1] += 1
            else:
                runs.append([flag, 1])
        assert [flag for flag, _ in runs] == [1, 0, 1, 0, 1]
        replies = [i for i, f in enumerate(flags) if f == 0]
        assert [episode.tokens[i] for i in replies] == reply * 2  # the reply's own tokens, as text prompts give it
        assert len(episode.logprobs) == len(episode.tokens) and all(episode.logprobs[i] == 0.0 for i in replies)
        assert [m["role"] for m in episode.messages] == ["assistant", "user", "assistant", "user", "assistant"]


def test_the_token_budget_and_max_turns_end_an_episode(policy, tokenizer):
    prompt = tokenizer("POST: my dog\n\nTL;DR:", add_special_tokens=False).input_ids
    for lean in (True, False):
        short = run_episodes(
            policy, tokenizer, [prompt], [spec(Scripted).start({})], sampling(4), EpisodeSettings(5, 6), 1, lean
        )[0]
        assert len(short.tokens) <= 6 and not short.terminated and short.truncated  # the budget, not the environment
        one = run_episodes(
            policy, tokenizer, [prompt], [spec(Scripted).start({})], sampling(4), EpisodeSettings(1, 99), 1, lean
        )[0]
        assert one.turns == 1 and all(one.own) and one.truncated  # no reply after the last turn: max_turns cut it


def test_a_chat_reply_enters_through_the_template():
    from tokenizers import Tokenizer, models

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")), eos_token="<|im_end|>"
    )
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    # after a turn the model ended with <|im_end|>: the rest of the template's glue, the reply's turn, the next prompt
    assert (
        reply_text(tokenizer, "= 42", "tool", True, True)
        == "\n<|im_start|>tool\n= 42<|im_end|>\n<|im_start|>assistant\n"
    )
    # a turn cut by the budget: the end marker is the environment's to add
    assert reply_text(tokenizer, "= 42", "tool", False, True).startswith("<|im_end|>\n<|im_start|>tool\n")
    assert reply_text(tokenizer, "= 42", "tool", True, False) == "= 42"  # text prompts: the reply as it is


# ---- a misbehaving environment is one line --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "cls, said",
    [
        (
            Raises,
            f"environment tests.test_episodes.Raises failed in step(action_text): at tests/test_episodes.py:"
            f"{inspect.getsourcelines(Raises.step)[1] + 1} in step: ValueError: no such move",
        ),
        (
            Hangs,
            "environment tests.test_episodes.Hangs failed in step(action_text): TimeoutError: no result after "
            "0.3 s (env.timeout_s)",
        ),
        (
            Malformed,
            "environment tests.test_episodes.Malformed: step returned str, not (reply, reward, done) or "
            "(reply, reward, terminated, truncated[, info])",
        ),
    ],
)
def test_an_environment_that_raises_hangs_or_answers_wrongly_is_one_line(cls, said):
    environment = spec(cls, timeout_s=0.3).start({"prompt": "x"})
    with pytest.raises(EnvironmentFailed) as failure:
        environment.step("an action")
    assert str(failure.value) == said


def test_a_reward_must_be_a_finite_number_or_none():
    class NanReward(Scripted):
        def step(self, action):
            return Step(None, float("nan"), True)

    environment = GuardedEnvironment("m.NanReward", NanReward, 1.0)
    with pytest.raises(EnvironmentFailed, match=r"step's reward is nan: a number finite in float32, or None"):
        environment.step("a")

    class HugeReward(Scripted):  # math.isfinite(10**400) raises: here it is one line
        def step(self, action):
            return Step(None, 10**400, True)

    with pytest.raises(EnvironmentFailed, match=r"step's reward is 1000.*\.\.\.: a number finite in float32"):
        GuardedEnvironment("m.HugeReward", HugeReward, 1.0).step("a")

    class ArrayReward(Scripted):  # np.mean(...): a 0-d value is the number it holds
        def step(self, action):
            return Step(None, np.mean(np.array([1.0, 0.0])) * np.ones(()), True)

    assert GuardedEnvironment("m.ArrayReward", ArrayReward, 1.0).step("a").reward == 0.5


def test_env_settings_that_cannot_run_are_refused_before_anything_loads():
    from rloo.config.checks import validate_train_config
    from rloo.run.cli import compose_train_config

    with pytest.raises(ConfigError, match=r"^reward='env' names env, the environment's return, and env= is none"):
        validate_train_config(compose_train_config(["reward=env"]))
    with pytest.raises(ConfigError, match=r"^env=topic_recall runs with the algorithms of the shared"):
        validate_train_config(compose_train_config(["env=topic_recall", "algo=ppo", "reward=env"]))
    with pytest.raises(ConfigError, match=r"^env=topic_recall: a model's turn ends at its stop token"):
        validate_train_config(compose_train_config(["env=topic_recall", "stop_token=null"]))
    with pytest.raises(ConfigError, match=r"is not a class with reset\(row\) and step\(action_text\)"):
        environment_class("rloo.toy.topic_recall.MORE")


def test_an_environment_module_that_is_missing_or_fails_as_it_imports_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "broken_env.py").write_text("raise RuntimeError('no simulator on this machine')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError) as caught:
        environment_class("broken_env.Game")
    assert str(caught.value) == (
        f"env.environment._target_: importing 'broken_env' for 'broken_env:Game' raised at {tmp_path / 'broken_env.py'}"
        ":1 in <module>: RuntimeError: no simulator on this machine"
    )
    with pytest.raises(
        ConfigError, match=r"^env.environment._target_: cannot import 'no_such_env' for 'no_such_env:G'"
    ):
        environment_class("no_such_env.G")


def test_the_environment_is_hydras_to_build_and_the_old_keys_name_the_new_form():
    """env.environment is instantiated by Hydra as a _partial_ factory (keyword arguments beside _target_, overridable
    on the command line); env.target and env.kwargs, the old form, are one line naming it."""
    from rloo.config.checks import validate_train_config
    from rloo.run.assemble import environment_from_config
    from rloo.run.cli import compose_train_config
    from rloo.toy.topic_recall import TopicRecall

    cfg = compose_train_config(["env=topic_recall", "reward=env", "env.environment.turns=2"])
    validate_train_config(cfg)
    spec = environment_from_config(cfg)
    one, two = spec.factory(), spec.factory()
    assert type(one) is TopicRecall and one is not two and one.turns == 2
    old = "env.target is not a config key of python -m rloo.train: it is now env.environment._target_"
    with pytest.raises(ConfigError, match="^" + re.escape(old)):
        validate_train_config(compose_train_config(["env=topic_recall", "reward=env", "+env.target=m:C"]))
    with pytest.raises(ConfigError, match=r"^env=topic_recall: env.environment needs _target_"):
        validate_train_config(compose_train_config(["env=topic_recall", "reward=env", "~env.environment._target_"]))


# ---- every algorithm of the shared step trains on episodes ----------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["rloo", "grpo", "dr_grpo", "dapo", "reinforce_pp", "gspo"])
def test_every_algorithm_of_the_shared_step_trains_on_episodes(embedded_task, tmp_path, monkeypatch, algorithm):
    import rloo

    monkeypatch.setenv("RLOO_CACHE_DIR", str(embedded_task / "cache"))
    summary = rloo.fit(
        {"debug": "fast", "logger": "csv", "judge": "none", "env": "topic_recall", "reward": "env", "algo": algorithm}
        | ({"dynamic_sampling": "false"} if algorithm == "dapo" else {}),
        output_dir=tmp_path / algorithm,
    )
    assert summary["status"] == "finished"
    for evaluation in (summary["initial"], summary["final"]):
        assert math.isfinite(evaluation["eval/reward/env"]) and evaluation["eval/reward/env"] <= 1
        assert 1 <= evaluation["eval/turns"] <= 3


# ---- the episode's KV cache continues across the environment's tokens, exact against recomputation ------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_the_continued_cache_gives_a_full_forwards_logits(tokenizer, family):
    """Two rows of the lean sampler fed ragged chunks in turn (single tokens, a reply for one row while the other
    waits) and turns drawn between them: after every chunk, each fed row's logits equal the model's own forward over
    that row's whole sequence, and greedy turns from rows at different lengths are the full forward's argmaxes."""
    from rloo.generation.decode import prepared_weights
    from rloo.generation.lean_sampler import LeanSampler

    model = tiny_model(family, tokenizer).eval()
    prompts = [[3, 8, 9, 10, 2], [4, 5]]
    ids, mask = left_pad(prompts, tokenizer.pad_token_id)
    greedy = sampling(3, greedy=True, stop_at_eos=False)
    sampler = LeanSampler(
        prepared_weights(model, 2),
        ids,
        mask,
        greedy,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        capacity=4,
        keeps_rows=True,  # a small cache: it grows on the way
    )
    sequences = [list(p) for p in prompts]

    def full_logits(row):
        with torch.no_grad():
            return model(input_ids=torch.tensor([sequences[row]])).logits[0, -1]

    feeds = [([7], [6]), ([11, 12, 13], []), ([], [14, 15, 16, 17, 18, 19]), ([20], [21])]
    for number, feed in enumerate(feeds):
        drawn, _ = sampler.turn(torch.tensor([0, 1]), 3)  # rows at different lengths after the first feed
        for row in (0, 1):  # greedy: each token the argmax of a full forward over the sequence so far
            for token in drawn[row].tolist():
                assert token == int(full_logits(row).argmax()), (family, number, row)
                sequences[row].append(token)
        rows = [row for row, tokens in enumerate(feed) if tokens] or [0]
        sampler.append(torch.tensor(rows), [list(feed[row]) for row in rows])
        for row in rows:
            sequences[row] += feed[row]
            slot = int(sampler._slots_of(torch.tensor([row]))[0])
            assert torch.allclose(sampler.logits[slot], full_logits(row), atol=2e-5), (family, feed, row)
    assert sampler.capacity >= 4 + 64


def test_finished_rows_leave_the_episode_batch(policy, tokenizer, monkeypatch):
    """Each decode step of an episode's turn runs the rows still drawing only: the batch shrinks as rows end, in
    every turn, and the ended rows' caches are kept for their next turn (the episode goes on)."""
    import rloo.generation.lean_sampler as lean_sampler

    widths = []
    step = lean_sampler._decode_step
    monkeypatch.setattr(
        lean_sampler, "_decode_step", lambda w, hidden, *a: widths.append(len(hidden)) or step(w, hidden, *a)
    )
    head = policy.get_output_embeddings()  # EOS about one draw in eight: rows end at different steps
    eos = torch.tensor(tokenizer.eos_token_id)
    head.bias = torch.nn.Parameter(torch.zeros(head.out_features).index_fill_(0, eos, 4))
    prompt = tokenizer("POST: my dog and a car\n\nTL;DR:", add_special_tokens=False).input_ids
    environments = [spec(Scripted).start({"prompt": "x"}) for _ in range(8)]
    torch.manual_seed(0)
    episodes = run_episodes(
        policy, tokenizer, [prompt] * 8, environments, sampling(12, temperature=1.5), EpisodeSettings(3, 200), 8
    )
    assert all(e.turns == 3 for e in episodes)
    assert widths[0] == 8 and min(widths) < 8  # rows left the batch as they ended
    assert any(a > b for a, b in zip(widths, widths[1:]))


def test_an_episodes_sampler_log_probs_equal_the_training_forwards(policy, tokenizer):
    """The lean sampler's own log-probs over whole episodes (turns continued in their caches, rows at different
    lengths) against a forward over whole episodes (the training layout)."""
    from rloo.generation.forward import completion_logprobs

    prompt = tokenizer("POST: my dog and a car\n\nTL;DR:", add_special_tokens=False).input_ids
    environments = [spec(Scripted).start({"prompt": "x"}) for _ in range(3)]
    episodes = run_episodes(
        policy,
        tokenizer,
        [prompt, prompt[2:], prompt],
        environments,
        sampling(5, temperature=0.7),
        EpisodeSettings(3, 40),
        3,
    )
    made = episode_tensors(episodes, tokenizer.pad_token_id, "cpu")
    ids, mask = torch.tensor([prompt, [tokenizer.pad_token_id] * 2 + prompt[2:], prompt]), torch.ones(3, len(prompt))
    mask[1, :2] = 0
    with torch.no_grad():
        recomputed = completion_logprobs(
            policy,
            torch.cat([ids, made["completion_ids"]], 1),
            torch.cat([mask.long(), made["episode_mask"]], 1),
            made["completion_ids"],
            made["completion_mask"],
            0.7,
        )
    own = made["completion_mask"].bool()
    assert own.sum() > 6 and (~own & made["episode_mask"].bool()).any()  # turns and replies both there
    assert torch.allclose(made["generation_logprobs"][own], recomputed[own], atol=2e-5)


@pytest.mark.slow
def test_an_episode_run_killed_and_resumed_ends_bit_identical(finished_run):
    """env=topic_recall, 8 rollouts with a checkpoint each: SIGKILL after the 3rd, resume=auto (the run's own
    settings), and the policy ends bit for bit as a run never interrupted."""
    import signal

    from safetensors.torch import load_file

    from tests.e2e import train
    from tests.test_interrupt import finish, start, wait_for

    base, _ = finished_run
    run = ["env=topic_recall", "reward=env", "judge=none", "total_episodes=64", "checkpoint_every=1"]
    run += ["keep_checkpoints=-1", "eval_every=0", "eval.before=false", "lr=3e-3"]
    straight = train(base / "episodes-straight", base / "cache", *run)
    assert straight.returncode == 0, straight.stderr[-3000:]
    killed = base / "episodes-killed"
    process = start(killed, base / "cache", *run)
    wait_for(lambda: (killed / "checkpoints" / "step3.ckpt").exists(), process)
    process.send_signal(signal.SIGKILL)
    assert finish(process)[0] == -signal.SIGKILL
    resumed = train(killed, base / "cache", "resume=auto")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a = load_file(base / "episodes-straight" / "policy" / "model.safetensors")
    b = load_file(killed / "policy" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---- the environment protocol: ends, info, close, concurrency, long replies ----------------------------------------
class Gymlike(Scripted):
    """Gymnasium's split end: (reply, reward, terminated, truncated, info); it cuts every episode at its 2nd turn."""

    closed: list = []

    def step(self, action):
        self.turns += 1
        if self.turns == 2:
            return None, 0.5, False, True, {"guesses": 2.0}
        return " next\n\nTL;DR:", None, False, False, {"guesses": 1.0}

    def close(self):
        Gymlike.closed.append(self)


def test_terminated_truncated_info_and_close_reach_the_episode(policy, tokenizer):
    Gymlike.closed = []
    environments = spec(Gymlike).start_all([{"prompt": "x"}] * 3)
    prompt = tokenizer("POST: my dog\n\nTL;DR:", add_special_tokens=False).input_ids
    episodes = run_episodes(policy, tokenizer, [prompt] * 3, environments, sampling(4), EpisodeSettings(5, 200), 3)
    for episode in episodes:
        assert episode.turns == 2 and episode.truncated and not episode.terminated and episode.info == {"guesses": 2.0}
    from rloo.generation.episodes import close_all

    close_all(environments)
    assert len(Gymlike.closed) == 3


class Slow(Scripted):
    """Counts how many of its calls run at once."""

    running, most = 0, 0

    def step(self, action):
        with LOCK:
            Slow.running += 1
            Slow.most = max(Slow.most, Slow.running)
        time.sleep(0.2)
        with LOCK:
            Slow.running -= 1
        return None, 1.0, True


LOCK = threading.Lock()


def test_the_environment_calls_of_one_turn_run_concurrently(policy, tokenizer):
    Slow.most = 0
    environments = spec(Slow).start_all([{"prompt": "x"}] * 6)
    prompt = tokenizer("POST: my dog\n\nTL;DR:", add_special_tokens=False).input_ids
    episodes = run_episodes(policy, tokenizer, [prompt] * 6, environments, sampling(3), EpisodeSettings(2, 50), 6)
    assert all(e.terminated and e.episode_return == 1.0 for e in episodes)
    assert Slow.most > 1  # calls overlapped (each still under its own guard)


def test_a_huge_reply_is_cut_before_it_is_tokenized(tokenizer, monkeypatch):
    from rloo.generation.environment import longest_token_chars, reply_tokens

    seen = []
    original = type(tokenizer).__call__
    monkeypatch.setattr(
        type(tokenizer), "__call__", lambda self, text, **k: seen.append(len(text)) or original(self, text, **k)
    )
    reply = " dog" * 250_000  # 1 MB
    tokens = reply_tokens(tokenizer, reply, 20)
    assert tokens == original(tokenizer, reply[:400], add_special_tokens=False).input_ids[:20]
    assert seen == [22 * longest_token_chars(tokenizer)] and seen[0] < 10_000
