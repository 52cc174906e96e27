"""Every option of every command is passed by some test (issue 25): a feature no test runs is
broken until one does. The click command tree is walked; a test function exercises `CMD --opt`
when its string constants name every word of the command and the option (as the argument lists
of `patchkit(...)` calls and CliRunner invocations spell them). An option no test passes fails
this test, unless ALLOWED names it with the reason.

`python -m tests.fast.test_option_coverage` prints the table: each option and its tests."""
from __future__ import annotations

import ast
from pathlib import Path

import click

from toolkit.cli import cli

TESTS = Path(__file__).resolve().parents[1]

# (command, option) -> why no test passes it. Keep this short; each entry is a debt.
ALLOWED = {
    ("verify", "--sanitize"): "the same build Options as `build --sanitize` (tests/real/test_verify.py::"
                              "test_sanitizer_build_runs_overflow_workloads_clean, through the CLI); a sanitized "
                              "base side costs one more scoped ASan build (~2 min of CI's 60)",
    ("verify", "--sanitize-only"): "as verify --sanitize",
    ("export", "--sanitize"): "runs verify's sanitized suite on the series (as verify --sanitize); same cost",
}


def commands(group: click.Group = cli, path: tuple[str, ...] = ()):
    yield path, group
    for name, cmd in group.commands.items():
        if isinstance(cmd, click.Group):
            yield from commands(cmd, path + (name,))
        else:
            yield path + (name,), cmd


def options() -> list[tuple[tuple[str, ...], str, tuple[str, ...]]]:
    """(command path, the option's first flag, all its flags) for every option of every command."""
    return [(path, p.opts[0], tuple(p.opts + p.secondary_opts)) for path, cmd in commands()
            for p in cmd.params if isinstance(p, click.Option)]


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _test_functions() -> dict[str, set[str]]:
    """'file::function' -> the string constants in that test's body, and in the bodies of the
    conftest helpers it calls (a helper that runs the user's command for several tests, e.g.
    `sanitized_build`, passes its options for each test that calls it, and for no other)."""
    helpers = {node.name: _strings(node) for f in TESTS.rglob("conftest.py")
               for node in ast.walk(ast.parse(f.read_text())) if isinstance(node, ast.FunctionDef)}
    out = {}
    for f in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                called = {c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
                out[f"{f.relative_to(TESTS)}::{node.name}"] = _strings(node).union(
                    *(helpers[name] for name in called & helpers.keys()))
    return out


def exercised_by(path: tuple[str, ...], flags: tuple[str, ...], tests: dict[str, set[str]]) -> list[str]:
    def passes(strings: set[str]) -> bool:
        return any(f in strings or any(s.startswith(f + "=") for s in strings) for f in flags)
    return [t for t, strings in tests.items() if all(w in strings for w in path) and passes(strings)]


def table() -> list[tuple[str, str, list[str]]]:
    tests = _test_functions()
    return [(" ".join(("patchkit",) + path), first, exercised_by(path, flags, tests))
            for path, first, flags in options()]


def test_every_option_of_every_command_is_passed_by_a_test():
    missing = [f"{cmd} {opt}" for cmd, opt, hits in table()
               if not hits and (tuple(cmd.split()[1:]) if cmd != "patchkit" else (), opt) not in
               {(tuple(k[0].split()), k[1]) for k in ALLOWED}]
    assert not missing, "options no test passes (add a test, or an ALLOWED entry with its reason): " + ", ".join(missing)


def test_the_allow_list_holds_no_stale_entry():
    """An allowed option that a test now passes, or that no longer exists, leaves the list."""
    rows = {(tuple(cmd.split()[1:]), opt): hits for cmd, opt, hits in table()}
    for (cmd, opt), why in ALLOWED.items():
        key = (tuple(cmd.split()), opt)
        assert key in rows, f"{cmd} {opt} is not an option any more"
        assert not rows[key], f"{cmd} {opt} is passed by {rows[key][0]}: drop it from ALLOWED"
        assert why


def test_the_matcher_can_fail():
    """The matcher does not credit an option to a test that names it for another command."""
    tests = {"a::t": {"verify", "--json"}, "b::t": {"repro", "--patch-file"}}
    assert exercised_by(("verify",), ("--json",), tests) == ["a::t"]
    assert exercised_by(("verify",), ("--patch-file",), tests) == []
    assert exercised_by(("report", "merge"), ("--json",), {"c::t": {"merge", "--json"}}) == []


if __name__ == "__main__":
    for cmd, opt, hits in table():
        print(f"| `{cmd} {opt}` | {', '.join(f'`{h}`' for h in hits[:2]) or 'ALLOWED: ' + ALLOWED.get((' '.join(cmd.split()[1:]), opt), '-')} |")
