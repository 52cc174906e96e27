"""The docs tell the truth about the command surface (issue 25): docs/commands.md has a section
for exactly the commands `patchkit --help` lists, the README is a quick start, and every file it
links exists."""
import re
from pathlib import Path

import click
from click.testing import CliRunner

from toolkit.cli import cli

ROOT = Path(__file__).resolve().parents[2]


def leaf_commands(group: click.Group = cli, path=()) -> set[str]:
    out = set()
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            out |= leaf_commands(cmd, path + (name,))
        else:
            out.add(" ".join(path + (name,)))
    return out


def documented() -> set[str]:
    text = (ROOT / "docs" / "commands.md").read_text()
    return set(re.findall(r"^## `patchkit ([a-z -]+?)`", text, re.M))


def test_docs_and_help_list_the_same_commands():
    assert documented() == leaf_commands(), (documented() ^ leaf_commands())
    # and `patchkit --help` (what a user reads first) lists every top-level one
    help_text = CliRunner().invoke(cli, ["--help"]).output
    listed = set(re.findall(r"^  ([a-z-]+)  ", help_text.split("Commands:")[1], re.M))
    assert listed == {c.split()[0] for c in leaf_commands()}, listed


def test_readme_is_a_quick_start_whose_links_exist():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "bash ci/run.sh demo" in text and "bash ci/run.sh test" in text
    links = re.findall(r"\]\(([^)#]+)\)", text)
    assert links and all((ROOT / link).exists() for link in links), [x for x in links if not (ROOT / x).exists()]
    # every docs/ page is linked from the README
    assert {p.name for p in (ROOT / "docs").glob("*.md")} == {Path(x).name for x in links if x.startswith("docs/")}


def test_ci_runs_exactly_the_readme_test_command():
    assert "exec bash ci/run.sh test" in (ROOT / ".ci" / "run").read_text()
