"""One exception class per error kind, one exit code per class.

Library code raises these; only the CLI turns them into a message and an exit code.
Outcomes of workloads are data, never exceptions: these are for "could not do the job".
"""
from __future__ import annotations

from pathlib import Path


class PatchkitError(Exception):
    """Base class. `exit_code` is the process exit code the CLI uses."""

    exit_code = 10
    kind = "error"

    def __init__(self, message: str, *, hint: str = "", log: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.log = log

    def render(self) -> str:
        text = f"patchkit: {self.kind}: {self.message}"
        if self.hint:
            text += f" {self.hint}"
        if self.log:
            text += f" Full log: {self.log}"
        return text


# exit 1 is reserved for "verify ran and an expectation failed" (not an exception)


class UsageError(PatchkitError):
    """Bad input from the user: arguments, workload files, pr-set files, URLs."""

    exit_code = 2
    kind = "bad input"


class RepoError(PatchkitError):
    """The repository cannot be used as asked: not a repo, dirty, detached, unknown ref."""

    exit_code = 3
    kind = "repository"


class LayoutError(PatchkitError):
    """The source does not match any layout the patch knows (anchors missing)."""

    exit_code = 4
    kind = "unknown layout"


class PatchError(PatchkitError):
    """The patch cannot be applied: partially applied, parse errors, conflicts."""

    exit_code = 5
    kind = "patch"


class BuildError(PatchkitError):
    """CMake configure or compile failed."""

    exit_code = 6
    kind = "build failed"

    def output(self) -> str:
        """The build's whole log when it kept one (a compiler's every error), else the message."""
        if self.log:
            return Path(self.log).read_text(errors="replace")
        return str(self)


class ServerError(PatchkitError):
    """llama-server could not be started or died before it was ready."""

    exit_code = 7
    kind = "server"


class EnvironmentProblem(PatchkitError):
    """A prerequisite is missing: cmake, ninja, a compiler, pip, network to PyPI."""

    exit_code = 8
    kind = "environment"


class ReportError(PatchkitError):
    """pin: the report is missing, failing, or for another commit."""

    exit_code = 9
    kind = "report"


class Interrupted(PatchkitError):
    exit_code = 130
    kind = "interrupted"


# verify ran, nothing failed, but a designed shape was not reached or evidence was missing
INCONCLUSIVE = 11

EXIT_CODES = {
    0: "success (verify: every expectation held on evidence, every declared shape reached; apply: applied or "
       "already applied)",
    1: "verify ran and at least one expectation failed: evidence against the candidate, quoted in the report",
    INCONCLUSIVE: "verify ran and nothing failed, but a shape was not reached or evidence was missing (the report "
                  "says which, and what to do: more repeats, a quieter machine, or a reworded upstream log)",
    UsageError.exit_code: UsageError.__doc__,
    RepoError.exit_code: RepoError.__doc__,
    LayoutError.exit_code: LayoutError.__doc__,
    PatchError.exit_code: PatchError.__doc__,
    BuildError.exit_code: BuildError.__doc__,
    ServerError.exit_code: ServerError.__doc__,
    EnvironmentProblem.exit_code: EnvironmentProblem.__doc__,
    ReportError.exit_code: ReportError.__doc__,
    PatchkitError.exit_code: "unexpected internal error",
    Interrupted.exit_code: "interrupted (Ctrl-C); children stopped, tree untouched",
}
