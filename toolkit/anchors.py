"""Find the layout by meaning: libclang parses the server TU with its compile_commands.json
flags, and the layout is read from the AST (which structs, fields and methods exist) and every
anchor a patch needs is found: the method holding the `n_batch == 1 && ret == 1` branch, the loop
that sends the error to every slot, the decode call's context, the batch offset, and for the
preemption families the slot-state enum and update_slots' pre_decode() step. The result is one
frozen `Facts` per tree; patch.render fills the templates from it.
"""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from .errors import LayoutError

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
    # where /metrics' Prometheus text is final: (offset, indent, sink) per place, the sink being the
    # expression a family's counters are written into (`res->data +=`, `prometheus <<`)
    metrics_sites: tuple[tuple[int, str, str], ...] = ()
    public_at: int = -1       # line start after the server struct's first `public:` (-1: it has none, a
                              # struct's members are public where the helper goes)
    slot_json_at: int = -1    # line start after `{"is_processing", is_processing()},` in the slot's /slots
    slot_json_indent: str = ""  # JSON (-1: not there)
    skip_at: int = -1         # line start after the prompt loop's `if (!slot.is_processing()) { return; }`
    skip_indent: str = ""     # (the one followed by the can_batch_with check): a slot skipped from the batch here
    admit_at: int = -1        # line start of the statement that chooses a new task's slot (`get_available_slot(task)`
    admit_indent: str = ""    # in process_single_task), in a case that defers a task with `queue_tasks.defer`
    decode_yield: str = ""    # the call the server's decode runs inside (C2, D: `queue_tasks.yield_to_queue`, whose
                              # worker answers /metrics and /slots meanwhile); "": a bare decode
    handover_at: int = -1     # line start of the first statement of the decode handler's loop that hands a
    handover_indent: str = "" # parent's prompt to its n_cmpl children (`copy_state_to`); -1: not in the handler
    handover_slot: str = ""   # that loop's slot variable
    handover_view: str = ""   # the view's size where the handler restores n_batch before that loop (B:
                              # `n_tokens`); "": n_batch is the view's size there (C, C2, D)
    batched_per_view: bool = False  # the handler, run once per view of the batch, reads batch.slot_batched
                                    # (C: decode() sets the batch's LoRA adapters and embeddings mode from
                                    # that slot on every view; C2, D: once per batch, before the views)

    def __post_init__(self):  # read back from the facts cache's JSON, the sites are lists
        object.__setattr__(self, "metrics_sites", tuple(tuple(s) for s in self.metrics_sites))


# The /metrics handler's text, final: a statement that assigns it (`res->data = res_task->to_metrics();`
# on C2 and D, `res->data = prometheus.str();` on B and C) is followed by an append; one that sends it
# (`res.set_content(prometheus.str(), ...)` on A) is preceded by a write into the stream. Found
# by text: the handler is a lambda in a route table, and these statements are the only two shapes
# upstream has used since the endpoint came (one place each, two on D: a sleeping server's too).
METRICS_ASSIGN = re.compile(rb"^([ \t]*)([\w.>-]+) = [\w.>-]*(?:to_metrics\(\)|prometheus\.str\(\));[^\n]*\n", re.M)
METRICS_SEND = re.compile(rb"^([ \t]*)\w+\.set_content\(prometheus\.str\(\)", re.M)


# A slot's /slots entry: the preemption families add their state beside upstream's is_processing.
SLOT_JSON = re.compile(rb'^([ \t]*)\{"is_processing", +is_processing\(\)\},[^\n]*\n', re.M)


def metrics_sites(source: bytes) -> tuple[tuple[int, str, str], ...]:
    sites = [(m.end(), m[1].decode(), m[2].decode() + " +=") for m in METRICS_ASSIGN.finditer(source)]
    sites += [(m.start(), m[1].decode(), "prometheus <<") for m in METRICS_SEND.finditer(source)]
    return tuple(sorted(sites))


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
    # the decode handed to the task queue's yield (its worker answers read-only tasks while it runs)
    yields = [c for c in _walk(method) if c.kind == K.CALL_EXPR and c.spelling == "yield_to_queue"
              and decode_call is not None
              and c.extent.start.offset < decode_call.extent.start.offset < c.extent.end.offset]
    decode_yield = _tokens(next(yields[0].get_children())) if yields else ""
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
    public = next((ch for ch in owner_cursor.get_children() if ch.kind == K.CXX_ACCESS_SPEC_DECL
                   and ch.access_specifier.name == "PUBLIC"), None)
    public_at = source.index(b"\n", public.extent.start.offset) + 1 if public is not None else -1
    slot_json = SLOT_JSON.search(source)
    skip_at, skip_indent = _prompt_loop_skip(source, owner, methods)
    admit_at, admit_indent = _task_admission(source, owner, methods)
    batched_member = bool(batch_struct and "slot_batched" in batch_struct)
    return Facts(layout, rel, method.spelling, off, ctx, "n_batch", retry, batch_model, has_embd, has_tokens_ptr,
                 "spec_i_batch" in slot, terminate, frees,
                 cache_tokens, task_id, s_start, m_start, _indent_at(source, method.extent.start.offset), hook_at,
                 hook_indent, hook_end, prompt_len, generated, enum_at, enum_indent, resume_at, resume_indent,
                 metrics_sites(source), public_at, slot_json.end() if slot_json else -1,
                 slot_json[1].decode() if slot_json else "", skip_at, skip_indent, admit_at, admit_indent,
                 decode_yield, *_handover(source, owner, methods, method.spelling),
                 batched_member and "slot_batched" in _tokens(method))


