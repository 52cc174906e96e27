"""Mutants nobody designed (issue 26): classic mutation operators on the lines a patch adds,
compiled together as a mutant schema (Mull and Dextool's technique) and selected at run time.

The catalog (patch.toml `[variants]`) holds wrong patches someone designed, each graded by the
workload made for it. These are not designed: every site of the patch's added lines that an
operator applies to becomes a mutant.

- Sites come from libclang's AST of the patched TU (its compile_commands.json flags), limited
  to the lines the patch adds: relational operators (each replaced by its boundary neighbour
  and its negation), arithmetic + and -, logical && and ||, compound += and -=, integer
  literals (+1, -1, 0), boolean literals, the `!` of a condition, if-conditions (negated) and
  expression statements (deleted). Sites inside a macro's arguments (the log lines) are left
  out: what a log line says is not behaviour.
- The schema: each site's text becomes `(patchkit_mutant(K) ? (mutated) : (original))`, nested
  sites built from the inside out, so ONE compile of the TU holds every mutant. The server picks
  mutant K from PATCHKIT_MUTANT (unset: the right patch, which the campaign checks first).
- Stillborn: a mutant whose switch does not compile (e.g. a literal where a constant is needed)
  is found from the compiler's error lines and dropped, and the schema built again.
- Duplicates: two mutants of one site with the same mutated text are one.

Pure text and AST work here; mutate.py runs the campaign.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass

SWITCH = "patchkit_mutant"
ENV = "PATCHKIT_MUTANT"
# The selector, defined once at the top of the TU (after its includes): the id is read once.
# Under -DPATCHKIT_TCE (toolkit/tce.py, clang to LLVM IR) it reads a constant defined per mutant
# instead, so the optimiser sees which branch each switch takes.
PRELUDE = f"""
#ifdef PATCHKIT_TCE
extern "C" const int patchkit_tce_id;
static inline bool {SWITCH}(int k) {{ return patchkit_tce_id == k; }}
#else
static inline bool {SWITCH}(int k) {{
    static const int id = [] {{ const char * e = getenv("{ENV}"); return e ? atoi(e) : 0; }}();
    return id == k;
}}
#endif
"""

RELATIONAL = {"<": ("<=", ">="), "<=": ("<", ">"), ">": (">=", "<="), ">=": (">", "<"), "==": ("!=",),
              "!=": ("==",)}
ARITH = {"+": ("-",), "-": ("+",)}
LOGICAL = {"&&": ("||",), "||": ("&&",)}
COMPOUND = {"+=": ("-=",), "-=": ("+=",)}


@dataclass(frozen=True)
class Mutant:
    id: int
    line: int            # in the patched file
    operator: str        # ROR | AOR | LCR | ASR | CRP | BLR | UOD | NEG | SDL
    original: str        # the site's text
    mutated: str         # what it becomes
    context: str = ""    # the whole source line, stripped: with operator, original and mutated, its stable key

    def diff(self) -> str:
        return f"line {self.line} [{self.operator}]: {self.original!r} -> {self.mutated!r}"

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.operator, self.context, self.original, self.mutated)


@dataclass(frozen=True)
class Schema:
    text: str                        # the patched file with every mutant switchable
    mutants: tuple[Mutant, ...]
    duplicates: int                  # mutants dropped as the same text at the same site


def build_schema(tu, source: str, added: set[int], skip: frozenset[int] = frozenset()) -> Schema:
    """The schema of `source` (the patched file libclang parsed as `tu`): every operator site on
    an `added` line switchable. `skip`: mutant ids known stillborn (left out, ids kept stable)."""
    from clang.cindex import CursorKind as K

    data = source.encode()
    main = str(tu.spelling)
    mutants: list[Mutant] = []
    dups = 0
    counter = [0]

    def off(loc) -> int:
        return loc.offset

    def in_main(c) -> bool:
        return c.location.file is not None and str(c.location.file) == main

    def line_ok(c) -> bool:
        return c.extent.start.line in added and c.extent.end.line in added

    def from_macro(c) -> bool:
        # an expansion's pieces: their extents point into the macro's arguments or definition
        a, b = off(c.extent.start), off(c.extent.end)
        return not (0 <= a < b <= len(data)) or c.extent.start.file is None or str(c.extent.start.file) != main

    def text(a: int, b: int) -> str:
        return data[a:b].decode()

    def new(line: int, op: str, orig: str, mut: str, seen: set) -> Mutant | None:
        nonlocal dups
        counter[0] += 1
        if mut in seen or mut == orig:
            dups += 1
            return None
        seen.add(mut)
        if counter[0] in skip:
            return None
        m = Mutant(counter[0], line, op, orig, mut, source.split("\n")[line - 1].strip())
        mutants.append(m)
        return m

    def render(c) -> str:
        """The text of c's extent with every nested site switchable."""
        a, b = off(c.extent.start), off(c.extent.end)
        kids = sorted((k for k in c.get_children() if in_main(k) and not from_macro(k)),
                      key=lambda k: off(k.extent.start))
        parts, pos, built = [], a, []
        for k in kids:
            ka, kb = off(k.extent.start), off(k.extent.end)
            if ka < pos or kb > b:
                continue  # an implicit node sharing its parent's extent
            parts.append(text(pos, ka))
            r = render(k)
            parts.append(r)
            built.append((k, ka, kb, r))
            pos = kb
        parts.append(text(pos, b))
        return switch(c, "".join(parts), built, a, b)

    def switch(c, inner: str, built, a: int, b: int) -> str:
        if not line_ok(c) or from_macro(c):
            return inner
        line = c.extent.start.line
        seen: set[str] = set()
        alts: list[tuple[Mutant, str]] = []

        def add(op: str, code: str, shown: str | None = None) -> None:
            """`code`: the mutant's text in the schema (nested sites switchable); `shown`: the same
            mutant on the original text (what the report prints and patch.toml's arguments name)."""
            m = new(line, op, text(a, b), shown or code, seen)
            if m:
                alts.append((m, code))

        if c.kind in (K.BINARY_OPERATOR, K.COMPOUND_ASSIGNMENT_OPERATOR) and len(built) == 2:
            (l, la, lb, lt), (r, ra, rb, rt) = built
            between = text(lb, ra)
            tok = between.strip()
            table = {**RELATIONAL, **ARITH, **LOGICAL, **COMPOUND}
            name = ("ROR" if tok in RELATIONAL else "AOR" if tok in ARITH else "LCR" if tok in LOGICAL
                    else "ASR" if tok in COMPOUND else None)
            if name:
                for alt in table[tok]:
                    add(name, lt + between.replace(tok, alt, 1) + rt,
                        text(la, lb) + between.replace(tok, alt, 1) + text(ra, rb))
        elif c.kind == K.INTEGER_LITERAL:
            t = text(a, b)
            if re.fullmatch(r"\d+", t):
                n = int(t)
                for v in {n + 1, n - 1, 0} - {n}:
                    if v >= 0:
                        add("CRP", str(v))
        elif c.kind == K.CXX_BOOL_LITERAL_EXPR:
            t = text(a, b)
            add("BLR", {"true": "false", "false": "true"}.get(t, t))
        elif c.kind == K.UNARY_OPERATOR and text(a, b).startswith("!") and built:
            add("UOD", f"static_cast<bool>({built[0][3]})", f"static_cast<bool>({text(built[0][1], built[0][2])})")
        if alts:
            expr = f"({inner})"
            for m, mut in reversed(alts):
                expr = f"({SWITCH}({m.id}) ? ({mut}) : {expr})"
            return expr
        return inner

    def statements(top) -> str:
        """`render` plus the statement operators: a compound statement's expression statements on
        added lines deleted (SDL), an if-statement's condition negated (NEG)."""
        def walk(c) -> str:
            a, b = off(c.extent.start), off(c.extent.end)
            kids = sorted((k for k in c.get_children() if in_main(k) and not from_macro(k)),
                          key=lambda k: off(k.extent.start))
            if c.kind not in (K.COMPOUND_STMT, K.IF_STMT, K.FOR_STMT, K.CXX_FOR_RANGE_STMT, K.WHILE_STMT, K.DO_STMT,
                              K.CXX_METHOD, K.FUNCTION_DECL, K.STRUCT_DECL, K.CLASS_DECL, K.LAMBDA_EXPR,
                              K.CONSTRUCTOR, K.NAMESPACE, K.UNEXPOSED_EXPR, K.CALL_EXPR, K.VAR_DECL, K.DECL_STMT,
                              K.RETURN_STMT, K.CLASS_TEMPLATE):
                return render(c)
            parts, pos = [], a
            for i, k in enumerate(kids):
                ka, kb = off(k.extent.start), off(k.extent.end)
                if ka < pos or kb > b:
                    continue
                parts.append(text(pos, ka))
                r = walk(k)
                line = k.extent.start.line
                one_line = k.extent.start.line == k.extent.end.line and line in added
                if (c.kind == K.COMPOUND_STMT and one_line
                        and k.kind in (K.CALL_EXPR, K.BINARY_OPERATOR, K.COMPOUND_ASSIGNMENT_OPERATOR,
                                       K.UNARY_OPERATOR, K.UNEXPOSED_EXPR)):
                    m = new(line, "SDL", text(ka, kb), "(void)0", set())
                    if m:
                        r = f"({SWITCH}({m.id}) ? (void)0 : (void)({r}))"
                elif c.kind == K.IF_STMT and i == 0 and one_line and k.kind != K.VAR_DECL:
                    m = new(line, "NEG", text(ka, kb), f"!({text(ka, kb)})", set())
                    if m:
                        r = f"({SWITCH}({m.id}) ? !({r}) : ({r}))"
                parts.append(r)
                pos = kb
            parts.append(text(pos, b))
            return "".join(parts)
        return walk(top)

    # the whole tree, then the statement-level operators on the rebuilt text of each added region
    regions = []  # (a, b, rebuilt) of each top-level node holding added lines
    for top in tu.cursor.get_children():
        if not in_main(top):
            continue
        lines = range(top.extent.start.line, top.extent.end.line + 1)
        if not any(n in added for n in lines):
            continue
        regions.append(top)
    out, pos = [], 0
    for top in sorted(regions, key=lambda t: off(t.extent.start)):
        a, b = off(top.extent.start), off(top.extent.end)
        out.append(text(pos, a))
        out.append(statements(top))
        pos = b
    out.append(text(pos, len(data)))
    body = "".join(out)
    return Schema(_with_prelude(body), tuple(mutants), dups)


