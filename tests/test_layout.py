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
    "rloo.rewards.scoring",
    "rloo.utils.resume",
    "rloo.models.lora",
    "rloo.models.sharding",
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
