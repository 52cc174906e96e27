"""The catalog's variants compiled together (issue 37): ONE build of a family's TU holds every
designed wrong patch of patch.toml `[variants]`, each selected at run time (PATCHKIT_VARIANT=K),
as the operator mutants already are (toolkit/operators.py).

A variant is the right patch's rendered file with some regular-expression edits, not an AST
site, so its switch is placed by statements: where the variant differs from the right patch
(a line diff), the innermost block `{...}` holding the difference is found in libclang's AST,
and from the first statement the difference touches to that block's closing brace both
versions are kept:

    if (patchkit_variant(K)) { // patchkit variant K
        <the variant's statements, to the end of the block>
    } else { // patchkit variant K: the right patch
        <the right patch's statements, to the end of the block>
    } // patchkit variant K

To the block's end, not to the last changed line: a declaration among the changed statements
stays in scope for every statement that uses it. Differences in two functions give one such
switch in each. A variant whose difference is outside any function body (a member, an enum), or
whose switch does not compile (a case label, a jump past a declaration: found from the
compiler's error lines, as operators.stillborn does), is built alone, as before.

The schema is checked before it is built: for every variant K, the schema with K selected
(`project`) is the variant's text line for line, and with none selected the right patch's; a
variant it does not reproduce is built alone (MISFIT: a defect of the rendering, never a verdict). The
right patch itself is never built from the schema: it stays the byte-identical rendered file,
and no template grows a switch.

Pure text and AST work here; mutate.py builds and runs it."""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

SWITCH = "patchkit_variant"
ENV = "PATCHKIT_VARIANT"
# The selector, after the TU's includes: the id is read once.
PRELUDE = f"""
static inline bool {SWITCH}(int k) {{
    static const int id = [] {{ const char * e = getenv("{ENV}"); return e ? atoi(e) : 0; }}();
    return id == k;
}}
"""
OPEN = re.compile(rf"^\s*if \({SWITCH}\((\d+)\)\) \{{ // patchkit variant \d+ \(.*\)$")
ELSE = re.compile(r"^\s*\} else \{ // patchkit variant (\d+): the right patch$")
CLOSE = re.compile(r"^\s*\} // patchkit variant (\d+)$")


@dataclass(frozen=True)
class Block:
    """A compound statement of the right patch's file: the lines of its braces and, for each
    statement in it, (first line, first column, last line); 1-based, as libclang counts."""
    open: int
    close: int
    children: tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class Region:
    variant: str
    start: int                # the right file's lines start..end-1 are switched
    end: int                  # the block's closing-brace line
    lines: tuple[str, ...]    # what the variant has there


@dataclass(frozen=True)
class Schema:
    text: str
    ids: dict                 # variant name -> K, for the ones the schema holds
    alone: dict               # variant name -> why it is built on its own

    def env(self, name: str) -> dict[str, str]:
        return {ENV: str(self.ids[name])}


def regions(name: str, right: list[str], other: list[str], blocks: list[Block]) -> list[Region] | str:
    """Where `other` (a variant's lines) differs from `right`, as switchable regions; a str says
    why it cannot be switched."""
    ops = difflib.SequenceMatcher(None, right, other, autojunk=False).get_opcodes()
    hunks = [(i1 + 1, i2) for tag, i1, i2, _, _ in ops if tag != "equal"]   # lines a..b (b < a: an insertion before a)
    if not hunks:
        return "renders the right patch"

    def holds(b: Block, h) -> bool:
        return b.open < h[0] and h[1] < b.close

    def innermost(hs) -> Block | None:
        inside = [b for b in blocks if all(holds(b, h) for h in hs)]
        return max(inside, key=lambda b: (b.open, -b.close), default=None)

    def outermost(h) -> Block | None:
        inside = [b for b in blocks if holds(b, h)]
        return min(inside, key=lambda b: (b.open, -b.close), default=None)

    groups: dict[Block, list] = {}
    for h in hunks:
        top = outermost(h)
        if top is None:
            return f"changes line {h[0]}, not a statement inside a function body (a declaration outside one, or a brace's line)"
        groups.setdefault(top, []).append(h)

    def to_other(line: int, end: bool = False) -> int:
        """The variant's line for a right line outside the changes. Where a change starts at it,
        the region's start maps to the change's first line, its end to the line after it."""
        idx = line - 1
        for tag, i1, i2, j1, _ in ops:
            if tag == "equal" and i1 <= idx < i2 and (end or not any(
                    t != "equal" and x1 == idx for t, x1, *_ in ops)):
                return j1 + (idx - i1) + 1
            if tag != "equal" and idx == i1 and not end:
                return j1 + 1
        return len(other) + 1

    out = []
    for hs in groups.values():
        b = innermost(hs)
        a = min(h[0] for h in hs)
        after = [c for c in b.children if c[2] >= a]
        start = min(after[0][0], a) if after else a
        if after and after[0][0] == start:
            line, col = after[0][0], after[0][1]
            if right[line - 1][:col - 1].strip():
                return f"line {line}: a statement that does not start its line"
        before = [c for c in b.children if c[2] < a]
        if start <= b.open or (before and before[-1][2] >= start):
            return f"line {start}: shares a line with the statement or brace before it"
        if right[b.close - 1].lstrip()[:1] != "}":
            return f"line {b.close}: the block's closing brace does not start its line"
        out.append(Region(name, start, b.close, tuple(other[to_other(start) - 1:to_other(b.close, end=True) - 1])))
    return out


MISFIT = "selected, the schema is not its text (a defect of the schema's rendering): built alone"


