"""The patch families and their rendering: what a family declares, and its C++ for one tree.

1. `load_patch`: a family's folder (patch.toml, templates); anchors.py found the tree's layout.
2. `render`: Jinja2 (StrictUndefined) templates of patches/<name>/, one set for all
   layouts; the facts from step 1 fill them. Pure: text in, text out.
3. `commit_series`: one commit per stage, written with git plumbing into a private index,
   so no working tree is touched. `apply` then points a new branch at it and checks it out.
"""
from __future__ import annotations

import re
import textwrap
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from . import data_dir
from .anchors import Facts
from .errors import LayoutError, PatchError, UsageError

PATCHES_DIR = data_dir("patches")
# A fork keeps families of its own in folders of its own: PATCHKIT_FAMILIES names more directories
# (os.pathsep-separated), each holding one folder per family, searched after patches/.
FAMILIES_ENV = "PATCHKIT_FAMILIES"
DEFAULT_PATCH = "evict-largest-slot"
# The names the patch gives its code: what a maintainer would call them (no tool names in the C++;
# patchkit recognises its series by commit trailers and by these definitions, see state()).
HELPER = "evict_one_slot"
SURGERY = "remove_slot_entries"
# What each victim policy terminates, in the commit message's words.
POLICY_WHAT = {"largest": "the most cells", "smallest": "the fewest cells", "newest": "the newest task"}


@dataclass(frozen=True)
class PatchSpec:
    name: str
    summary: str
    policies: tuple[str, ...]
    stages: tuple[tuple[str, str], ...]
    variants: dict
    root: Path                     # the templates' folder (a family may share another's: `templates = "..."`)
    helper: str = HELPER           # the method the hook calls
    definitions: tuple[str, ...] = ()  # what marks the series applied in the code (regexes); see state()
    params: dict = field(default_factory=dict)  # fixed template parameters of this patch (e.g. mode)
    policy_what: dict = field(default_factory=lambda: dict(POLICY_WHAT))
    expect: str = "eviction"       # the expectations its verdicts apply (compare.py)
    layouts: tuple[str, ...] = ()  # the layouts it is written for (empty: every layout the anchors allow)
    shapes: tuple[str, ...] = ()   # the failure-point shapes its handler can meet (coverage.py's vocabulary)
    strategy: str = ""             # its name as a referee strategy (terminate, park, ...); "": not a row
    parts: tuple[tuple[str, str], ...] = ()  # (template, anchor): where each part of the C++ goes (ANCHORS)
    # operator mutants argued equivalent ([[equivalent]]: operator, original, mutated, why): not ALIVE
    equivalent: tuple[dict, ...] = ()
    # how its code is recognised once its trailers are gone (promises.recognise): regexes beyond the
    # definitions that tell it from the families sharing its templates, and the phrase each policy
    # renders into its log line ([recognise] signature, [recognise.policies])
    signature: tuple[str, ...] = ()
    policy_said: dict = field(default_factory=dict)
    # the pairs of the failure point (coverage.PAIRS) its default suite reaches by design, which a
    # suite run must reach to PASS; None: the eviction's rule (every reachable pair, policy largest)
    pairs: tuple[str, ...] | None = None


def family_dirs() -> list[Path]:
    """patches/, then every directory PATCHKIT_FAMILIES names (read at each call: a test or a fork
    sets it per process)."""
    import os
    extra = [Path(p).expanduser() for p in os.environ.get(FAMILIES_ENV, "").split(os.pathsep) if p]
    return [PATCHES_DIR, *extra]


def family_dir(name: str) -> Path | None:
    """The folder of family `name` (the first directory that has it), or None."""
    return next((d / name for d in family_dirs() if (d / name / "patch.toml").is_file()), None)


