"""What a candidate promises beyond the property every right patch keeps, and how patchkit knows it.

The property (one victim within the policy's choice, or no request ended; survivors exact) is
judged for every candidate. A series may promise more: its policy, a starvation bound, how a
parked slot comes back, exactly which cells it holds then, a log line per eviction. Those are
judged only where promised, and the same promise gets the same checks whoever wrote the code
(issue 34). Where the promises come from, the first found wins:

1. a declaration (`--promises FILE`): any author states them, in the format of `load()`;
2. the series' trailer (`Patchkit-Patch: <family> policy=<p>`, written by `apply`);
3. the code: a family's definitions and signature in the candidate's server source and not in the
   base's. `export` strips the trailers and a fork merges, squashes or rebases the series; its code
   stays, and so do its promises.

None found: a foreign candidate, judged on the property alone."""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

import git

from . import patch as patch_mod
from .compare import NONE, Promises
from .errors import UsageError
from .pauses import PARK_BOUND

EXPECTS = ("eviction", "preemption")
RESUME_PATHS = ("swap", "recompute")
RESUME_CELLS = ("exact", "pending")
KEYS = {"like", "expect", "policy", "park_bound", "resume_path", "resume_cells", "eviction_log", "counters",
        "parked_first"}
# what patchkit's series define to append their counters to /metrics (a series exported before they
# had counters is recognised without that promise)
COUNTERS_MARK = r"\bstd::string kv_full_metrics\(\) const"
# ... and to hold new tasks back while a slot is parked (a series exported before: without that promise)
PARKED_FIRST_MARK = r"\bbool has_parked_slot\(\) const"


@dataclass(frozen=True)
class Declared:
    """A candidate's promises and where they were found (said in every report)."""
    expect: str                    # "eviction" (one victim per overflow) | "preemption" (no request ends)
    policy: str                    # whom it chooses: largest, smallest, newest, not-leader-smallest
    own: Promises = NONE           # the promises judged beyond the property
    family: str = ""               # the patchkit family these are ("": declared without one)
    source: str = ""               # "trailer", "code: ...", "file <path>"

    @property
    def text(self) -> str:
        what = [f"{self.expect}, policy {self.policy}"]
        if self.own.witness:
            what.append("one log line per eviction")
        if self.own.park_bound:
            what.append(f"a request parked {self.own.park_bound} times is passed over")
        if self.own.resume_path:
            what.append(f"resume by {self.own.resume_path}")
        if self.own.resume_cells:
            what.append("resume holding exactly its cells" if self.own.resume_cells == "exact"
                        else "resume holding its cells and its pending token")
        if self.own.parked_first:
            what.append("new requests wait while one is parked")
        if self.own.counters:
            what.append("/metrics counts them")
        return "; ".join(what) + f" ({self.family + ', ' if self.family else ''}{self.source})"


def of_family(name: str, policy: str, source: str, env: dict[str, str] | None = None) -> Declared:
    """What patchkit's family `name` promises under the server environment `env`."""
    spec = patch_mod.load_patch(name)
    preempts = spec.expect == "preemption"
    pending = spec.params.get("pending", "decode") == "prefill"
    return Declared(spec.expect, policy, Promises(
        witness=spec.expect == "eviction",
        park_bound=PARK_BOUND if preempts else 0,
        resume_path=patch_mod.resume_path(name, env) if preempts else "",
        resume_cells=("pending" if pending else "exact") if preempts else "", counters=True,
        parked_first=preempts), name, source)


