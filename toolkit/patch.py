"""The apply engine: find the layout by meaning, render the patch for it, commit the series.

1. `analyze`: libclang parses the server TU with its compile_commands.json flags; the
   layout is read from the AST (which structs, fields and methods exist) and the anchors
   are found by meaning: the method holding the `n_batch == 1 && ret == 1` branch, the
   loop that sends the error to every slot, the decode call's context, the batch offset.
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
from .errors import LayoutError, PatchError, UsageError  # noqa: F401 (LayoutError re-exported)

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
# Where each layout keeps the server's decode loop, newest first.
SERVER_FILES = ("tools/server/server-context.cpp", "tools/server/server.cpp", "examples/server/server-context.cpp",
                "examples/server/server.cpp")
EXCEEDED = '"Context size has been exceeded."'


@dataclass(frozen=True)
class Facts:
    """What the AST says about one tree: the layout and every anchor the templates need."""
    layout: str
    file: str                 # repo-relative path of the patched TU
    handler: str              # the method holding the n_batch == 1 && ret == 1 branch
    off: str                  # the batch-offset variable at that point
    ctx: str                  # the llama_context expression the decode call uses
    n_batch: str
    retry: str                # how the handler retries the same offset
    batch_model: str          # plain (llama_batch) | tokens (server_batch + llama_batch) | view (common_batch)
    has_embd: bool
    has_tokens_ptr: bool
    slot_batched_member: bool
    has_spec_i_batch: bool
    terminate: str            # the per-slot statements of the error-every-slot loop
    frees_cells: bool         # whether those statements free the slot's KV cells
    cache_tokens: str         # the slot's token-cache field (cleared with the cells)
    task_id: str              # expression (SLOT = a slot pointer) ordering slots by arrival
    surgery_at: int           # byte offset: the batch surgery goes here (a server_batch member: before the
                              # struct's closing brace; a plain llama_batch: a free function before the server struct)
    helper_at: int            # byte offset: insert the helper method here
    helper_indent: str
    hook_at: int              # byte offset: just after '{' of the n_batch == 1 && ret == 1 branch
    hook_indent: str
    hook_end: int = -1        # the upstream TODO this patch resolves, replaced by the hook: [hook_at, hook_end)
    # per-slot quantities a WRONG patch might choose its victim by (mutants only; SLOT = a slot reference)
    prompt_len: str = "SLOT.n_prompt_tokens"
    generated: str = "SLOT.n_decoded"
    # anchors the preemption families need (-1: this layout has none)
    enum_at: int = -1         # line start of the closing brace of `enum slot_state` (a new state goes here)
    enum_indent: str = ""
    resume_at: int = -1       # line start of update_slots' statement that calls pre_decode() (parked slots
    resume_indent: str = ""   # come back just before the batch is built)


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
                     parts, tuple(d.get("equivalent", ())))


def all_policies() -> list[str]:
    """Every victim policy some patch offers, in first-seen order (the CLI's choices)."""
    return list(dict.fromkeys(p for f in families() for p in load_patch(f).policies))


def families() -> list[str]:
    """Every family: a folder with a patch.toml under patches/ or a PATCHKIT_FAMILIES directory."""
    return sorted({p.name for d in family_dirs() if d.is_dir() for p in d.iterdir() if (p / "patch.toml").exists()})


# ------------------------------------------------------------------ analysis

def find_server_file(root: Path) -> str:
    for rel in SERVER_FILES:
        p = root / rel
        if p.exists() and (EXCEEDED.encode() in p.read_bytes() or b"process_batch_tokens" in p.read_bytes()):
            return rel
    raise LayoutError(f"none of {', '.join(SERVER_FILES)} in {root} holds the server's decode loop.",
                      hint="Is this a llama.cpp tree?")


def _tokens(cursor) -> str:
    return "".join(t.spelling for t in cursor.get_tokens())


def _walk(cursor):
    stack = [cursor]
    while stack:
        c = stack.pop()
        yield c
        stack.extend(reversed(list(c.get_children())))


def _line_start(text: bytes, offset: int) -> int:
    return text.rfind(b"\n", 0, offset) + 1


def _indent_at(text: bytes, offset: int) -> str:
    start = _line_start(text, offset)
    line = text[start:offset].decode()
    return line[: len(line) - len(line.lstrip())]


def declarations(tu) -> tuple[dict[str, dict[str, str]], list]:
    """Main-file structs ({name: {field: type}}) and method definitions [(owner, cursor)].
    The struct cursors themselves are in structs[name]["<cursor>"]."""
    from clang.cindex import CursorKind as K

    main = str(tu.spelling)
    structs: dict[str, dict[str, str]] = {}
    methods = []
    for top in tu.cursor.get_children():
        if not top.location.file or str(top.location.file) != main:
            continue
        if top.kind in (K.STRUCT_DECL, K.CLASS_DECL) and top.is_definition():
            fields = structs.setdefault(top.spelling, {})
            fields["<cursor>"] = top
            for ch in top.get_children():
                if ch.kind == K.FIELD_DECL:
                    fields[ch.spelling] = ch.type.spelling
                elif ch.kind == K.CXX_METHOD and ch.is_definition():
                    methods.append((top.spelling, ch))
        elif top.kind == K.CXX_METHOD and top.is_definition():
            methods.append((top.semantic_parent.spelling if top.semantic_parent else "", top))
    return structs, methods


def analyze(tu, source: bytes, rel: str) -> Facts:
    """Read the layout and anchors from a parsed TU (libclang) of `source`."""
    from clang.cindex import CursorKind as K

    structs, methods = declarations(tu)
    missing = []
    literal_at = source.find(EXCEEDED.encode())
    handler = None
    for owner, m in methods:
        if literal_at >= 0 and m.extent.start.offset <= literal_at < m.extent.end.offset:
            handler = (owner, m)
    if literal_at < 0:
        missing.append(f"the {EXCEEDED} error (this server reports a full KV cache differently)")
    if handler is None:
        raise LayoutError(_missing_msg(rel, missing + ["a method holding the context-exceeded error"]),
                          hint=_fork_hint(source))
    owner, method = handler

    branch = loop = decode_call = None
    enclosing_for = None
    for c in _walk(method):
        if c.kind == K.IF_STMT and branch is None:
            kids = list(c.get_children())
            if kids and _tokens(kids[0]).replace("(", "").replace(")", "") == "n_batch==1&&ret==1":
                branch = c
        elif c.kind == K.CXX_FOR_RANGE_STMT and loop is None:
            kids = list(c.get_children())
            body = _tokens(kids[-1]) if kids else ""
            if "send_error(slot,err)" in body and any(_tokens(k) == "slots" for k in kids[:-1]):
                loop = c
        elif c.kind == K.CALL_EXPR and c.spelling in ("llama_decode", "llama_process") and decode_call is None:
            decode_call = c
    if branch is None:
        missing.append("the `n_batch == 1 && ret == 1` branch")
    if loop is None:
        missing.append("the loop that sends the error to every slot")
    if decode_call is None:
        missing.append("the llama_decode/llama_process call")
    if missing:
        raise LayoutError(_missing_msg(rel, missing), hint=_fork_hint(source))

    for c in _walk(method):  # the innermost for-loop around the branch, for loop-style handlers
        if c.kind == K.FOR_STMT and c.extent.start.offset < branch.extent.start.offset < c.extent.end.offset:
            enclosing_for = c

    params = [p.spelling for p in method.get_children() if p.kind == K.PARM_DECL]
    returns_bool = method.result_type.spelling == "bool"
    if "off" in params and returns_bool:
        off, retry = "off", "return false;"
    elif enclosing_for is not None:
        var = next((d for d in _walk(enclosing_for) if d.kind == K.VAR_DECL), None)
        if var is None:
            raise LayoutError(_missing_msg(rel, ["the batch offset variable of the decode loop"]))
        off, retry = var.spelling, "continue;"
    else:
        raise LayoutError(_missing_msg(rel, ["the batch offset (`off` parameter or loop variable)"]))
    args = [a for a in decode_call.get_arguments()]
    ctx = _tokens(args[0]) if args else "ctx"

    batch_struct = structs.get("server_batch")
    ctx_fields = structs.get(owner, {})
    slot = structs.get("server_slot", {})
    if batch_struct and "view" in batch_struct:
        batch_model = "view"
    elif batch_struct and "tokens" in batch_struct and "batch" in batch_struct:
        batch_model = "tokens"
    elif "llama_batch" in ctx_fields.get("batch", ""):
        batch_model = "plain"
    else:
        raise LayoutError(_missing_msg(rel, ["the server batch (server_batch struct or llama_batch member)"]))
    has_embd = bool(batch_struct and "has_embd" in batch_struct and "embd" in batch_struct)
    has_tokens_ptr = bool(batch_struct and "tokens_ptr" in batch_struct)
    if "i_batch" not in slot:
        raise LayoutError(_missing_msg(rel, ["server_slot::i_batch"]))

    body_cursor = list(loop.get_children())[-1]
    b0, b1 = body_cursor.extent.start.offset, body_cursor.extent.end.offset
    inner = source[b0:b1].decode()
    if inner.startswith("{"):
        inner = inner[1:inner.rindex("}")]
    terminate = textwrap.dedent(inner.strip("\n")).strip()
    terminate = unguard(terminate)
    frees = "prompt_clear" in terminate or "seq_rm" in terminate
    cache_tokens = "cache_tokens" if "cache_tokens" in slot else "prompt.tokens"
    task_id = "SLOT->id_task" if "id_task" in slot else "(SLOT->task ? SLOT->task->id : -1)"

    if batch_model == "plain":
        layout = "A" if rel.endswith("server.cpp") else "B"
    elif batch_model == "view":
        layout = "D"
    else:
        layout = "C2" if has_embd else "C"

    # the helper goes before the handler, the surgery before the server struct: each above the
    # comment block that documents what follows
    m_start = _above_comments(source, method.extent.start.offset)
    owner_cursor = structs.get(owner, {}).get("<cursor>")
    if owner_cursor is None:
        raise LayoutError(_missing_msg(rel, [f"the definition of {owner}"]))
    s_start = _above_comments(source, owner_cursor.extent.start.offset)
    if batch_model != "plain":
        # a server_batch member: just before the struct's closing brace
        b_end = batch_struct["<cursor>"].extent.end.offset
        s_start = _line_start(source, source.rindex(b"}", 0, b_end + 1))
    body = next(ch for ch in branch.get_children() if ch.kind == K.COMPOUND_STMT)
    hook_at = body.extent.start.offset + 1
    first_stmt = next(iter(body.get_children()), None)
    hook_indent = _indent_at(source, first_stmt.extent.start.offset) if first_stmt else \
        _indent_at(source, branch.extent.start.offset) + "    "
    # upstream's TODO in this branch asks for exactly this patch: the hook takes its place
    hook_end = -1
    todo = re.compile(rb"\n[ \t]*// TODO: try to terminate only the largest[^\n]*(\n[ \t]*//[^\n]*)*")
    m = todo.match(source, hook_at) or todo.match(source, hook_at - 1)
    if m and m.end() <= body.extent.end.offset:
        hook_end = m.end()
    prompt_len = "(int32_t) SLOT.task->n_tokens()" if "->task" in task_id else "(int32_t) SLOT.n_prompt_tokens"
    generated = "SLOT.n_decoded" if "n_decoded" in slot else "SLOT.stats.n_gen"
    enum_at, enum_indent, resume_at, resume_indent = _preemption_anchors(tu, source, owner, methods)
    return Facts(layout, rel, method.spelling, off, ctx, "n_batch", retry, batch_model, has_embd, has_tokens_ptr,
                 bool(batch_struct and "slot_batched" in batch_struct), "spec_i_batch" in slot, terminate, frees,
                 cache_tokens, task_id, s_start, m_start, _indent_at(source, method.extent.start.offset), hook_at,
                 hook_indent, hook_end, prompt_len, generated, enum_at, enum_indent, resume_at, resume_indent)


def _preemption_anchors(tu, source: bytes, owner: str, methods) -> tuple[int, str, int, str]:
    """Where a preemption family adds its slot state (the end of `enum slot_state`) and its resume
    call (update_slots' statement that calls pre_decode(): parked slots return before the batch is
    built). Layouts without a pre_decode() step (A, B, C) have no resume point: -1."""
    from clang.cindex import CursorKind as K

    enum_at, enum_indent = -1, ""
    for top in tu.cursor.get_children():
        if top.kind == K.ENUM_DECL and top.spelling == "slot_state" and top.is_definition():
            last = list(top.get_children())[-1]
            enum_indent = _indent_at(source, last.extent.start.offset)
            enum_at = _line_start(source, source.rindex(b"}", 0, top.extent.end.offset + 1))
    resume_at, resume_indent = -1, ""
    update = next((m for o, m in methods if o == owner and m.spelling == "update_slots"), None)
    body = next((c for c in update.get_children() if c.kind == K.COMPOUND_STMT), None) if update else None
    for stmt in body.get_children() if body is not None else ():
        if any(c.kind == K.CALL_EXPR and c.spelling == "pre_decode" for c in _walk(stmt)):
            resume_at = _line_start(source, stmt.extent.start.offset)
            resume_indent = _indent_at(source, stmt.extent.start.offset)
            break
    return enum_at, enum_indent, resume_at, resume_indent


def unguard(terminate: str) -> str:
    """The all-slots loop's body, as the victim's termination: without its `if (slot.is_processing())`
    wrapper (the victim is in play by choice: always true) and without its comments (they explain
    the all-slots path). Anything else stays verbatim."""
    m = re.fullmatch(r"if \(slot\.is_processing\(\)\) \{\n(.*)\n\}", terminate, re.S)
    if m and not re.search(r"\n\}", m.group(1)):  # no block closed inside: one guarded body
        terminate = textwrap.dedent(m.group(1)).strip()
    lines = [l for l in terminate.splitlines() if not l.strip().startswith("//")]
    return re.sub(r"\n{2,}", "\n", "\n".join(lines)).strip()


def _above_comments(source: bytes, offset: int) -> int:
    start = _line_start(source, offset)
    while start > 0:
        prev = _line_start(source, start - 1)
        if source[prev:start].strip().startswith(b"//"):
            start = prev
        else:
            break
    return start


def precheck(rel: str, source: bytes) -> bool:
    """Cheap text test before any configure or parse: True when `source` (the file at `rel`) has
    the context-exceeded error the anchors need; LayoutError, with the fork named, when it is a
    server decode loop without it (ik_llama.cpp, layout E); False when it is not a server at all."""
    if EXCEEDED.encode() in source:
        return True
    if b"process_batch_tokens" in source:
        raise LayoutError(_missing_msg(rel, [f"the {EXCEEDED} error", "the `n_batch == 1 && ret == 1` branch"]),
                          hint=_fork_hint(source))
    return False


def _missing_msg(rel: str, missing: list[str]) -> str:
    return f"{rel}: unknown layout; anchors not found: " + "; ".join(missing) + "."


def _fork_hint(source: bytes) -> str:
    if b"process_batch_tokens" in source and b"KV cache is full" in source:
        return ("This is ik_llama.cpp (layout E): its process_batch_tokens() treats `n_batch == 1 || ret < 0` as one "
                "error and has no unified KV pool (--kv-unified), so there is no shared-pool overflow to evict from; "
                "patchkit does not patch it.")
    return "Supported layouts: A, B, C, C2, D (docs/layouts.md)."


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
    "decode-handler",      # replaces upstream's all-slots error loop (the TODO) in the decode handler
    "slot-state-enum",     # a value appended to enum slot_state
    "before-pre-decode",   # a statement before update_slots' pre_decode() call
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
    edits: list[tuple[int, str]] = []  # (offset, text) inserted; the decode handler's part replaces a range
    hook = None
    rendered = {template: env.get_template(template).render(**ctx) for template, _ in spec.parts}
    rendered = edit(rendered)
    for template, anchor in spec.parts:
        text = rendered[template]
        if anchor == "decode-handler":
            hook = "\n" + textwrap.indent(text.rstrip("\n"), facts.hook_indent, lambda l: l.strip() != "")
            continue
        at, indent = _anchor(facts, anchor, spec)
        text = textwrap.indent(text, indent, lambda l: l.strip() != "")
        if anchor == "batch-surgery":
            text = ("\n" + text) if member else (text + "\n")
        elif anchor == "server-method":
            text += "\n"
        edits.append((at, text))
    if hook is None:
        raise UsageError(f"'{spec.name}' has no part at the decode-handler anchor: nothing would call it.")
    hook_end = facts.hook_end if facts.hook_end > 0 else facts.hook_at
    # edit from the latest offset back, so the earlier ones stay valid
    assert facts.surgery_at < facts.helper_at < facts.hook_at <= hook_end
    out = source[: facts.hook_at] + hook.encode() + (b"" if facts.hook_end > 0 else b"\n") + source[hook_end:]
    for at, text in sorted(edits, key=lambda e: -e[0]):
        out = out[:at] + text.encode() + out[at:]
    return out


# A variant (a mutant of the catalog) is the right patch's rendered code edited: patch.toml's
# [variants.NAME] `edit`, a list of {find: a regular expression over each rendered part, to: a
# Jinja2 template of the replacement that sees the facts and the match's groups as m}, and `where`,
# a Jinja2 expression over the facts saying on which layouts it applies. The templates a maintainer
# reads hold the right patch only.
VARIANT_KEYS = {"class", "what", "killer", "edit", "where"}


def _check_variant(meta: Path, name: str, v: dict) -> None:
    unknown = set(v) - VARIANT_KEYS
    edits = v.get("edit")
    if unknown or not edits or not all(isinstance(e, dict) and set(e) == {"find", "to"} for e in edits):
        raise UsageError(f"{meta}: variant '{name}' must be {{class, what, killer, edit = [{{find, to}}, ...], "
                         f"where?}}" + (f"; unknown keys {sorted(unknown)}" if unknown else "") + ".")
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


def _anchor(facts: Facts, anchor: str, spec: PatchSpec) -> tuple[int, str]:
    """(offset, indent) of an insertion point the analysis found by meaning."""
    if anchor == "batch-surgery":
        return facts.surgery_at, "    " if facts.batch_model != "plain" else ""
    if anchor == "server-method":
        return facts.helper_at, facts.helper_indent
    at, indent, what = {"slot-state-enum": (facts.enum_at, facts.enum_indent, "enum slot_state"),
                        "before-pre-decode": (facts.resume_at, facts.resume_indent,
                                              "a pre_decode() step in update_slots")}[anchor]
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