def load_patch(name: str = DEFAULT_PATCH) -> PatchSpec:
    folder = family_dir(name)
    if folder is None:
        raise UsageError(f"no patch named '{name}'. Known: {', '.join(families())}"
                         f" (in {', '.join(str(d) for d in family_dirs())}).")
    meta = folder / "patch.toml"
    d = tomllib.loads(meta.read_text())
    for name_, v in d.get("variants", {}).items():
        _check_variant(meta, name_, v)
    from .coverage import SHAPES
    unknown_shapes = [x for x in d.get("shapes", ()) if x not in SHAPES]
    if unknown_shapes:
        raise UsageError(f"{meta}: unknown shapes {unknown_shapes}; known: {', '.join(SHAPES)}.")
    from .overflows import PAIRS
    unknown_pairs = [x for x in d.get("pairs", ()) if x not in PAIRS]
    if unknown_pairs:
        raise UsageError(f"{meta}: unknown or unreachable pairs {unknown_pairs}; reachable: {'; '.join(PAIRS)}.")
    parts = tuple((str(t), str(a)) for t, a in d.get("parts", DEFAULT_PARTS).items())
    bad = [a for _, a in parts if a not in ANCHORS]
    if bad:
        raise UsageError(f"{meta}: unknown anchors {bad}; the engine knows: {', '.join(ANCHORS)}.")
    helper = d.get("helper", HELPER)
    definitions = tuple(d.get("definitions", ())) or (rf"\bbool {helper}\(int32_t",
                                                      rf"\bvoid {SURGERY}\((llama_batch & batch, )?int32_t id_slot")
    return PatchSpec(d["name"], d["summary"], tuple(d["policies"]),
                     tuple((s["title"], s["body"].strip()) for s in d["stages"]), d.get("variants", {}),
                     family_dir(d["templates"]) if "templates" in d else folder, helper, definitions,
                     d.get("params", {}),
                     {**POLICY_WHAT, **d.get("policy_what", {})}, d.get("expect", "eviction"),
                     tuple(d.get("layouts", ())), tuple(d.get("shapes", ())), d.get("strategy", ""),
                     parts, tuple(d.get("equivalent", ())), tuple(d.get("recognise", {}).get("signature", ())),
                     dict(d.get("recognise", {}).get("policies", {})),
                     tuple(d["pairs"]) if "pairs" in d else None)


# The server's environment variable hybrid-slot reads its budget of parked bytes from (MiB; the
# fork's --preempt-ram reads the same name)
PREEMPT_RAM = "LLAMA_ARG_PREEMPT_RAM"


def resume_path(name: str, env: dict[str, str] | None = None) -> str:
    """How a parked slot of family `name` comes back, as the family promises it under the server
    environment `env` (the process's own, then `env`): "swap" (its sequence read back from host
    memory), "recompute" (nothing held), or "" (not promised: a family that parks nothing, or a
    hybrid budget between 0 and no limit, where which parks fit depends on their bytes)."""
    import os

    mode = load_patch(name).params.get("mode", "")
    if mode != "hybrid":
        return mode if mode in ("swap", "recompute") else ""
    budget = {**os.environ, **(env or {})}.get(PREEMPT_RAM, "").strip()
    return "swap" if not budget else "recompute" if budget == "0" else ""


def all_policies() -> list[str]:
    """Every victim policy some patch offers, in first-seen order (the CLI's choices)."""
    return list(dict.fromkeys(p for f in families() for p in load_patch(f).policies))


def families() -> list[str]:
    """Every family: a folder with a patch.toml under patches/ or a PATCHKIT_FAMILIES directory."""
    return sorted({p.name for d in family_dirs() if d.is_dir() for p in d.iterdir() if (p / "patch.toml").exists()})


# ------------------------------------------------------------------ rendering

def templates(spec: PatchSpec) -> jinja2.Environment:
    """The patch's Jinja2 templates (StrictUndefined: a fact a template needs and the layout
    lacks is an error, never an empty string in C++)."""
    # a family's own folder first, then patches/ itself: a family includes another's parts by path
    # (the preemption families take the eviction's batch surgery as it is)
    return jinja2.Environment(loader=jinja2.FileSystemLoader([str(spec.root), *map(str, family_dirs())]),
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              keep_trailing_newline=True)


def state(text: str, spec: PatchSpec) -> str:
    """'clean' | 'applied' | 'partial' (some of the patch's definitions without the others).
    Read from the code's own definitions, not from markers: the patch carries none."""
    found = [re.search(d, text) is not None for d in spec.definitions]
    if all(found):
        return "applied"
    return "partial" if any(found) else "clean"


