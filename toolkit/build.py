"""Build `llama-server` from a commit of any repository, with CMake + Ninja.

The user's checkout is never built in place and never touched. Each (repository, flags)
pair gets a workspace in the cache:

    work/<key>/src     a private work tree, filled from the commit with a private index
                       (`git read-tree -u` only rewrites files that differ, so switching
                       base -> candidate makes Ninja recompile only the changed TUs)
    work/<key>/build   the CMake build dir, compile_commands.json exported
    work/<key>/build.log

The private work tree is not a registered `git worktree`: nothing is added to the user's
.git except objects. Finished binaries are stored by tree content + flags in bins/, so a
build of content that was built before (any branch, any repo) is instant.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import git

from . import cache, codeindex, proc
from .errors import BuildError, UsageError
from .source import resolve
from .ui import heartbeat, log_progress

# docs/DESIGN.md, section 8: offline flags that work on every layout.
OFFLINE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
    "-DBUILD_SHARED_LIBS=OFF",
)
# The optimisation levels (docs/DESIGN.md, section 8): ggml, the tensor kernels, at the tree's own
# Release flags (-O3: a real model's matmuls, whose portable fallbacks are auto-vectorised), and every
# other TU -- llama, common, mtmd, the server and its vendored headers -- at -O1. Those TUs are most of
# a cold run's compile time: the patched server-context.cpp alone compiles once per candidate, variant
# schema and mutant schema (31 times in a cold CI run; 15.1 s at -O3, 10.2 s at -O1, measured), and
# upstream's header-heavy TUs take 40 % less at -O1. Measured on C2 with the witness: the laboratory
# runs and a 40-turn chat cost the server the same CPU this way as at -O3 (-O1 for ggml too: 1.4x).
# Set per CMake project: ggml's own project() includes GGML_RELEASE, so compile_commands.json holds
# the flags each TU is really compiled with.
OPT_FLAGS = ("-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG", "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG")
GGML_RELEASE = ("# patchkit: ggml's kernels at CMake's own Release flags (toolkit/build.py, OPT_FLAGS)\n"
                'set(CMAKE_C_FLAGS_RELEASE "-O3 -DNDEBUG")\nset(CMAKE_CXX_FLAGS_RELEASE "-O3 -DNDEBUG")\n')
SANITIZERS = {"address": "-DLLAMA_SANITIZE_ADDRESS=ON", "undefined": "-DLLAMA_SANITIZE_UNDEFINED=ON",
              "thread": "-DLLAMA_SANITIZE_THREAD=ON"}
TARGET = "llama-server"
PROGRESS = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)$")
COMPILER_ERROR = re.compile(r"(error:|fatal error:|undefined reference to|Error \d)")


# The memory a server patch frees cells in: instrumented beside the patched TUs in a scoped
# sanitizer build (export --sanitize, the real tier's sanitizer test).
KV_CACHE_SOURCES = ("src/llama-kv-cache.cpp", "src/llama-batch.cpp")
# The sanitizers' compile flags, as the tree's own LLAMA_SANITIZE_* options add them.
SANITIZER_FLAGS = {"address": "-fsanitize=address -fno-omit-frame-pointer", "undefined": "-fsanitize=undefined",
                   "thread": "-fsanitize=thread"}


@dataclass(frozen=True)
class Options:
    sanitize: tuple[str, ...] = ()
    # Instrument only the sources matching these repo-relative globs (e.g. "tools/server/*"):
    # every other TU compiles with the plain build's exact command, so ccache serves it from the
    # plain build of the same tree. Empty: the tree's own options (llama, common and the server).
    sanitize_only: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()  # more -D flags (e.g. examples ON for ik_llama.cpp)
    jobs: int = 0  # 0: ninja's default
    workdir: Path | None = None  # --build-dir: the workspace root (src/, build/) instead of the cache

    def cmake_flags(self) -> tuple[str, ...]:
        flags = list(OFFLINE_FLAGS)
        for s in self.sanitize:
            if s not in SANITIZERS:
                raise UsageError(f"unknown sanitizer '{s}'; choose from: {', '.join(SANITIZERS)}.")
        if self.sanitize and self.sanitize_only:
            if "thread" in self.sanitize:
                raise UsageError("ThreadSanitizer needs every TU instrumented (a race seen from one side only "
                                 "is not reported): drop --sanitize-only for thread.")
            launcher = scoped_launcher(self.sanitize, self.sanitize_only)
            link = " ".join(SANITIZER_FLAGS[s].split()[0] for s in self.sanitize)
            return tuple(flags) + plain_opt_flags() + (
                f"-DCMAKE_C_COMPILER_LAUNCHER={launcher}", f"-DCMAKE_CXX_COMPILER_LAUNCHER={launcher}",
                f"-DCMAKE_EXE_LINKER_FLAGS={link}") + tuple(self.extra)
        flags += [SANITIZERS[s] for s in self.sanitize]
        # a tree-wide sanitizer build: every TU at -O1, ggml too, as the sanitizers' own docs advise:
        # every check kept, and a cold sanitized build on 2 cores at -O3 had reached step 249/315
        # after 24 min (measured), the longest step of a cold CI run
        flags += OPT_FLAGS if self.sanitize else plain_opt_flags()
        if shutil.which("ccache"):
            flags += ["-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
        return tuple(flags) + tuple(self.extra)

    def key(self) -> str:
        return cache.digest(self.cmake_flags(), n=10)


def plain_opt_flags() -> tuple[str, ...]:
    """OPT_FLAGS, and ggml's project at -O3 (GGML_RELEASE, written once into the cache: its path is
    part of the flags, so of the workspace's and the binary's key)."""
    return OPT_FLAGS + (f"-DCMAKE_PROJECT_ggml_INCLUDE={_flag_file('ggml-release', '.cmake', GGML_RELEASE)}",)


def _flag_file(prefix: str, suffix: str, text: str, mode: int | None = None) -> Path:
    """A file the build flags name (a launcher, a CMake include), named by its content under the
    cache's launchers/ and written back when missing or changed (pruned, edited)."""
    path = cache.sub("launchers") / f"{prefix}-{cache.digest(text)}{suffix}"
    if not path.exists() or path.read_text() != text:
        cache.write_atomic(path, text, mode=mode)
    return path


