"""llama.cpp's own server tests (tools/server/tests), run offline against two binaries.

The stage: export the candidate's tests (never edited, never run in the user's tree), prepare the
suite's own venv (its requirements.txt, cached by the file's hash), map every model preset to a
local model of the same kind, run pytest serially with --junitxml against the base binary and the
candidate binary (env LLAMA_SERVER_BIN_PATH), and compare the pass sets:

    passes before, fails after          regression (named, with the failure message)
    fails on both sides                 not judged
    fails before, passes after          gained
    skipped (no local model, slow ...)  not run, with the reason
    passes on every base run, fails on
      some candidate run (--repeat N)   an intermittent regression (the failing runs named)
    flips between base runs             flaky (--repeat N), never blamed

Why a pytest plugin and not a filled LLAMA_CACHE: both C2 and D read a Hugging Face cache layout
(common/hf-cache.cpp: models--ORG--REPO/refs, snapshots/COMMIT/FILE), but which file a preset
gets offline is decided by the tree's own downloader (a repo named without a file,
`ggml-org/test-model-stories260K`, or by a quant tag, `tinygemma3-GGUF:Q8_0`; common/download.cpp
differs by ~100 lines between C2 and D, and hf-cache.cpp's environment lookup changed): code that
is part of what is under test, so a candidate touching it would change what the tests serve. The
plugin depends only on the tests' Python API (`ServerPreset.<preset>()` returning a
`ServerProcess` whose `model_hf_repo` / `model_file` / `start()` it adjusts), identical in C2 and
D (their utils.py differ in port/host handling, two speculative options and one preset's
n_batch). It also tells "not run, because" (no stand-in) from "failed on both sides" per test, which
a faked cache cannot (a missing model fails the test), and the ports, loopback binding, per-test
timeout and leftover check need a plugin anyway.

Subprocesses only through `proc`; the suite's servers are children of pytest (same process
group); each carries the run's marker PATCHKIT_UPSTREAM_RUN in its environment, so leftovers are
found (after each test by the plugin, after the run here), counted and killed.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import git

from . import build as build_mod
from . import cache, proc
from . import model as model_mod
from .errors import EnvironmentProblem, RepoError, UsageError
from .ui import log_progress

TESTS_DIR = "tools/server/tests"
# what the tests read outside their own directory ("../../../models/templates/X.jinja")
EXPORT = (TESTS_DIR, "models/templates")
PLUGIN = "toolkit_upstream_plugin"
NOT_RUN = "patchkit: not run: "
DEFAULT_TIMEOUT = 120        # per test phase (setup, call, teardown), seconds
SIDE_TIMEOUT = 4 * 3600      # backstop for one whole pytest run

# A named subset for CI, ~30 s per side on the tiny model (C2, measured: every test below passes on
# the tiny model except two of test_tokenize, which fail on both sides): server start and the plain
# endpoints, tokenize/detokenize, and completions whose assertions do not depend on the model's
# prose, chosen near what a slot/KV patch touches: parallel slots, the unified KV cache, cancel.
SUBSETS: dict[str, tuple[str, ...]] = {
    "all": (),   # the whole suite (every offline-runnable test; the others are listed as not run)
    "ci": (
        "unit/test_tokenize.py",
        "unit/test_basic.py::test_server_start_simple",
        "unit/test_basic.py::test_server_props",
        "unit/test_basic.py::test_server_models",
        "unit/test_basic.py::test_server_slots",
        "unit/test_basic.py::test_server_model_aliases_and_tags",
        "unit/test_completion.py::test_completion_stream_vs_non_stream",
        "unit/test_completion.py::test_consistent_result_same_seed",
        "unit/test_completion.py::test_completion_with_tokens_input",
        "unit/test_completion.py::test_completion_parallel_slots",
        "unit/test_completion.py::test_completion_unified",
        "unit/test_completion.py::test_cancel_request",
        "unit/test_ctx_shift.py::test_ctx_shift_disabled_stream",
        "unit/test_metrics.py::test_metrics_slots_idle_after_completion",
    ),
}

# ------------------------------------------------------------------ presets and their stand-ins

# The draft model test_speculative downloads: replaced by the tiny model's draft twin (same vocabulary).
DRAFT_FILE = "stories15M-q4_0.gguf"


@dataclass(frozen=True)
class Preset:
    name: str
    kind: str                 # what the upstream preset serves
    upstream: str             # its Hugging Face model
    model: str | None = None  # our local stand-in (a path), None: no model needed or not run
    standin: str = ""         # the stand-in's name
    not_run: str = ""         # why tests on this preset are not run


def presets(text_model: str = "tiny", progress: Callable[[str], None] = log_progress
            ) -> tuple[tuple[Preset, ...], dict[str, str]]:
    """Every preset the suites of C2 and D define, with its local stand-in or the reason it has
    none; and the downloaded files (by name) that map to local files."""
    text = model_mod.resolve(text_model, progress)
    urls: dict[str, str] = {}
    if text_model == "tiny":
        urls[DRAFT_FILE] = str(model_mod.ensure(model_mod.DRAFT).path)
    t = str(text.path)
    tl = f"{text_model} ({text.path.name})"
    out = (
        Preset("tinyllama2", "text, llama (stories260K)", "ggml-org/test-model-stories260K", t, tl),
        Preset("stories15m_moe", "text, llama MoE (stories15M); draft stories15M-q4_0 for speculative",
               "ggml-org/stories15M_MOE", t, tl + (", draft: tiny-draft" if urls else ", no draft of its vocabulary")),
        Preset("router", "router (no model of its own)", "-", None, "none needed"),
        Preset("bert_bge_small", "embedding (BERT)", "ggml-org/models bert-bge-small",
               not_run="embedding preset (BERT, pooled embeddings): patchkit has no local embedding model"),
        Preset("bert_bge_small_with_fa", "embedding (BERT), flash attention", "ggml-org/models bert-bge-small",
               not_run="embedding preset (BERT, pooled embeddings): patchkit has no local embedding model"),
        Preset("jina_reranker_tiny", "reranking (jina-reranker-v1-tiny)", "ggml-org/models jina-reranker",
               not_run="rerank preset: patchkit has no local reranking model (classification head)"),
        Preset("tinygemma3", "vision (gemma3 + mmproj)", "ggml-org/tinygemma3-GGUF:Q8_0",
               not_run="vision preset (tinygemma3 + its multimodal projector): no local mmproj"),
        Preset("tinyllama_infill", "infill (FIM tokens)", "ggml-org/test-model-stories260K-infill",
               not_run="infill preset: the local models' vocabularies have no FIM tokens"),
    )
    return out, urls


def plugin_config(preset_list: Sequence[Preset], urls: dict[str, str], *, timeout: int, leftovers: Path,
                  slow: bool = False) -> dict:
    conf: dict = {"presets": {}, "urls": dict(urls), "timeout": timeout, "leftovers": str(leftovers), "slow": slow}
    for p in preset_list:
        conf["presets"][p.name] = {"not_run": p.not_run} if p.not_run else ({"model": p.model} if p.model else {})
    return conf


# ------------------------------------------------------------------ results (plain data)

@dataclass(frozen=True)
class Outcome:
    """One test of one pytest run, from its junit record."""
    id: str            # unit.test_tokenize::test_tokenize_detokenize
    outcome: str       # passed | failed | error | skipped
    message: str = ""  # the failure message, or the skip reason
    seconds: float = 0.0


@dataclass(frozen=True)
class SideRun:
    side: str                    # base | candidate
    commit: str
    binary: str
    outcomes: tuple[Outcome, ...]
    seconds: float
    rc: int                      # pytest's exit code
    junit: str
    log: str
    leftovers: tuple[str, ...]   # llama-servers that outlived their test ("test: pids") or the run; killed
    strays: tuple[str, ...] = ()  # other processes of the run alive after pytest (the suite's helpers); killed

    def count(self, outcome: str) -> int:
        return sum(o.outcome == outcome for o in self.outcomes)


@dataclass(frozen=True)
class Regression:
    id: str
    message: str       # the candidate's failure message


@dataclass(frozen=True)
class Comparison:
    run: tuple[str, ...]                      # ran (not skipped) on both sides
    passed_before: tuple[str, ...]
    passed_after: tuple[str, ...]
    regressions: tuple[Regression, ...]
    gained: tuple[str, ...]
    not_judged: tuple[tuple[str, str], ...]   # (id, why): failed on both sides, or absent from a run
    not_run: tuple[tuple[str, str], ...]      # (id, reason)
    flaky: tuple[tuple[str, str], ...]        # (id, the outcomes per run on the side that flipped)

    @property
    def ok(self) -> bool:
        return not self.regressions


@dataclass(frozen=True)
class Result:
    repo: str
    base: str
    candidate: str
    candidate_label: str
    tests_from: str                     # the commit the test files were exported from
    selection: tuple[str, ...]          # what pytest was given (subsets expanded); () = the whole suite
    text_model: str
    presets: tuple[Preset, ...]
    venv: str
    runs: tuple[SideRun, ...]           # base and candidate runs, interleaved
    comparison: Comparison
    timings: tuple[tuple[str, float], ...] = field(default=())
    asked: tuple[str, ...] = ()         # --tests as given (subset names kept)

    @property
    def ok(self) -> bool:
        return self.comparison.ok


# ------------------------------------------------------------------ junit -> outcomes (pure)

def _message(el: ET.Element) -> str:
    """The record's message attribute; else the traceback's `E ` lines; else its last line."""
    msg = (el.get("message") or "").strip()
    text = (el.text or "").strip()
    if not msg and text:
        lines = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
        msg = " / ".join(lines[:3]) or text.splitlines()[-1]
    return " ".join(msg.split())[:600]


def parse_junit(text: str) -> tuple[Outcome, ...]:
    """Per-test outcomes of one pytest --junitxml file. A test with a failure or an error (also a
    teardown error after a passing call) is failed/error; skipped and xfailed are skipped."""
    root = ET.fromstring(text)
    out: dict[str, Outcome] = {}
    for case in root.iter("testcase"):
        cls, name = case.get("classname") or "", case.get("name") or ""
        tid = f"{cls}::{name}" if cls else name   # a collection error has no classname
        seconds = float(case.get("time") or 0)
        fail, err, skip = case.find("failure"), case.find("error"), case.find("skipped")
        if fail is not None:
            o = Outcome(tid, "failed", _message(fail), seconds)
        elif err is not None:
            o = Outcome(tid, "error", _message(err), seconds)
        elif skip is not None:
            o = Outcome(tid, "skipped", _message(skip) or "skipped", seconds)
        else:
            o = Outcome(tid, "passed", "", seconds)
        prev = out.get(tid)
        if prev is None or (prev.outcome in ("passed", "skipped") and o.outcome in ("failed", "error")):
            out[tid] = o
    return tuple(out.values())


# ------------------------------------------------------------------ the pass-set comparison (pure)

def _verdict(o: Outcome | None) -> str:
    if o is None:
        return "absent"
    return {"passed": "pass", "skipped": "skip"}.get(o.outcome, "fail")


def compare(before: Sequence[Sequence[Outcome]], after: Sequence[Sequence[Outcome]]) -> Comparison:
    """`before` / `after`: one sequence of outcomes per run (--repeat) on the base / candidate."""
    if not before or not after:
        raise ValueError("compare needs at least one run per side")
    b_runs = [{o.id: o for o in run} for run in before]
    a_runs = [{o.id: o for o in run} for run in after]
    ids: list[str] = []
    for run in [*b_runs, *a_runs]:
        ids += [i for i in run if i not in ids]
    ran, pb, pa, gained = [], [], [], []
    regressions: list[Regression] = []
    not_judged: list[tuple[str, str]] = []
    not_run: list[tuple[str, str]] = []
    flaky: list[tuple[str, str]] = []
    for tid in sorted(ids):
        bv = [_verdict(r.get(tid)) for r in b_runs]
        av = [_verdict(r.get(tid)) for r in a_runs]
        every = bv + av
        if all(v == "skip" for v in every):
            first = next(r[tid] for r in [*b_runs, *a_runs] if tid in r)
            not_run.append((tid, first.message))
            continue
        if "absent" in every or "skip" in every:
            not_judged.append((tid, f"not in every run (base: {', '.join(bv)}; candidate: {', '.join(av)})"))
            continue
        ran.append(tid)
        if set(bv) == {"pass"} and len(set(av)) > 1:
            # passes on every base run, fails on some candidate run: an intermittent regression,
            # exactly what a gate must catch (a flip on the base side is what makes a test flaky)
            runs = [str(k + 1) for k, v in enumerate(av) if v != "pass"]
            msg = next(r[tid].message for r in a_runs if r[tid].outcome != "passed")
            pb.append(tid)
            regressions.append(Regression(tid, f"intermittent: failed in candidate run{'s' * (len(runs) > 1)} "
                                               f"{', '.join(runs)} of {len(av)}, passed in all {len(bv)} base "
                                               f"run{'s' * (len(bv) > 1)}: {msg}"))
            continue
        if len(set(bv)) > 1 or len(set(av)) > 1:
            flips = "; ".join(f"{side}: {', '.join(v)}" for side, v in (("base", bv), ("candidate", av))
                              if len(set(v)) > 1)
            flaky.append((tid, flips))
            continue
        before_ok, after_ok = bv[0] == "pass", av[0] == "pass"
        if before_ok:
            pb.append(tid)
        if after_ok:
            pa.append(tid)
        if before_ok and not after_ok:
            msg = next((r[tid].message for r in a_runs if r[tid].outcome != "passed"), "")
            regressions.append(Regression(tid, msg))
        elif after_ok and not before_ok:
            gained.append(tid)
        elif not before_ok and not after_ok:
            not_judged.append((tid, "fails on both sides: " + a_runs[0][tid].message))
    return Comparison(tuple(ran), tuple(pb), tuple(pa), tuple(regressions), tuple(gained), tuple(not_judged),
                      tuple(not_run), tuple(flaky))


# ------------------------------------------------------------------ the suite's venv

def venv(requirements: bytes, progress: Callable[[str], None] = log_progress) -> Path:
    """The suite's own requirements in an isolated venv, cached by the requirements file's hash
    (and this Python's version); returns its python. Built in a temporary directory and renamed,
    so a half-installed venv is never used."""
    key = cache.digest(requirements, sys.version_info[:3], n=16)
    base = cache.sub("upstream", "venvs")
    root = base / key
    python = root / "bin" / "python"
    with cache.locked(base / f"{key}.lock"):
        if (root / ".patchkit-ready").exists() and python.exists():
            return python
        shutil.rmtree(root, ignore_errors=True)
        tmp = base / f".{key}.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        t = time.monotonic()
        progress(f"creating the test suite's venv ({tmp.name}, key {key}: its requirements.txt + Python "
                 f"{'.'.join(map(str, sys.version_info[:3]))})")
        proc.run([sys.executable, "-m", "venv", str(tmp)], timeout=300, error=EnvironmentProblem,
                 what="python -m venv")
        (tmp / "requirements.txt").write_bytes(requirements)
        # pip records absolute paths in scripts; the venv is used through `bin/python -m`, never its scripts
        res = proc.stream([str(tmp / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                           "--no-input", "-r", str(tmp / "requirements.txt")],
                          log_path=base / f"{key}.pip.log", timeout=1800,
                          on_line=lambda ln: progress("  " + ln.split(" (from ")[0].strip())
                          if ln.startswith(("Collecting", "Successfully")) else None)
        if res.rc != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            tail = "\n  ".join(res.out.strip().splitlines()[-5:])
            raise EnvironmentProblem(f"could not install the server tests' requirements (pip exit {res.rc}):\n  {tail}",
                                     hint="Check that PyPI is reachable.", log=str(base / f"{key}.pip.log"))
        os.replace(tmp, root)
        # a venv's python is a symlink into its own directory's parent interpreter: the rename keeps it
        (root / ".patchkit-ready").write_text(f"{time.monotonic() - t:.1f} s\n")
        progress(f"venv ready in {time.monotonic() - t:.0f} s: {root}")
        return python


# ------------------------------------------------------------------ one side

def export_tests(repo: git.Repo, commit: str, dest: Path) -> Path:
    """The tests (and what they read) of `commit` into `dest`, as files; returns the tests dir."""
    c = repo.commit(commit)
    try:
        c.tree / TESTS_DIR
    except KeyError:
        raise RepoError(f"{commit[:12]} has no {TESTS_DIR}: this tree carries no llama.cpp server test suite.")
    shutil.rmtree(dest, ignore_errors=True)
    for top in EXPORT:
        try:
            sub = c.tree / top
        except KeyError:
            continue
        for item in sub.traverse():
            if item.type != "blob":
                continue
            target = dest / item.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(item.data_stream.read())
            if item.mode & 0o111:
                target.chmod(0o755)
    tests = dest / TESTS_DIR
    (tests / "tmp").mkdir(exist_ok=True)
    return tests


def _marked(marker: str) -> list[int]:
    return proc.marked(marker, "PATCHKIT_UPSTREAM_RUN")


def _describe(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return f"pid {pid}"
    args = " ".join(a.decode(errors="replace") for a in argv[1:3] if a)
    return f"{comm} pid {pid}" + (f" ({args[:80]})" if args else "")


def kill_marked(marker: str, grace: float = 3.0) -> list[str]:
    """Every process carrying the run's marker, once pytest has ended: anything left is a leftover
    (a llama-server, or a helper the suite's tests spawned). Described, then killed."""
    left = _marked(marker)
    described = [_describe(pid) for pid in left]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while _marked(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
    return described


# environment the suite reads that would change what runs (ports, external servers, server args)
_DROP = ("PORT", "DEBUG", "DEBUG_EXTERNAL", "N_GPU_LAYERS", "SLOW_TESTS", "LLAMA_CACHE", "PYTEST_ADDOPTS",
         "PYTHONPATH", "VIRTUAL_ENV", "PYTEST_XDIST_AUTO_NUM_WORKERS", "PYTEST_PLUGINS")


def run_side(python: Path, tests: Path, binary: Path, *, side: str, commit: str, selection: Sequence[str],
             conf: dict, out_dir: Path, timeout: int = DEFAULT_TIMEOUT,
             progress: Callable[[str], None] = log_progress, what: str = "") -> SideRun:
    """One pytest run of the suite in `tests` against `binary`, serially; outcomes from junit."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plugin_dir = out_dir / "plugin"
    plugin_dir.mkdir(exist_ok=True)
    shutil.copyfile(Path(__file__).with_name("upstream_plugin.py"), plugin_dir / f"{PLUGIN}.py")
    junit, log, left_json = out_dir / "junit.xml", out_dir / "pytest.log", out_dir / "leftovers.json"
    for f in (junit, log, left_json):
        f.unlink(missing_ok=True)
    cfg = dict(conf, timeout=timeout, leftovers=str(left_json))
    (out_dir / "plugin.json").write_text(json.dumps(cfg, indent=2))
    (tests / "tmp").mkdir(exist_ok=True)
    cache_dir = out_dir / "llama-cache"   # empty: nothing is ever looked up or downloaded there
    cache_dir.mkdir(exist_ok=True)
    marker = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k not in _DROP and not k.startswith("LLAMA_ARG_")}
    env.update({
        "LLAMA_SERVER_BIN_PATH": str(binary),
        "PYTHONPATH": str(plugin_dir),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PATCHKIT_UPSTREAM_CONFIG": str(out_dir / "plugin.json"),
        "PATCHKIT_UPSTREAM_RUN": marker,
        "LLAMA_CACHE": str(cache_dir),
        "HF_HUB_OFFLINE": "1",
        "LLAMA_OFFLINE": "1",
    })
    argv = [str(python), "-m", "pytest", *selection, "-p", PLUGIN, "-p", "no:cacheprovider", "-v", "-rN",
            "--tb=short", f"--junitxml={junit}", "-o", "junit_family=xunit2", "-o", "console_output_style=classic"]
    done = [0]

    def on_line(line: str) -> None:
        if line.startswith("unit/") and any(w in line for w in (" PASSED", " FAILED", " ERROR", " SKIPPED")):
            done[0] += 1
            progress(f"[{side} {done[0]}] {line.strip()[:150]}")

    progress(f"{side}: pytest {what or ' '.join(selection) or 'the whole suite'} against {binary} (log: {log})")
    res = proc.stream(argv, log_path=log, on_line=on_line, cwd=tests, env=env, timeout=SIDE_TIMEOUT)
    killed = kill_marked(marker)
    if not junit.exists():
        tail = "\n  ".join(res.out.strip().splitlines()[-8:])
        raise EnvironmentProblem(f"pytest of the server tests wrote no junit report (exit {res.rc}):\n  {tail}",
                                 log=str(log))
    outcomes = parse_junit(junit.read_text(errors="replace"))
    leftovers = []
    if left_json.exists():
        leftovers = [f"{x['test']}: pids {', '.join(map(str, x['pids']))}" for x in json.loads(left_json.read_text())]
    leftovers += [f"after the run: {k}" for k in killed if k.startswith("llama-server")]
    strays = tuple(k for k in killed if not k.startswith("llama-server"))
    return SideRun(side, commit, str(binary), outcomes, res.seconds, res.rc, str(junit), str(log), tuple(leftovers),
                   strays)


# ------------------------------------------------------------------ the stage

def selection(tests: Iterable[str], tests_dir: Path | None = None) -> tuple[str, ...]:
    """--tests arguments: subset names (SUBSETS) expand; files/node ids are relative to the tests
    dir (`unit/test_tokenize.py`, `test_tokenize`, `unit/test_basic.py::test_server_props`)."""
    out: list[str] = []
    for t in tests:
        if t in SUBSETS:
            out += SUBSETS[t]
            continue
        path, _, rest = t.partition("::")
        if not path.startswith("unit/"):
            path = f"unit/{path}"
        if not path.endswith(".py"):
            path += ".py"
        if tests_dir is not None and not (tests_dir / path).is_file():
            known = sorted(p.name for p in (tests_dir / "unit").glob("test_*.py"))
            raise UsageError(f"no test file {path} in {TESTS_DIR}. Subsets: {', '.join(SUBSETS)}; files: "
                             f"{', '.join(known)}.")
        out.append(path + (f"::{rest}" if rest else ""))
    return tuple(dict.fromkeys(out))


def run(repo: git.Repo, base: str, candidate: str, *, candidate_label: str = "", tests: Sequence[str] = (),
        repeat: int = 1, out_dir: Path, text_model: str = "tiny", timeout: int = DEFAULT_TIMEOUT,
        opts: build_mod.Options = build_mod.Options(), say: Callable[[str], None] = log_progress,
        progress: Callable[[str], None] = log_progress) -> Result:
    """Build both sides (cached by tree content), run the candidate's server tests against each
    binary `repeat` times (interleaved: base, candidate, base, ...), compare the pass sets."""
    timings: list[tuple[str, float]] = []

    def timed(name, fn):
        t = time.monotonic()
        try:
            return fn()
        finally:
            timings.append((name, time.monotonic() - t))

    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / "src"
    tests_dir = export_tests(repo, candidate, src)
    sel = selection(tests, tests_dir)
    python = timed("venv", lambda: venv((tests_dir / "requirements.txt").read_bytes(), say))
    say(f"building base {base[:12]}")
    b_bin = timed("build base", lambda: build_mod.build(repo, base, opts, progress)).binary
    say(f"building candidate {candidate[:12]}")
    c_bin = timed("build candidate", lambda: build_mod.build(repo, candidate, opts, progress)).binary
    plist, urls = timed("models", lambda: presets(text_model, say))
    conf = plugin_config(plist, urls, timeout=timeout, leftovers=out_dir / "leftovers.json")
    runs: list[SideRun] = []
    for i in range(repeat):
        for side, commit, binary in (("base", base, b_bin), ("candidate", candidate, c_bin)):
            name = side if repeat == 1 else f"{side}-{i + 1}"
            r = timed(f"tests {name}", lambda: run_side(python, tests_dir, binary, side=side, commit=commit,
                                                          selection=sel, conf=conf, out_dir=out_dir / name,
                                                          timeout=timeout, progress=progress,
                                                          what=", ".join(tests) or "the whole suite"))
            say(f"{name}: {r.count('passed')} passed, {r.count('failed') + r.count('error')} failed, "
                f"{r.count('skipped')} not run, in {r.seconds:.0f} s (pytest exit {r.rc})")
            runs.append(r)
    cmp = compare([r.outcomes for r in runs if r.side == "base"], [r.outcomes for r in runs if r.side == "candidate"])
    return Result(str(repo.working_tree_dir), base, candidate, candidate_label, candidate, sel, text_model, plist,
                  str(python.parent.parent), tuple(runs), cmp, tuple(timings), tuple(tests))


# ------------------------------------------------------------------ output

def to_json(res: Result) -> dict:
    c = res.comparison
    return {
        "ok": res.ok,
        "repo": res.repo, "base": res.base, "candidate": res.candidate, "candidate_label": res.candidate_label,
        "tests_from": res.tests_from, "tests": list(res.asked) or ["(whole suite)"],
        "selection": list(res.selection) or ["(whole suite)"],
        "text_model": res.text_model, "venv": res.venv,
        "counts": {"run": len(c.run), "passed_before": len(c.passed_before), "passed_after": len(c.passed_after),
                   "regressions": len(c.regressions), "gained": len(c.gained), "not_judged": len(c.not_judged),
                   "not_run": len(c.not_run), "flaky": len(c.flaky)},
        "regressions": [asdict(r) for r in c.regressions],
        "passed_before": list(c.passed_before), "passed_after": list(c.passed_after),
        "gained": list(c.gained),
        "not_judged": [{"id": i, "why": w} for i, w in c.not_judged],
        "not_run": [{"id": i, "why": w} for i, w in c.not_run],
        "not_run_reasons": not_run_reasons(c),
        "flaky": [{"id": i, "runs": w} for i, w in c.flaky],
        "presets": [asdict(p) for p in res.presets],
        "runs": [{"side": r.side, "commit": r.commit, "binary": r.binary, "seconds": round(r.seconds, 1),
                  "pytest_exit": r.rc, "passed": r.count("passed"), "failed": r.count("failed") + r.count("error"),
                  "skipped": r.count("skipped"), "junit": r.junit, "log": r.log, "leftover_servers": list(r.leftovers),
                  "stray_processes": list(r.strays)}
                 for r in res.runs],
        "timings": {k: round(v, 1) for k, v in res.timings},
    }


def not_run_reasons(c: Comparison) -> dict[str, int]:
    out: dict[str, int] = {}
    for _, why in c.not_run:
        why = why.removeprefix(NOT_RUN)
        out[why] = out.get(why, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def text_summary(res: Result) -> str:
    c = res.comparison
    lines = [f"llama.cpp server tests ({', '.join(res.asked) or 'the whole suite'}; tests of {res.tests_from[:12]}, "
             f"text model {res.text_model})",
             f"  base {res.base[:12]} vs candidate {res.candidate[:12]}"
             + (f" ({res.candidate_label})" if res.candidate_label else "")]
    seen: dict[str, int] = {}
    for r in res.runs:
        seen[r.side] = seen.get(r.side, 0) + 1
        label = r.side if len(res.runs) == 2 else f"{r.side} #{seen[r.side]}"
        lines.append(f"  {label:12s} {r.count('passed'):4d} passed {r.count('failed') + r.count('error'):4d} failed "
                     f"{r.count('skipped'):4d} not run  {r.seconds:6.0f} s  pytest exit {r.rc}"
                     + (f"  LEFTOVER SERVERS: {'; '.join(r.leftovers)}" if r.leftovers else "")
                     + (f"  (killed after the run: {'; '.join(r.strays)})" if r.strays else ""))
    lines.append(f"  run on both sides: {len(c.run)}, passing before: {len(c.passed_before)}, passing after: "
                 f"{len(c.passed_after)}, gained: {len(c.gained)}, not judged (fail on both): "
                 f"{sum(w.startswith('fails on both') for _, w in c.not_judged)}, not run: {len(c.not_run)}, "
                 f"flaky: {len(c.flaky)}")
    for why, n in not_run_reasons(c).items():
        lines.append(f"    not run ({n}): {why}")
    for tid, why in c.not_judged:
        if not why.startswith("fails on both"):
            lines.append(f"  not judged: {tid}: {why}")
    for tid, why in c.flaky:
        lines.append(f"  flaky: {tid}: {why}")
    for tid in c.gained:
        lines.append(f"  gained: {tid}")
    for r in c.regressions:
        lines.append(f"  REGRESSION: {r.id}: {r.message}")
    return "\n".join(lines)


def write(res: Result, out_dir: Path) -> Path:
    path = Path(out_dir) / "upstream.json"
    path.write_text(json.dumps(to_json(res), indent=2) + "\n")
    return path