# The insertion points the analysis finds by meaning (analyze). A family's patch.toml `[parts]` maps
# each of its templates to one of them; without `[parts]`, DEFAULT_PARTS (the eviction's three).
ANCHORS = (
    "batch-surgery",       # the batch's surgery: a server_batch member, or a free function before the server
    "server-method",       # a method of the server context, before the one holding the decode handler
    "server-public",       # members of the server context that other threads may use (its public section)
    "decode-handler",      # replaces upstream's all-slots error loop (the TODO) in the decode handler
    "slot-state-enum",     # a value appended to enum slot_state
    "before-pre-decode",   # a statement before update_slots' pre_decode() call
    "slot-json",           # a field of a slot's /slots entry, after upstream's is_processing
    "prompt-loop-skip",    # a statement in the prompt loop (batch build), where it skips a slot not processing
    "task-admission",      # a statement before a new task's slot is chosen, where upstream defers a task
    "prompt-handover",     # the first statement of the decode handler's loop handing a prompt to n_cmpl children
    "metrics-text",        # a statement where /metrics' text is final, at every such place; the part's
                           # METRICS_SINK is that place's sink (`res->data +=`, `prometheus <<`)
)
DEFAULT_PARTS = {"surgery.cpp.j2": "batch-surgery", "helper.cpp.j2": "server-method", "hook.cpp.j2": "decode-handler"}


def render(source: bytes, facts: Facts, spec: PatchSpec, *, stage: int, policy: str = "largest",
           variant: str | None = None) -> bytes:
    if policy not in spec.policies:
        raise UsageError(f"unknown policy '{policy}'; choose from {', '.join(spec.policies)}.")
    if variant and variant not in spec.variants:
        raise UsageError(f"unknown variant '{variant}'; known: {', '.join(spec.variants) or 'none'}.")
    if spec.layouts and facts.layout not in spec.layouts:
        raise LayoutError(f"{facts.file}: layout {facts.layout}; '{spec.name}' is written for layouts "
                          f"{' and '.join(spec.layouts)} (their slot memory and prompt API: a pre_decode() step, "
                          "prompt_clear(), common_memory); nothing was written.")
    env = templates(spec)
    ctx = dict(f=facts, helper=spec.helper, surgery=SURGERY, policy=policy, stage=stage, **spec.params)
    edit = _variant_edit(env, spec, variant, ctx) if variant else (lambda text: text)
    member = facts.batch_model != "plain"
    edits: list[tuple[int, int, str]] = []  # (start, end, text): [start, end) replaced, an insertion if empty
    # a part whose optional anchor the layout lacks is not rendered at all (nothing to insert)
    parts = [(t, a) for t, a in spec.parts if _present(facts, a)]
    rendered = edit({template: env.get_template(template).render(**ctx) for template, _ in parts})
    for template, anchor in parts:
        text = rendered[template]
        if anchor == "decode-handler":
            # the hook takes the place of upstream's TODO, or goes first in the branch
            hook = "\n" + textwrap.indent(text.rstrip("\n"), facts.hook_indent, lambda l: l.strip() != "")
            end = facts.hook_end if facts.hook_end > 0 else facts.hook_at
            edits.append((facts.hook_at, end, hook + ("" if facts.hook_end > 0 else "\n")))
            continue
        if anchor == "metrics-text":
            if not facts.metrics_sites:
                raise LayoutError(f"{facts.file}: layout {facts.layout} has no place where /metrics' text is "
                                  f"final, for '{spec.name}''s counters.")
            edits += [(at, at, textwrap.indent(text.replace("METRICS_SINK", sink), indent, lambda l: l.strip() != ""))
                      for at, indent, sink in facts.metrics_sites]
            continue
        at, indent = _anchor(facts, anchor, spec)
        text = textwrap.indent(text, indent, lambda l: l.strip() != "")
        if anchor == "batch-surgery":
            text = ("\n" + text) if member else (text + "\n")
        elif anchor in ("server-method", "server-public"):
            text += "\n"
        edits.append((at, at, text))
    if not any(anchor == "decode-handler" for _, anchor in spec.parts):
        raise UsageError(f"'{spec.name}' has no part at the decode-handler anchor: nothing would call it.")
    assert facts.surgery_at < facts.helper_at < facts.hook_at
    # edit from the latest offset back, so the earlier ones stay valid
    out = source
    for start, end, text in sorted(edits, key=lambda e: -e[0]):
        out = out[:start] + text.encode() + out[end:]
    return out


# A variant (a mutant of the catalog) is the right patch's rendered code edited: patch.toml's
# [variants.NAME] `edit`, a list of {find: a regular expression over each rendered part, to: a
# Jinja2 template of the replacement that sees the facts and the match's groups as m}, and `where`,
# a Jinja2 expression over the facts saying on which layouts it applies. The templates a maintainer
# reads hold the right patch only. `env`: the server environment the variant is judged under (a
# budget it ignores shows only where the budget says something). `workloads`: the ones that kill it,
# which `patchkit mutants --patch FAMILY` runs by default (no list of them in the code).
VARIANT_KEYS = {"class", "what", "killer", "edit", "where", "env", "workloads"}