def _with_prelude(body: str) -> str:
    """The selector after the last #include at the top of the file (getenv/atoi: <cstdlib>)."""
    return after_includes(body, ["#include <cstdlib>", PRELUDE])


def after_includes(body: str, insert: list[str]) -> str:
    """`insert` after the last #include at the top of the file: one at preprocessor depth 0, not
    one under `#if _WIN32` (a schema's selector; variant_schema.py uses it too)."""
    lines = body.split("\n")
    depth, last = 0, -1
    for i, l in enumerate(lines[:400]):
        t = l.strip()
        if t.startswith(("#if", "#ifdef", "#ifndef")):
            depth += 1
        elif t.startswith("#endif"):
            depth -= 1
        elif t.startswith("#include") and depth == 0:
            last = i
    return "\n".join(lines[:last + 1] + insert + lines[last + 1:])


def error_lines(errors: str) -> set[int]:
    """The lines of the compiled file the compiler rejected (GCC's and Clang's `file:L:C: error:`);
    both schemata (operator mutants here, catalog variants in variant_schema) settle by them."""
    return {int(m.group(1)) for m in re.finditer(r":(\d+):\d+: error:", errors)}


def stillborn(errors: str, schema: Schema) -> set[int]:
    """The mutants whose switches sit on a line the compiler rejected."""
    bad_lines = error_lines(errors)
    lines = schema.text.split("\n")
    out = set()
    for n in bad_lines:
        if 0 < n <= len(lines):
            out |= {int(x) for x in re.findall(rf"{SWITCH}\((\d+)\)", lines[n - 1])}
    return out


def sample(mutants: tuple[Mutant, ...], n: int | None, seed: int) -> tuple[Mutant, ...]:
    if not n or n >= len(mutants):
        return mutants
    return tuple(sorted(random.Random(seed).sample(list(mutants), n), key=lambda m: m.id))
