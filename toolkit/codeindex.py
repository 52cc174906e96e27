"""Read-only questions about C++ sources: compile_commands.json + libclang.

`load_database` normalises compile_commands.json entries (both `command` and `arguments`
shapes) into typed records. `parse` parses one translation unit with that entry's exact
flags (plus GCC's builtin include dir: the libclang wheel ships no resource headers) and
requires zero errors. The helpers below walk only the main file's declarations: walking
every included header costs seconds and finds nothing we anchor on.
"""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import proc
from .errors import EnvironmentProblem, PatchError


@dataclass(frozen=True)
class CompileCommand:
    file: Path
    directory: Path
    argv: tuple[str, ...]

    def output(self) -> str | None:
        a = list(self.argv)
        return a[a.index("-o") + 1] if "-o" in a else None


def load_database(path: Path) -> list[CompileCommand]:
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PatchError(f"cannot read {path}: {e}.")
    out = []
    for e in entries:
        argv = tuple(e["arguments"]) if "arguments" in e else tuple(shlex.split(e["command"]))
        d = Path(e["directory"])
        f = Path(e["file"])
        out.append(CompileCommand((f if f.is_absolute() else d / f).resolve(), d, argv))
    return out


def command_for(db: list[CompileCommand], file: Path) -> CompileCommand:
    file = Path(file).resolve()
    for c in db:
        if c.file == file:
            return c
    raise PatchError(f"{file} has no entry in compile_commands.json (stale database?).",
                     hint="Delete the build dir or re-run `patchkit build` to re-configure.")


@lru_cache(maxsize=1)
def gcc_include() -> str:
    return proc.run(["gcc", "-print-file-name=include"], timeout=30, error=EnvironmentProblem).out.strip()


def clang_args(cmd: CompileCommand) -> list[str]:
    """The entry's flags minus compiler, -c/-o and the source; clang-incompatible ones dropped."""
    args, skip = [], False
    argv = list(cmd.argv)
    # ccache launchers put the real compiler second
    start = 2 if Path(argv[0]).name == "ccache" else 1
    for a in argv[start:]:
        if skip:
            skip = False
            continue
        if a in ("-o", "-c", "-MF", "-MT", "-MQ"):
            skip = a != "-c"
            continue
        if a in ("-MD", "-MMD") or Path(a).name == cmd.file.name:
            continue
        if a.startswith("-march=") or a.startswith("-mtune="):
            continue  # libclang only needs to parse, not to pick instructions
        args.append(a)
    return ["-x", "c++", *args, "-isystem", gcc_include(), "-Wno-unknown-warning-option"]


@dataclass(frozen=True)
class Diagnostic:
    severity: str
    location: str
    text: str


def parse(cmd: CompileCommand, unsaved: str | None = None):
    """Parse with libclang; raise PatchError listing errors if there are any."""
    try:
        from clang import cindex
    except ImportError as e:
        raise EnvironmentProblem(f"libclang is not installed ({e}); `pip install libclang`.")
    index = cindex.Index.create()
    files = [(str(cmd.file), unsaved)] if unsaved is not None else None
    # function bodies are parsed: they are what the anchors are
    tu = index.parse(str(cmd.file), args=clang_args(cmd), unsaved_files=files)
    errors = [d for d in tu.diagnostics if d.severity >= cindex.Diagnostic.Error]
    if errors:
        shown = "; ".join(f"{d.location.file}:{d.location.line}: {d.spelling}" for d in errors[:5])
        raise PatchError(f"libclang found {len(errors)} error(s) parsing {cmd.file.name}: {shown}",
                         hint="The tree does not compile with its own flags, or the build dir is stale.")
    return tu