def _check_variant(meta: Path, name: str, v: dict) -> None:
    unknown = set(v) - VARIANT_KEYS
    edits = v.get("edit")
    if unknown or not edits or not all(isinstance(e, dict) and set(e) == {"find", "to"} for e in edits):
        raise UsageError(f"{meta}: variant '{name}' must be {{class, what, killer, edit = [{{find, to}}, ...], "
                         f"where?, env?, workloads?}}" + (f"; unknown keys {sorted(unknown)}" if unknown else "") + ".")
    for e in edits:
        try:
            re.compile(e["find"])
        except re.error as err:
            raise UsageError(f"{meta}: variant '{name}': `find` {e['find']!r} is not a regular expression: {err}.")


def _variant_edit(env: jinja2.Environment, spec: PatchSpec, variant: str, ctx: dict):
    """The edit of rendered parts that makes `variant`: every `find` must match some part where the
    variant applies, or the right patch changed under it (an error, never the right patch under a
    mutant's name). Where it does not apply, the parts stay as they are (the campaign then says
    'not-applicable' for this layout)."""
    v = spec.variants[variant]
    if "where" in v and not env.compile_expression(v["where"])(**ctx):
        return lambda parts: parts

    def edit(parts: dict[str, str]) -> dict[str, str]:
        out = dict(parts)
        for k, e in enumerate(v["edit"], 1):
            to = env.from_string(e["to"])
            hits = 0
            for name, text in out.items():
                out[name], n = re.subn(e["find"], lambda m: to.render(**ctx, m=[g or "" for g in (m[0], *m.groups())]),
                                       text)
                hits += n
            if not hits:
                raise PatchError(f"variant '{variant}' of '{spec.name}': edit {k} finds nothing in the rendered patch "
                                 f"on layout {ctx['f'].layout} ({e['find']!r}): the right patch changed under it; "
                                 "update its patch.toml.")
        return out
    return edit


# Anchors a layout may lack without the patch being wrong there: layout C hands a prompt to its
# n_cmpl children outside the decode handler, so there is no hand-over to guard in it.
OPTIONAL_ANCHORS = {"prompt-handover": "handover_at"}


def _present(facts: Facts, anchor: str) -> bool:
    return anchor not in OPTIONAL_ANCHORS or getattr(facts, OPTIONAL_ANCHORS[anchor]) >= 0


def _anchor(facts: Facts, anchor: str, spec: PatchSpec) -> tuple[int, str]:
    """(offset, indent) of an insertion point the analysis found by meaning."""
    if anchor == "batch-surgery":
        return facts.surgery_at, "    " if facts.batch_model != "plain" else ""
    if anchor == "server-method":
        return facts.helper_at, facts.helper_indent
    if anchor == "server-public":
        return (facts.public_at if facts.public_at >= 0 else facts.helper_at), facts.helper_indent
    if anchor == "prompt-handover":
        return facts.handover_at, facts.handover_indent
    at, indent, what = {"slot-state-enum": (facts.enum_at, facts.enum_indent, "enum slot_state"),
                        "before-pre-decode": (facts.resume_at, facts.resume_indent,
                                              "a pre_decode() step in update_slots"),
                        "slot-json": (facts.slot_json_at, facts.slot_json_indent,
                                      "a slot's is_processing in /slots"),
                        "prompt-loop-skip": (facts.skip_at, facts.skip_indent,
                                             "the prompt loop skipping a slot"),
                        "task-admission": (facts.admit_at, facts.admit_indent,
                                           "a new task's slot chosen where upstream defers a task")}[anchor]
    if at < 0:
        raise LayoutError(f"{facts.file}: layout {facts.layout} has no place for '{spec.name}' ({what}); "
                          "the preemption patches are written for layouts C2 and D.")
    return at, indent


def stage_texts(source: bytes, facts: Facts, spec: PatchSpec, policy: str = "largest",
                variant: str | None = None) -> list[tuple[int, bytes]]:
    """Each stage's full render, skipping stages that change nothing on this layout."""
    out, prev = [], source
    for k in range(1, len(spec.stages) + 1):
        text = render(source, facts, spec, stage=k, policy=policy, variant=variant)
        if text != prev:
            out.append((k, text))
            prev = text
    return out
