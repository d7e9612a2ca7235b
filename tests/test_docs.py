"""The pages that must stay true as the code grows: the config-group tables are made from conf/, the README's layout
names every module of rloo/, and its documentation table every page of docs/."""

import re
from pathlib import Path

from rloo.run.cli import GROUP_TABLE_MARKERS, GROUP_TABLE_PAGES, group_table

ROOT = Path(__file__).resolve().parent.parent


def test_the_group_tables_are_the_conf_trees_own():
    begin, end = GROUP_TABLE_MARKERS
    for page in GROUP_TABLE_PAGES:
        text = (ROOT / page).read_text()
        assert begin in text and end in text, page
        table = text.partition(begin)[2].partition(end)[0]
        assert table == group_table(), f"{page}: run python -c 'from rloo.run.cli import write_group_tables as w; w()'"


def layout_block() -> str:
    readme = (ROOT / "README.md").read_text()
    return readme.partition("## Layout")[2].partition("```")[2].partition("```")[0]


def test_the_readme_layout_names_every_module():
    """A top-level module by its file name on a line of its own (rloo/x.py, or y.py after one), a package by its
    folder."""
    layout = layout_block()
    lines = [line for line in layout.splitlines() if line.strip()]
    listed_names = {name for line in lines for name in re.findall(r"[\w.]+\.py", line.split("  ")[0])}
    missing = []
    for path in sorted((ROOT / "rloo").rglob("*.py")):
        relative = path.relative_to(ROOT / "rloo")
        if len(relative.parts) > 1:
            if f"rloo/{relative.parts[0]}/" not in layout:
                missing.append(str(relative))
        elif path.name != "__init__.py" and path.name not in listed_names:
            missing.append(str(relative))
    assert missing == []


def test_the_readme_lists_every_documentation_page():
    readme = (ROOT / "README.md").read_text()
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert [page for page in pages if f"(docs/{page})" not in readme] == []


def test_extending_names_only_what_the_code_has():
    """docs/extending.md: every path it names exists, every backticked name of the step's registries is defined
    where it says, and every choice of the step's keys is a branch of its pure function."""
    import torch

    from rloo.algorithms import configs
    from rloo.algorithms.registry import ALGORITHMS, STEP
    from rloo.objectives import aggregate, sequence_advantages

    text = (ROOT / "docs" / "extending.md").read_text()
    paths = set(re.findall(r"`((?:rloo|tests|conf)/[\w/.]+?\.(?:py|yaml))", text))
    assert paths and [p for p in paths if not (ROOT / p).exists()] == []
    for name in ("ADVANTAGES", "AGGREGATIONS", "ESTIMATOR_INERT", "EstimatorConfig", "OnlineRLConfig"):
        assert f"`{name}`" in text and hasattr(configs, name), name
    assert {a for a, spec in ALGORITHMS.items() if (spec.module, spec.module_class, spec.config_class) == STEP} >= {
        "rloo",
        "grpo",
        "dapo",
    }
    rewards = torch.tensor([1.0, 2.0, 0.0, 4.0])
    per_completion = [a for a in configs.ADVANTAGES if a not in configs.PER_TOKEN_ADVANTAGES]
    for advantage in per_completion:  # every per-completion choice is a branch of sequence_advantages
        assert sequence_advantages(rewards, 2, advantage).shape == (4,)
    mask = torch.ones(4, 3)
    for aggregation in configs.AGGREGATIONS:  # and every aggregation a branch of aggregate
        assert aggregate(torch.ones(4, 3), mask, aggregation, 3.0).item() > 0


def test_environments_names_only_what_the_code_has():
    """docs/environments.md: every path it names exists, every test it cites is defined, every env option too."""
    text = (ROOT / "docs" / "environments.md").read_text()
    paths = set(re.findall(r"`((?:rloo|tests|conf)/[\w/.<>]+?\.(?:py|yaml))", text)) - {"conf/env/<name>.yaml"}
    assert paths and [p for p in paths if not (ROOT / p).exists()] == []
    tests = (ROOT / "tests" / "test_episodes.py").read_text()
    cited = re.findall(r"`(test_\w+)`", text)
    assert cited and [t for t in cited if f"def {t}(" not in tests] == []
    options = {p.stem for p in (ROOT / "conf" / "env").glob("*.yaml")} - {"none"}
    assert options and [o for o in options if f"env={o}" not in text] == []