def scoped_launcher(sanitize: tuple[str, ...], only: tuple[str, ...]) -> Path:
    """A compiler launcher (a POSIX sh script, named by its content) that adds the sanitizers'
    flags, at -O1, to the TUs whose source matches `only`, then runs ccache (when installed).
    A scoped sanitizer build exists for its cost: the tree's own options instrument llama,
    common and the whole server, ~20 min cold on 2 cores; a patch's memory errors are in the
    TUs it changes, and ASan/UBSan instrument per TU (uninstrumented code still allocates
    through the intercepted malloc, so an overflow of any heap block by instrumented code is
    caught). Not for ThreadSanitizer, which needs every TU: refused in Options."""
    extra = " ".join(SANITIZER_FLAGS[s] for s in sanitize) + " -O1"
    # the work tree is always <workspace>/src, so a repo-relative glob is */src/<glob>
    cases = "|".join(f"*/src/{g}" for g in only)
    run = 'exec ccache "$@"' if shutil.which("ccache") else 'exec "$@"'
    text = (f"#!/bin/sh\n# patchkit's scoped sanitizer launcher: {' '.join(only)}\n"
            'src=""; prev=""\n'
            'for a in "$@"; do [ "$prev" = "-c" ] && src=$a; prev=$a; done\n'
            f'case "$src" in {cases}) set -- "$@" {extra} ;; esac\n'
            f"{run}\n")
    return _flag_file("sanitize", ".sh", text, mode=0o755)


@dataclass(frozen=True)
class Workspace:
    """A configured (repository, flags) pair; `src` holds `commit`."""
    root: Path
    src: Path
    build: Path
    log: Path
    commit: str
    tree: str

    @property
    def compile_commands(self) -> Path:
        return self.build / "compile_commands.json"

    def compile_command(self, rel: str) -> codeindex.CompileCommand:
        """How CMake compiles `rel` (repo-relative) here; PatchError when the database lacks it."""
        return codeindex.command_for(codeindex.load_database(self.compile_commands), self.src / rel)