def _handover(source: bytes, owner: str, methods, handler: str) -> tuple[int, str, str, str]:
    """Where the decode handler (B: update_slots(), C to D: decode(), once per batch view) hands a
    parent's prompt to its n_cmpl children: the range-for over the slots whose body calls
    `copy_state_to`. It runs after every view, so a batch decoded in several views (a retry after a
    full KV cache) hands the prompt over before its last entries are decoded. (first statement's line
    start, its indent, the loop's slot variable, the view's size if n_batch is not it there);
    (-1, "", "", ""): not in the handler (layout A).

    The view's size: on C to D the handler is called with the view's n_batch and the view ends at
    off + n_batch (or at the batch's end, past every index). On B the handler's own loop restores
    n_batch to the full size on success, BEFORE the hand-over loop, so there the view ends at
    off + the variable the view was cut with (`const int32_t n_tokens = std::min(n_batch, ...)`)."""
    from clang.cindex import CursorKind as K

    def inside(a, b) -> bool:
        return b.extent.start.offset <= a.extent.start.offset and a.extent.end.offset <= b.extent.end.offset

    for m in (m for o, m in methods if o == owner and m.spelling == handler):
        for c in _walk(m):
            if c.kind != K.CXX_FOR_RANGE_STMT or "copy_state_to" not in _tokens(c):
                continue
            # the view's size: declared in the innermost loop around this one, before it
            loop = max((x for x in _walk(m) if x.kind in (K.FOR_STMT, K.WHILE_STMT) and inside(c, x)),
                       key=lambda x: x.extent.start.offset, default=None)
            view = next((x.spelling for x in _walk(loop) if x.kind == K.VAR_DECL
                         and x.extent.end.offset < c.extent.start.offset
                         and re.search(r"=(std::)?min\(n_batch,", _tokens(x))), "") if loop is not None else ""
            var = next((k for k in c.get_children() if k.kind == K.VAR_DECL), None)
            body = next((k for k in c.get_children() if k.kind == K.COMPOUND_STMT), None)
            first = next(iter(body.get_children()), None) if body is not None else None
            if var is None or first is None:
                continue
            return _line_start(source, first.extent.start.offset), _indent_at(source, first.extent.start.offset), \
                var.spelling, view
    return -1, "", "", ""


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


def _prompt_loop_skip(source: bytes, owner: str, methods) -> tuple[int, str]:
    """Where the prompt loop (pre_decode() on C2 and D) skips a slot that is not processing: the
    statement `if (!slot.is_processing()) { return; }` followed by the `can_batch_with` check.
    A slot past it can become the batch's first slot, whose adapters and task type the others must
    share. (-1, ""): not found (a layout without that loop)."""
    from clang.cindex import CursorKind as K

    for c in (c for o, m in methods if o == owner for c in _walk(m)):
        if c.kind != K.COMPOUND_STMT:
            continue
        kids = list(c.get_children())
        for a, b in zip(kids, kids[1:]):
            if a.kind == K.IF_STMT and b.kind == K.IF_STMT and "can_batch_with" in _tokens(b) and \
                    _tokens(next(a.get_children())) in ("!slot.is_processing()", "(!slot.is_processing())"):
                return source.index(b"\n", a.extent.end.offset) + 1, _indent_at(source, a.extent.start.offset)
    return -1, ""


# upstream's own answer to a task that cannot start now, in the case that admits a new task: the
# admission's defer is written exactly so (the same queue, the same moved task, the same break)
UPSTREAM_DEFER = "queue_tasks.defer(std::move(task));"


def _task_admission(source: bytes, owner: str, methods) -> tuple[int, str]:
    """Where a new task is admitted (process_single_task on C2 and D): the statement that chooses
    its slot, `server_slot * slot = get_available_slot(task);`, in a block that defers a task that
    cannot start (`queue_tasks.defer(std::move(task)); break;`). A task may be held back there
    before any slot is chosen. (-1, ""): not found."""
    from clang.cindex import CursorKind as K

    for m in (m for o, m in methods if o == owner and m.spelling == "process_single_task"):
        for c in _walk(m):
            if c.kind != K.COMPOUND_STMT:
                continue
            kids = list(c.get_children())
            if UPSTREAM_DEFER not in _tokens(c):
                continue
            for k in kids:
                if k.kind == K.DECL_STMT and "=get_available_slot(task)" in _tokens(k):
                    return _line_start(source, k.extent.start.offset), _indent_at(source, k.extent.start.offset)
    return -1, ""


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
