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
