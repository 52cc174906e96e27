"""The CLI surface: help that teaches, distinct exit codes. No processes."""
import pytest
from click.testing import CliRunner

from toolkit import errors
from toolkit.cli import cli


@pytest.mark.parametrize("cmd", [[], ["source", "fetch"], ["model"], ["build"], ["apply"], ["check"], ["verify"],
                                 ["demo"], ["pin"], ["repro"], ["ci"]])
def test_help_has_an_example(cmd):
    res = CliRunner().invoke(cli, cmd + ["--help"])
    assert res.exit_code == 0, res.output
    if cmd and cmd != ["source", "fetch"] and cmd != ["model"]:
        assert "patchkit " in res.output.split("Options:")[0]


def test_exit_codes_are_distinct():
    classes = [errors.UsageError, errors.RepoError, errors.LayoutError, errors.PatchError, errors.BuildError,
               errors.ServerError, errors.EnvironmentProblem, errors.ReportError, errors.Interrupted]
    codes = [c.exit_code for c in classes]
    assert len(set(codes)) == len(codes)
    assert not {0, 1} & set(codes)
    res = CliRunner().invoke(cli, ["exit-codes"])
    for c in codes:
        assert f"{c:4d}" in res.output