@dataclass(frozen=True)
class Built:
    binary: Path
    commit: str
    tree: str
    workspace: Workspace
    seconds: float
    reused: bool
    steps: int = 0  # ninja edges run (0 when reused)


ProgressFn = Callable[[str], None]



def compiler_argv(argv: list[str] | tuple[str, ...]) -> list[str]:
    """A compile command as the build runs it: through ccache when installed. CMake's
    compile_commands.json names the compiler, not the launcher the build put in front of it; a
    command that already starts with ccache keeps it once."""
    argv = list(argv[1:] if argv and Path(argv[0]).name == "ccache" else argv)
    return ["ccache", *argv] if shutil.which("ccache") else argv


def _env(ws_root: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("CCACHE_DIR", str(cache.sub("ccache")))
    # paths under the workspace hash as relative ones: other workspaces hit the same entries
    env["CCACHE_BASEDIR"] = str(ws_root)
    env["CCACHE_NOHASHDIR"] = "1"
    # depend mode: on a miss, no separate preprocessor run (the compiler's -MD output lists the
    # headers). Measured on a cold cache: +1% over a plain compile, against +12% in the default
    # mode, which made a cold build ~12 s slower than the same build without ccache.
    env.setdefault("CCACHE_DEPEND", "1")
    env.setdefault("CCACHE_MAXSIZE", "5G")
    return env


def workspace_root(repo: git.Repo, opts: Options) -> Path:
    """One workspace per HISTORY (its root commit) and flags, not per clone: every clone of a tree
    builds in the same work tree, so a tree content built from one clone is an incremental (or no)
    rebuild from the next (measured before: 874 s, a full ccache-served build, for a second clone).
    A repository without commits reachable from HEAD falls back to its path."""
    if opts.workdir:
        return Path(opts.workdir).resolve()
    try:
        history = min(repo.git.rev_list("--max-parents=0", "HEAD").split())
    except (git.GitCommandError, ValueError):
        history = str(Path(repo.git_dir).resolve())
    return cache.root() / "work" / f"{cache.digest(history)}-{opts.key()}"


def adapt(repo: git.Repo, commit: str, opts: Options) -> Options:
    """Per-tree flags: trees whose server lives under examples/ (older llama.cpp, ik_llama.cpp)
    only configure it with examples ON."""
    if not repo.git.ls_tree(commit, "tools/server") and repo.git.ls_tree(commit, "examples/server"):
        return replace(opts, extra=opts.extra + ("-DLLAMA_BUILD_EXAMPLES=ON",))
    return opts


@contextmanager
def held(repo: git.Repo, commit: str, opts: Options = Options(), progress: ProgressFn = log_progress,
         reconfigure: bool = False):
    """The private work tree filled with `commit` and configured, HELD until the block ends: a
    reader of its files (the libclang parse, a TU compile) must hold it, or another patchkit
    process (a second verify, a build beside) can switch it to another commit underneath
    (measured: a parse that saw the patched file's bytes with the base's AST). `reconfigure`
    re-runs CMake even if it ran before (a stale compile_commands.json)."""
    opts = adapt(repo, commit, opts)
    root = workspace_root(repo, opts)
    with cache.locked(root.with_suffix(".lock")):
        yield _checkout(repo, root, commit, opts, progress, reconfigure)


def checkout(repo: git.Repo, commit: str, opts: Options = Options(),
             progress: ProgressFn = log_progress, reconfigure: bool = False) -> Workspace:
    """Fill and configure the work tree, and let go of it: for paths only, never to read files."""
    with held(repo, commit, opts, progress, reconfigure) as ws:
        return ws


def _checkout(repo: git.Repo, root: Path, commit: str, opts: Options, progress: ProgressFn,
              reconfigure: bool = False) -> Workspace:
    src, build, logp, index = root / "src", root / "build", root / "build.log", root / "index"
    src.mkdir(parents=True, exist_ok=True)
    tree = repo.git.rev_parse(f"{commit}^{{tree}}")
    genv = dict(os.environ, GIT_INDEX_FILE=str(index))
    gitargs = ["git", f"--git-dir={repo.git_dir}", f"--work-tree={src}"]
    proc.run(gitargs + ["read-tree", "-u", "--reset", commit], env=genv, error=BuildError,
             what="filling the build work tree", timeout=300)
    (root / "COMMIT").write_text(commit + "\n")
    ws = Workspace(root, src, build, logp, commit, tree)
    flags = opts.cmake_flags()
    stamp = root / "configured-flags.json"
    if (reconfigure or not (build / "build.ninja").exists() or not (build / "compile_commands.json").exists()
            or not stamp.exists() or json.loads(stamp.read_text()) != list(flags)):
        progress("configuring with CMake")
        lines = CMakeLines()
        res = proc.stream(["cmake", "-S", src, "-B", build, "-G", "Ninja", *flags],
                          log_path=logp, env=_env(root), timeout=900,
                          on_line=lambda line: [progress("  " + shown) for shown in lines.feed(line)])
        if res.rc != 0:
            raise BuildError(f"CMake configure failed (exit {res.rc}): {first_error(res.out)}", log=str(logp))
        _generate_headers(build, logp, root, progress)
        stamp.write_text(json.dumps(list(flags)))
    return ws


def _generate_headers(build: Path, logp: Path, root: Path, progress: ProgressFn = log_progress) -> None:
    """Build the headers CMake generates at build time (e.g. layout A's index.html.gz.hpp):
    parsing or compiling one TU from a configure-only tree needs them."""
    res = proc.run(["ninja", "-C", build, "-t", "targets", "all"], timeout=120, error=BuildError)
    # only the server's own (UI assets); anything else generated is not included by its TU
    headers = [line.split(":")[0] for line in res.out.splitlines()
               if re.match(r"^(tools|examples)/server/[^:]+\.(h|hpp)\s*:", line)]
    if headers:
        names = ", ".join(Path(h).name for h in headers)
        progress(f"generating the server's headers with Ninja ({names})")
        latest = ["starting"]

        def on_line(line: str) -> None:
            m = PROGRESS.match(line)
            if m:
                latest[0] = f"[{m.group(1)}/{m.group(2)}] {cut(m.group(3), 90)}"
                progress(latest[0])

        # Only each header's own command (`ninja -t commands -s`): asking Ninja for the header
        # builds its order-only dependencies too, i.e. ggml, llama and common (CMake orders a
        # target's custom commands after its link dependencies): 76 steps, 6-7 min cold for layout
        # A's two UI headers (measured, a clean-clone CI run), against a second without them.
        with heartbeat(progress, lambda: f"generating {names}, last: {latest[0]}"):
            for h in headers:
                cmd = proc.run(["ninja", "-C", build, "-t", "commands", "-s", h], timeout=60, error=BuildError).out
                for line in (x for x in cmd.splitlines() if x.strip()):
                    r = proc.stream(["sh", "-c", line], log_path=logp, on_line=on_line, env=_env(root), cwd=build,
                                    timeout=300)
                    if r.rc != 0:
                        raise BuildError(f"generating {Path(h).name} failed: {first_error(r.out)}", log=str(logp))


def cut(line: str, n: int = 160) -> str:
    """`line` whole when it has at most `n` characters, else its start and its end (a path's
    informative part) around an ellipsis."""
    line = line.strip()
    if len(line) <= n:
        return line
    keep = (n - 1) // 2
    return line[:keep] + "…" + line[len(line) - (n - 1 - keep):]


# The tree's own CMake asks git for the build number (`git rev-parse` in cmake/build-info.cmake,
# ggml's commit, common/CMakeLists.txt's warning). patchkit configures a private work tree
# without .git, so each probe fails: harmless, the build number is then unknown.
GIT_PROBE = re.compile(r"^(fatal: not a git repository|Git repository not found|Git not found)")
GIT_NOTE = ("note: the tree's version probe found no git repository (patchkit builds a private work tree "
            "without .git): harmless, the build number is unknown")


class CMakeLines:
    """CMake's configure output as progress lines ("cmake: ..."): blank lines dropped, long lines
    cut with an ellipsis, the git probe's failures (two `fatal:` lines and a multi-line
    `CMake Warning`) replaced by ONE plain note ("note: ...")."""

    def __init__(self) -> None:
        self.noted = False
        self.held: str | None = None     # a "CMake Warning at ..." header, until its first line says what
        self.skipping = False            # inside the git warning's indented body

    def _note(self) -> list[str]:
        if self.noted:
            return []
        self.noted = True
        return [GIT_NOTE]

    def feed(self, line: str) -> list[str]:
        text = line.strip()
        if self.skipping:
            if line.startswith(" ") and text:
                return []
            self.skipping = False
        if not text:
            return []
        held, self.held = self.held, None
        if GIT_PROBE.match(text):
            self.skipping = held is not None  # the warning's body continues on indented lines
            return self._note()
        shown = ["cmake: " + cut(held)] if held else []
        if text.startswith("CMake Warning"):
            self.held = text
            return shown
        return shown + ["cmake: " + cut(text)]


def first_error(output: str) -> str:
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if COMPILER_ERROR.search(line) and not line.startswith("ninja: build stopped"):
            return line.strip()
    for line in lines:
        if line.startswith("FAILED:") or "CMake Error" in line:
            return line.strip()
    return (lines[-1].strip() if lines else "no output")


def binary_store(tree: str, opts: Options) -> Path:
    return cache.root() / "bins" / f"{tree[:16]}-{opts.key()}"


def build(repo: git.Repo, ref: str | None = None, opts: Options = Options(),
          progress: ProgressFn = log_progress, in_workspace: bool = False) -> Built:
    """`in_workspace`: build even if the binary store has this tree, so the workspace's own
    build dir (its static libraries) is complete: the property harness links against them."""
    commit = resolve(repo, ref)
    opts = adapt(repo, commit, opts)
    tree = repo.git.rev_parse(f"{commit}^{{tree}}")
    store = binary_store(tree, opts)
    root = workspace_root(repo, opts)

    def stored() -> Built | None:
        if (store / TARGET).exists() and not in_workspace:
            cache.touch(store)
            return Built(store / TARGET, commit, tree, Workspace(root, root / "src", root / "build", root / "build.log",
                                                                 commit, tree), 0.0, reused=True)
        return None
    # a stored binary needs no workspace: not waiting for its lock, which another process may
    # hold for minutes while it compiles another tree there
    if built := stored():
        return built
    with cache.locked(root.with_suffix(".lock")):
        start = time.monotonic()
        if built := stored():
            return built
        ws = _checkout(repo, root, commit, opts, progress)
        argv = ["ninja", "-C", ws.build, TARGET]
        if opts.jobs:
            argv[1:1] = ["-j", str(opts.jobs)]
        steps = 0

        latest = ["starting"]

        def on_line(line: str) -> None:
            nonlocal steps
            m = PROGRESS.match(line)
            if m:
                steps = int(m.group(1))
                latest[0] = f"[{m.group(1)}/{m.group(2)}] {cut(m.group(3), 90)}"
                progress(latest[0])

        progress(f"building {TARGET} at {commit[:12]} (log: {ws.log})")
        # one sanitizer TU can compile for minutes without a Ninja line: say so every 20 s
        with heartbeat(progress, lambda: f"building, last: {latest[0]}"):
            res = proc.stream(argv, log_path=ws.log, on_line=on_line, env=_env(root), timeout=3600)
        if res.rc != 0:
            raise BuildError(f"{TARGET} did not build at {commit[:12]}: {first_error(res.out)}", log=str(ws.log))
        out = ws.build / "bin" / TARGET
        if not out.exists():
            raise BuildError(f"ninja succeeded but {out} is missing.", log=str(ws.log))
        store.mkdir(parents=True, exist_ok=True)
        tmp = store / f".{TARGET}.tmp"
        shutil.copy2(out, tmp)
        os.replace(tmp, store / TARGET)
        (store / "commit").write_text(commit + "\n")
        cache.touch(root)
        built = Built(store / TARGET, commit, tree, ws, time.monotonic() - start, reused=False, steps=steps)
    # a new build grew the cache: keep it under its cap (PATCHKIT_CACHE_MAX_GB), least recently used first
    for path, size in cache.prune():
        progress(f"cache over {cache.max_bytes() / 1e9:.0f} GB: removed {path.name} ({size / 1e6:.0f} MB, least recently used)")
    return built