def load(path: Path, env: dict[str, str] | None = None) -> Declared:
    """A declaration file (TOML). Every key is optional but `expect` (or `like`):

        like = "park-slot"      # start from what this patchkit family promises
        expect = "preemption"   # eviction: one victim per overflow; preemption: no request ends
        policy = "largest"      # largest | smallest | newest | not-leader-smallest
        park_bound = 3          # a request parked this many times is passed over while another can go
        resume_path = "swap"    # swap: read back from host memory; recompute: nothing held
        resume_cells = "exact"  # exact: the cells it held; pending: those and its pending token
        eviction_log = false    # patchkit's log line per eviction ("KV cache is full: terminating slot")
        counters = true         # /metrics counts them: llamacpp:kv_full_evictions_total, or _parks_total,
                                # _resumes_total, requests_parked (and _recomputed_cells_total, _parked_bytes)
        parked_first = true     # a request that arrives while one is parked starts only once it is back
    """
    where = f"the promises file {path}"
    try:
        d = tomllib.loads(Path(path).read_text())
    except OSError as e:
        raise UsageError(f"cannot read {where}: {e.strerror}.") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{where} is not TOML: {e}.") from None
    d = d.get("promises", d)   # a [promises] table or top-level keys
    unknown = sorted(set(d) - KEYS)
    if unknown:
        raise UsageError(f"{where} has unknown keys {unknown}; known: {', '.join(sorted(KEYS))} (docs/commands.md, "
                         "'Promises').")
    if "like" in d:
        if d["like"] not in patch_mod.families():
            raise UsageError(f"{where}: like = '{d['like']}' is no patchkit family; known: "
                             f"{', '.join(patch_mod.families())}.")
        base = of_family(d["like"], d.get("policy", "largest"), f"file {path}", env)
    elif "expect" in d:
        base = Declared(d["expect"], "largest", NONE, "", f"file {path}")
    else:
        raise UsageError(f"{where} declares neither `expect` (eviction or preemption) nor `like` (a patchkit "
                         "family): nothing to judge by.")

    def pick(key, allowed, cast=str):
        v = d.get(key)
        if v is None:
            return None
        if (allowed and v not in allowed) or not isinstance(v, cast) or isinstance(v, bool) != (cast is bool):
            raise UsageError(f"{where}: {key} = {v!r} is not one of {', '.join(map(str, allowed)) or cast.__name__}.")
        return v

    policies = tuple(patch_mod.all_policies())
    expect = pick("expect", EXPECTS) or base.expect
    own = base.own
    for key, allowed, cast in (("park_bound", (), int), ("resume_path", RESUME_PATHS, str),
                               ("resume_cells", RESUME_CELLS, str), ("eviction_log", (), bool),
                               ("counters", (), bool), ("parked_first", (), bool)):
        v = pick(key, allowed, cast)
        if v is not None:
            own = replace(own, **{"witness" if key == "eviction_log" else key: v})
    if expect == "eviction" and (own.park_bound or own.resume_path or own.resume_cells or own.parked_first):
        raise UsageError(f"{where}: park_bound, resume_path, resume_cells and parked_first are promises of a preemption; this file "
                         "declares expect = \"eviction\".")
    if own.park_bound < 0:
        raise UsageError(f"{where}: park_bound must be 1 or more (0: not promised).")
    return Declared(expect, pick("policy", policies) or base.policy, own, base.family, f"file {path}")


def trailer(repo: git.Repo, base: str | None, commit: str, within: int) -> tuple[str, str] | None:
    """(family, policy) from the nearest Patchkit-Patch trailer below `commit` (and above `base`,
    when given), for families this patchkit has; None when no commit names one (a trailer is a
    claim in a commit message, not a family: the first one that is not ours ends the search)."""
    from .apply import TRAILER_PATCH

    for c in repo.iter_commits(f"{base}..{commit}" if base else commit, max_count=within, first_parent=True):
        m = re.search(rf"^{TRAILER_PATCH}: (\S+)(?:.*\bpolicy=(\S+))?", c.message, re.M)
        if m:
            return (m.group(1), m.group(2) or "largest") if m.group(1) in patch_mod.families() else None
    return None


def recognise(repo: git.Repo, base: str, cand: str) -> Declared | None:
    """patchkit's series recognised by its code: among the server sources the candidate changed,
    one carries every definition and signature of a family (patch.toml `definitions`, `[recognise]`)
    that the base's does not. The most specific family wins (the most signatures matched); its
    policy is read from the phrase its log line renders. None: no family's code is there."""
    changed = [p for p in repo.git.diff("--name-only", base, cand).splitlines()
               if p.endswith(".cpp") and "/server/" in f"/{p}"]
    best: tuple[int, str, str, str] | None = None
    for path in changed:
        new = _text(repo, cand, path)
        old = _text(repo, base, path)
        for name in patch_mod.families():
            spec = patch_mod.load_patch(name)
            marks = (*spec.definitions, *spec.signature)
            if not marks or not all(re.search(d, new) for d in marks) or all(re.search(d, old) for d in spec.definitions):
                continue
            policy = next((p for p, said in spec.policy_said.items() if said in new), None)
            if policy and (best is None or len(spec.signature) > best[0]):
                best = (len(spec.signature), name, policy, path)
    if best is None:
        return None
    _, name, policy, path = best
    d = of_family(name, policy, f"code: {name}'s definitions in {path}")
    text = _text(repo, cand, path)
    return replace(d, own=replace(d.own, counters=bool(re.search(COUNTERS_MARK, text)),
                                  parked_first=d.own.parked_first and bool(re.search(PARKED_FIRST_MARK, text))))


def _text(repo: git.Repo, commit: str, path: str) -> str:
    try:
        return (repo.commit(commit).tree / path).data_stream.read().decode(errors="replace")
    except KeyError:
        return ""


def rendered_family(patch_name: str | None, candidate_ref, patch_file, commit) -> str | None:
    """The family a command renders its candidate from (--patch, or the default patch when no other
    candidate option is given); None for a candidate that came as a ref, a patch file or a commit."""
    return None if (candidate_ref or patch_file or commit) else (patch_name or patch_mod.DEFAULT_PATCH)


def of_candidate(repo: git.Repo, base: str, cand: str, *, declared: Path | None = None, family: str | None = None,
                 policy: str = "largest", within: int = 50) -> Declared | None:
    """The candidate's promises, from the first source that has them (module docstring).
    `family`: the candidate was rendered here from that family (rendered_family): its promises, `policy`."""
    if declared:
        return load(declared)
    if family:
        return of_family(family, policy, "rendered here")
    t = trailer(repo, base, cand, within)
    if t:
        return of_family(t[0], t[1], "its commits' trailer")
    return recognise(repo, base, cand)
