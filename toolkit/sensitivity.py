"""The oracle, measured: what a one-cell change of a sequence's KV history does to its stream.

A C++ program (templates/sensitivity.cpp) against the tree's own libllama, compiled with the tree's
own flags, decodes seeded histories of 300-900 cells and perturbs them with llama.cpp's own memory
API: a cell dropped (a hole), duplicated, holding another token, every later cell shifted by one,
two cells at one position, another sequence's cell made visible, and a reset of the sampler's RNG or
penalties. Per kind: the share of perturbations whose continuation differs within N tokens. And
"batch": the same history continued beside 1-3 other sequences, in another batch shape, with its
cells elsewhere in the pool: every divergence there is noise the oracle cannot tell from a bug.

One binary per tree content (cached by the tree's SHA, the build options and the program's digest);
the program runs once per model.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import git

from . import anchors, cache, proc
from . import build as build_mod
from . import model as model_mod
from .errors import BuildError, EnvironmentProblem, PatchError
from .ui import heartbeat, log_progress

SOURCE = Path(__file__).parent / "templates" / "sensitivity.cpp"
KINDS = ("change", "duplicate", "drop", "shift", "overlap", "cross", "sampler-rng", "sampler-penalties", "batch")
# what each kind does to the history, for the table's reader
MEANING = {
    "change": "one cell holds another token",
    "duplicate": "one cell repeated (later cells one position on)",
    "drop": "one cell removed (seq_rm: a hole)",
    "shift": "every cell from p on one position later (seq_add +1: a gap)",
    "overlap": "every cell from p on one position earlier (seq_add -1: two cells at one position)",
    "cross": "another sequence's cell made visible (seq_cp)",
    "sampler-rng": "the sampler's RNG reset part-way (temperature 0.8, seeded)",
    "sampler-penalties": "the sampler's penalties reset part-way (repeat 1.1, presence 0.5, last 64)",
    "batch": "no change: beside 1-3 other sequences, another batch shape, cells elsewhere (must NOT diverge)",
}


@dataclass(frozen=True)
class KindResult:
    kind: str
    trials: int
    detected: int        # continuations that differ within n_gen tokens (for "batch": divergences)
    refused: int         # the memory refused the edit (e.g. a recurrent layer cannot drop one cell)
    median_at: float | None  # median generated index of the first difference, among the detected
    identical: int = 0   # of the undetected: the edit left a bit-identical cell (cross: the other
    #                      sequence's cell holds the very token of the cell at its position)

    @property
    def share(self) -> float | None:
        """Of the edits a stream could see: refused edits and bit-identical cells (the same token at
        the same position: nothing for any pointer to tell apart) are not in the denominator."""
        n = self.trials - self.refused - (self.identical if self.kind == "cross" else 0)
        return self.detected / n if n else None


@dataclass(frozen=True)
class ModelSensitivity:
    model: str
    trials: int
    n_gen: int
    seed: int
    kinds: tuple[KindResult, ...]
    seconds: float

    def kind(self, name: str) -> KindResult:
        return next(k for k in self.kinds if k.kind == name)


LIBRARY_DIRS = ("include", "src", "ggml", "CMakeLists.txt", "cmake")


def library_content(repo: git.Repo, commit: str) -> str:
    """What libllama is built from: a server patch leaves it alone, so the base and every patched
    tree of one base share one harness (and one sensitivity measurement)."""
    return cache.digest(*(repo.git.rev_parse(f"{commit}:{d}") for d in LIBRARY_DIRS
                          if repo.git.ls_tree(commit, d)))


def harness(repo: git.Repo, commit: str, opts: build_mod.Options = build_mod.Options(),
            progress=log_progress) -> Path:
    """The compiled program for this tree content: built once, then served from the cache."""
    key = cache.digest(library_content(repo, commit), opts.key(), SOURCE.read_bytes(), n=16)
    out = cache.sub("harness") / f"sensitivity-{key}"
    if out.exists():
        return out
    with build_mod.held(repo, commit, opts, progress) as ws:
        # only the libraries (Ninja's target `llama` and the ggml ones it needs): a no-op where
        # this workspace built the tree's llama-server, whatever server patch it carried
        progress(f"building libllama at {commit[:12]} (a no-op when the workspace built it)")
        with heartbeat(progress, lambda: "building libllama"):
            res = proc.stream(["ninja", "-C", ws.build, "llama"], log_path=ws.log, env=build_mod._env(ws.root),
                              timeout=3600)
        if res.rc != 0:
            raise BuildError(f"libllama did not build at {commit[:12]}: {build_mod.first_error(res.out)}",
                             log=str(ws.log))
        rel = anchors.find_server_file(ws.src)
        cmd = ws.compile_command(rel)
        work = ws.root / "sensitivity"
        work.mkdir(exist_ok=True)
        src = work / "sensitivity.cpp"
        shutil.copy2(SOURCE, src)
        argv = [a for a in cmd.argv if Path(a).name != "ccache" and a != "-c"]
        tmp = out.with_name(f".{out.name}.tmp")
        argv[argv.index("-o") + 1] = str(tmp)
        argv = [str(src) if Path(a).name == Path(rel).name else a for a in argv]
        libs = sorted(str(p) for p in ws.build.rglob("lib*.a") if p.name.startswith(("libllama.a", "libggml")))
        argv += ["-Wl,--start-group", *libs, "-Wl,--end-group", "-fopenmp", "-lpthread", "-ldl", "-lm"]
        progress(f"compiling the perturbation harness against {len(libs)} static libraries of {commit[:12]}")
        with heartbeat(progress, lambda: "compiling the perturbation harness"):
            res = proc.run(argv, cwd=cmd.directory, timeout=900, check=False)
        if res.rc != 0:
            raise PatchError("the perturbation harness did not compile: " + build_mod.first_error(res.err + res.out))
        tmp.replace(out)
    return out


def measure(binary: Path, model_name: str, trials: int = 20, n_gen: int = 64, seed: int = 1,
            kinds: tuple[str, ...] = KINDS, progress=log_progress) -> ModelSensitivity:
    """Run the harness on one model (a tiny family's name, or a .gguf path)."""
    m = model_mod.resolve(model_name)
    progress(f"perturbing {trials} histories x {len(kinds)} kinds on {model_name}")
    with heartbeat(progress, lambda: f"perturbing on {model_name}"):
        res = proc.run([str(binary), str(m.path), str(seed), str(trials), str(n_gen), ",".join(kinds)],
                       timeout=max(600, trials * 30), check=False)
    if res.rc != 0 or "done" not in res.out.splitlines()[-1:]:
        raise EnvironmentProblem(f"the perturbation harness failed on {model_name} (exit {res.rc}): "
                                 f"{(res.err or res.out).strip()[-300:]}")
    rows = [json.loads(line) for line in res.out.splitlines() if line.startswith("{")]
    return summarise(rows, model_name, trials, n_gen, seed, kinds, res.seconds)


def summarise(rows: list[dict], model_name: str, trials: int, n_gen: int, seed: int,
              kinds: tuple[str, ...], seconds: float = 0.0) -> ModelSensitivity:
    """Pure: the harness's JSON lines -> per-kind counts. diverged: -1 same stream, -2 refused,
    k >= 0 the first generated index that differs."""
    out = []
    for kind in kinds:
        mine = [r for r in rows if r.get("kind") == kind]
        refused = sum(1 for r in mine if r["diverged"] == -2)
        hits = sorted(r["diverged"] for r in mine if 0 <= r["diverged"] < n_gen)
        med = float(hits[len(hits) // 2]) if hits else None
        same = sum(1 for r in mine if r["diverged"] == -1 and r.get("note") == "identical")
        out.append(KindResult(kind, len(mine), len(hits), refused, med, same))
    return ModelSensitivity(model_name, trials, n_gen, seed, tuple(out), seconds)


def table(results: list[ModelSensitivity]) -> str:
    """Kinds as rows, models as columns: 'detected/judged' and the share (batch: divergences)."""
    head = ["kind"] + [r.model for r in results]
    rows = [head]
    for kind in results[0].kinds:
        row = [kind.kind]
        for r in results:
            k = r.kind(kind.kind)
            n = k.trials - k.refused
            if n == 0:
                row.append("n/a (memory refused)")
            elif kind.kind == "batch":
                row.append(f"{k.detected}/{n} diverged")
            else:
                row.append(f"{k.detected}/{n} ({100 * k.detected / n:.1f} %)"
                           + (f", {k.identical} missed: a bit-identical cell" if k.identical else ""))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


REPORT_TRIALS, REPORT_SEED = 10, 1


def for_report(repo: git.Repo, commit: str, model_name: str, opts: build_mod.Options = build_mod.Options(),
               progress=log_progress) -> ModelSensitivity | str:
    """The model's sensitivity as every report states it beside the verdict: REPORT_TRIALS
    histories of every kind, measured once per (library content, model file) and cached; a reason
    (str) where it cannot be measured (a sanitizer build, a tree whose libllama predates the memory
    API, a model the harness cannot load)."""
    if opts.sanitize:
        return "not measured on a sanitizer build (its libraries need the sanitizer's runtime)"
    try:
        m = model_mod.resolve(model_name, progress)
        key = cache.digest(library_content(repo, commit), opts.key(), SOURCE.read_bytes(), m.sha256,
                           REPORT_TRIALS, REPORT_SEED, n=16)
        path = cache.sub("sensitivity") / f"{key}.json"
        if path.exists():
            return from_json(json.loads(path.read_text()))
        binary = harness(repo, commit, opts, progress)
        res = measure(binary, model_name, trials=REPORT_TRIALS, seed=REPORT_SEED, progress=progress)
        cache.write_atomic(path, json.dumps(to_json(res)))
        return res
    except (PatchError, BuildError, EnvironmentProblem, OSError) as e:
        return f"not measured: {(str(e).splitlines() or [type(e).__name__])[0][:200]}"


def to_json(r: ModelSensitivity) -> dict:
    return {"model": r.model, "trials": r.trials, "n_gen": r.n_gen, "seed": r.seed, "seconds": round(r.seconds, 1),
            "kinds": {k.kind: {"trials": k.trials, "detected": k.detected, "refused": k.refused,
                               "identical": k.identical, "share": k.share, "median_at": k.median_at}
                      for k in r.kinds}}


def from_json(d: dict) -> ModelSensitivity:
    return ModelSensitivity(d["model"], d["trials"], d["n_gen"], d["seed"],
                            tuple(KindResult(name, k["trials"], k["detected"], k["refused"], k["median_at"],
                                             k.get("identical", 0)) for name, k in d["kinds"].items()),
                            d.get("seconds", 0.0))


def line(r: ModelSensitivity | str, model_name: str = "") -> str:
    """One line for a report: what the stream of this model sees."""
    if isinstance(r, str):
        return f"model {model_name}: sensitivity {r}"
    parts = []
    for k in r.kinds:
        n = k.trials - k.refused
        if k.kind == "batch":
            parts.append(f"batch-invariant {n - k.detected}/{n}" if n else "batch n/a")
        else:
            parts.append(f"{k.kind} {k.detected}/{n}" if n else f"{k.kind} n/a")
    return (f"model {r.model}: a one-cell change of the history seen within {r.n_gen} tokens: "
            + ", ".join(parts) + f" ({r.trials} histories, `patchkit sensitivity`)")