def build(right_text: str, variants: dict[str, str], blocks: list[Block],
          skip: frozenset[str] = frozenset(), misfits: frozenset[str] = frozenset()) -> Schema:
    """The schema of every variant in `variants` (name -> rendered text, catalog order) but the
    ones in `skip` (stillborn: {name: why} kept in `alone`) and the `misfits` the check below found."""
    right = right_text.split("\n")
    alone: dict[str, str] = {n: "its switch did not compile" for n in skip}
    alone |= {n: MISFIT for n in misfits}
    regs: list[Region] = []
    ids: dict[str, int] = {}
    for k, (name, text) in enumerate(variants.items(), 1):
        if name in skip or name in misfits:
            continue
        r = regions(name, right, text.split("\n"), blocks)
        if isinstance(r, str):
            alone[name] = r
            continue
        # regions of different variants nest or are apart (each runs to its block's end); one
        # that crosses another is built alone
        if any(x.start < y.start < x.end < y.end or y.start < x.start < y.end < x.end for x in r for y in regs):
            alone[name] = "its difference crosses another variant's"
            continue
        regs += r
        ids[name] = k

    def render(lo: int, hi: int, inner: list[Region]) -> list[str]:
        out, pos = [], lo
        inner = sorted(inner, key=lambda x: (x.start, -x.end, ids[x.variant]))
        while inner:
            r = inner.pop(0)
            nested = [x for x in inner if r.start <= x.start and x.end <= r.end]
            inner = [x for x in inner if x not in nested]
            k = ids[r.variant]
            out += right[pos - 1:r.start - 1]
            out += [f"if ({SWITCH}({k})) {{ // patchkit variant {k} ({r.variant})", *r.lines,
                    f"}} else {{ // patchkit variant {k}: the right patch",
                    *render(r.start, r.end, nested), f"}} // patchkit variant {k}"]
            pos = r.end
        return out + right[pos - 1:hi - 1]

    text = _with_prelude("\n".join(render(1, len(right) + 1, regs))) if ids else right_text
    # the schema is built only as what it claims to be: a variant it does not reproduce is built
    # alone; if nothing selected is not the right patch, nothing shares the build
    wrong = {name for name, k in ids.items() if project(text, k) != variants[name]}
    if ids and not wrong and project(text, 0) != right_text:
        wrong = set(ids)
    if wrong:
        return build(right_text, variants, blocks, skip, misfits | wrong)
    return Schema(text, ids, alone)


def settle(right_text: str, variants: dict[str, str], blocks: list[Block], compiles, say=lambda s: None,
           first_error=lambda log: log.strip().split("\n")[-1]) -> Schema:
    """The schema that compiles: `compiles(schema)` builds it and returns "" or the compiler's
    output. A variant whose switch holds an error line is left out and built alone (the ids of
    the others stay); an error on no switch's line, or errors round after round, leave every
    variant alone: sharing the build is given up, never a verdict."""
    skip: frozenset[str] = frozenset()
    for _ in range(5):
        schema = build(right_text, variants, blocks, skip)
        if not schema.ids:
            return schema
        log = compiles(schema)
        if not log:
            return schema
        bad = stillborn(log, schema) - skip
        if not bad:
            why = f"the schema did not compile: {first_error(log)}"
            return Schema(right_text, {}, {n: why for n in variants})
        say(f"catalog schema: {sorted(bad)} do not compile switched; each is built alone")
        skip |= bad
    return Schema(right_text, {}, {n: "the schema did not compile after 5 rounds" for n in variants})


def project(text: str, k: int) -> str:
    """The schema's text as the compiler sees it with variant `k` selected (0: none), without
    the selector and the switches: the variant's text, or the right patch's."""
    lines = text.split("\n")
    if f"static inline bool {SWITCH}(int k)" in text:
        at = lines.index("#include <cstdlib> // patchkit variant selector")
        lines = lines[:at] + lines[at + 1 + len(PRELUDE.split("\n")):]
    out, keep = [], [True]   # keep: is the current branch the one selected
    for line in lines:
        if m := OPEN.match(line):
            keep.append(keep[-1] and int(m[1]) == k)
        elif m := ELSE.match(line):
            keep.pop()
            keep.append(keep[-1] and int(m[1]) != k)
        elif CLOSE.match(line):
            keep.pop()
        elif keep[-1]:
            out.append(line)
    return "\n".join(out)


def _with_prelude(body: str) -> str:
    """The selector after the last #include at depth 0 at the top of the file."""
    from .operators import after_includes

    return after_includes(body, ["#include <cstdlib> // patchkit variant selector", *PRELUDE.split("\n")])


def stillborn(errors: str, schema: Schema) -> set[str]:
    """The variants whose switch holds a line the compiler rejected (the innermost one)."""
    from .operators import error_lines

    bad = error_lines(errors)
    names = {k: n for n, k in schema.ids.items()}
    out, stack = set(), []
    for i, line in enumerate(schema.text.split("\n"), 1):
        if m := OPEN.match(line):
            stack.append(int(m[1]))
        elif CLOSE.match(line):
            stack.pop()
        if i in bad and stack:
            out.add(names[stack[-1]])
    return out


def blocks_of(tu) -> list[Block]:
    """Every compound statement of the parsed main file (libclang)."""
    from clang.cindex import CursorKind as K

    main = str(tu.spelling)
    out: list[Block] = []

    def walk(c) -> None:
        if c.kind == K.COMPOUND_STMT:
            kids = tuple((k.extent.start.line, k.extent.start.column, k.extent.end.line) for k in c.get_children())
            out.append(Block(c.extent.start.line, c.extent.end.line, kids))
        for k in c.get_children():
            walk(k)

    for top in tu.cursor.get_children():
        if top.location.file is not None and str(top.location.file) == main:
            walk(top)
    return out
