"""The import structure the code promises: entry points import the library, never each other, and no module of
rloo/ takes part in an import cycle (imports inside functions count too)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENTRY_POINTS = {
    "rloo.train",
    "rloo.evaluate",
    "rloo.sft",
    "rloo.reward",
    "rloo.report",
    "rloo.plan",
    "rloo.bench.__main__",
}
CORE = {
    "rloo.objectives",
    "rloo.generation.rollout",
    "rloo.generation.forward",
    "rloo.generation.sampling",
    "rloo.generation.decode",
    "rloo.generation.episodes",
    "rloo.generation.lean_sampler",
    "rloo.generation.samplers",
    "rloo.generation.environment",
    "rloo.generation.external",
    "rloo.environments.tools",
    "rloo.environments.base",
    "rloo.rewards.scoring",
    "rloo.utils.resume",
    "rloo.models.lora",
    "rloo.models.sharding",
    "rloo.service.episodes",
    "rloo.service.producer",
    "rloo.service.weights",
    "rloo.service.staleness",
}  # no Lightning or Hydra


def modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "rloo").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The rloo modules a file imports, at any depth of its code."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in names if name in known}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) - {name} for name, path in found.items()}


def test_no_module_imports_an_entry_point():
    offenders = {name: sorted(targets & ENTRY_POINTS) for name, targets in graph().items() if targets & ENTRY_POINTS}
    assert offenders == {}


def test_only_the_benchmark_imports_the_benchmark():
    """rloo.bench measures the library; training and evaluation never depend on it."""
    offenders = {
        name
        for name, targets in graph().items()
        if not name.startswith("rloo.bench") and any(t.startswith("rloo.bench") for t in targets)
    }
    assert offenders == set()


def test_the_generation_layer_imports_nothing_above_it():
    """rloo.generation (the rollout engine, its samplers and the environment protocol) builds on the layers below it:
    no module of it imports the environments, the rewards, the algorithms, evaluation or the run's shell."""
    above = ("rloo.environments", "rloo.rewards", "rloo.algorithms", "rloo.evaluation", "rloo.run", "rloo.toy")
    offenders = {
        name: sorted(t for t in targets if t.startswith(above))
        for name, targets in graph().items()
        if name.startswith("rloo.generation") and any(t.startswith(above) for t in targets)
    }
    assert offenders == {}


def test_the_episode_service_sits_below_the_algorithms_and_evaluation():
    """rloo.service (the one place episodes are orchestrated, inline or in a producer process) imports the rollout
    engine, the data, the rewards and the utilities, never the algorithms, evaluation, judges or the run's shell; the
    algorithms and held-out evaluation reach episodes through it."""
    above = ("rloo.algorithms", "rloo.evaluation", "rloo.judges", "rloo.run", "rloo.toy", "rloo.bench")
    edges = graph()
    offenders = {
        name: sorted(t for t in targets if t.startswith(above))
        for name, targets in edges.items()
        if name.startswith("rloo.service") and any(t.startswith(above) for t in targets)
    }
    assert offenders == {}
    assert "rloo.service.episodes" in edges["rloo.algorithms.base"]
    assert "rloo.service.episodes" in edges["rloo.evaluation.heldout"]
    # neither orchestrates episodes itself any more: no environment is started or closed outside the service
    for name in ("rloo.algorithms.base", "rloo.evaluation.heldout"):
        text = modules()[name].read_text()
        assert "start_all(" not in text and "close_all(" not in text and "observed_prompts(" not in text, name


def test_there_is_no_import_cycle():
    edges, state, cycles = graph(), {}, []

    def visit(node, path):
        state[node] = "open"
        for target in sorted(edges[node]):
            if target == "rloo" or target.startswith(node + "."):
                continue  # a package importing its own modules is its face, not a cycle
            if state.get(target) == "open":
                cycles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_the_core_has_no_framework_in_it():
    for name in CORE:
        path = modules()[name]
        tree = ast.parse(path.read_text())
        imported = {
            alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
        }
        imported |= {
            node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
        }
        assert not imported & {"lightning", "hydra", "omegaconf"}, name


def test_composing_and_validating_a_config_loads_no_lightning():
    """The config classes and every check before the models load read YAML and dataclasses only: a subprocess
    composes and validates each kind of algorithm and finds no Lightning among its modules."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from rloo.run.cli import compose_train_config, preflight\n"
        "from rloo.config.checks import validate_run\n"
        "for argv in ([], ['algo=grpo'], ['algo=dapo'], ['algo=ppo'], ['algo=dpo'], ['judge=reward_model']):\n"
        "    validate_run(compose_train_config(preflight(argv)), 1)\n"
        "import rloo.algorithms.configs, rloo.run.pipeline\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))\n"
        "print('torch' in sys.modules and 'rloo.algorithms.configs' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines()[0] == "[]"


def test_the_config_classes_import_neither_lightning_nor_torch():
    """rloo/algorithms/configs.py and what it imports (checked on the import graph)."""
    found = modules()
    seen, todo = set(), ["rloo.algorithms.configs"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        text = found[name].read_text()
        assert not any(
            line.startswith(("import torch", "from torch", "import lightning", "from lightning"))
            for line in (line.strip() for line in text.splitlines())
        ), name
        todo += sorted(imports(found[name], set(found)) - {name})
    assert "rloo.generation.settings" in seen and "rloo.utils.keys" in seen
