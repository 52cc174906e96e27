"""The catalog's variants as one schema (issue 37), pure: each variant selected is its own text
line for line, none selected is the right patch's, a difference outside a function body is built
alone, the switch keeps a changed declaration in scope, and a compiler error names its variant.
libclang parses in-process."""
import re

import clang.cindex as ci
import pytest

from toolkit import variant_schema as vs

HEADER = 'extern "C" int printf(const char *, ...);\nextern "C" char * getenv(const char *);\nextern "C" int atoi(const char *);\n'
RIGHT = """#include "t.h"

struct S { int a; };

static int f(int * v, int len, int off) {
    int n = 0;
    for (int i = off; i < len; ++i) {
        if (v[i] == 7) {
            n += 2;
        }
        int m = n * 2;
        printf("%d\\n", m);
    }
    return n;
}

static int g(int x) {
    int y = x + 1;
    return y;
}
"""

VARIANTS = {
    "plus-three": RIGHT.replace("n += 2;", "n += 3;"),
    "decl": RIGHT.replace("int m = n * 2;", "int m = n * 3;"),
    "two-functions": RIGHT.replace("int n = 0;", "int n = 1;").replace("int y = x + 1;", "int y = x + 2;"),
    "member": RIGHT.replace("struct S { int a; };", "struct S { int a; int b; };"),
    "inserted-at-end": RIGHT.replace('printf("%d\\n", m);\n', 'printf("%d\\n", m);\n        n -= 1;\n'),
    "deleted": RIGHT.replace("            n += 2;\n", ""),
    "same": RIGHT,
}


def parse(tmp_path, text, name="t.cpp"):
    (tmp_path / "t.h").write_text(HEADER)
    f = tmp_path / name
    f.write_text(text)
    return ci.Index.create().parse(str(f), args=["-std=c++17", "-x", "c++"])


def schema(tmp_path, skip=frozenset()):
    return vs.build(RIGHT, VARIANTS, vs.blocks_of(parse(tmp_path, RIGHT)), skip)


def test_each_variant_selected_is_its_text_and_none_selected_is_the_right_patch(tmp_path):
    s = schema(tmp_path)
    assert set(s.ids) == {"plus-three", "decl", "two-functions", "inserted-at-end", "deleted"}
    assert s.alone == {"member": "changes line 3, not a statement inside a function body (a declaration outside one, or a brace's line)", "same": "renders the right patch"}
    for name, k in s.ids.items():
        assert vs.project(s.text, k) == VARIANTS[name], name
        assert s.env(name) == {"PATCHKIT_VARIANT": str(k)}
    assert vs.project(s.text, 0) == RIGHT
    # one switch per variant and function; ids are catalog positions, stable when others drop out
    assert s.text.count("if (patchkit_variant(3))") == 2 and s.ids["decl"] == 2
    # it parses clean (the selector's <cstdlib> declared by the test's header: no system headers here)
    text = s.text.replace("#include <cstdlib>", '#include "t.h"')
    assert [d.spelling for d in parse(tmp_path, text, "s.cpp").diagnostics if d.severity >= 3] == []


def test_a_changed_declaration_stays_in_scope_for_its_uses(tmp_path):
    """`int m` changes and printf uses it: the switch runs to the block's closing brace, so both
    branches hold the use (the schema compiles: no diagnostics above); the switch opens at the
    changed statement, not at the block's start."""
    text = schema(tmp_path).text
    branch = text[text.index("if (patchkit_variant(2))"):text.index("} // patchkit variant 2\n")]
    assert "int m = n * 3;" in branch and branch.count('printf("%d\\n", m);') == 2
    assert "if (v[i] == 7)" not in branch.split("} else {")[0]


def test_a_compiler_error_names_the_innermost_variant_and_skipping_it_keeps_the_ids(tmp_path):
    s = schema(tmp_path)
    lines = s.text.split("\n")
    at = next(i for i, line in enumerate(lines, 1) if "n += 3;" in line)
    assert vs.stillborn(f"t.cpp:{at}:13: error: nope\nt.cpp:1:1: error: outside\n", s) == {"plus-three"}
    s2 = schema(tmp_path, frozenset({"plus-three"}))
    assert "plus-three" not in s2.ids and s2.alone["plus-three"] == "its switch did not compile"
    assert s2.ids["decl"] == s.ids["decl"]


@pytest.mark.parametrize("find,to,alone", [
    ("int z = 0;", "int z = 1;", None),     # the second statement of a line: the switch takes the whole line
    ("int w = 0;", "int w = 1;", "a brace's line"),   # on the `{` line
])
def test_a_statement_sharing_a_line_with_its_blocks_brace_is_built_alone(tmp_path, find, to, alone):
    right = RIGHT.replace("static int g(int x) {\n    int y = x + 1;",
                          "static int g(int x) { int w = 0; (void) w;\n    int y = x + 1; int z = 0; (void) z;")
    variant = right.replace(find, to)
    s = vs.build(right, {"v": variant}, vs.blocks_of(parse(tmp_path, right)))
    if alone:
        assert s.ids == {} and alone in s.alone["v"] and s.text == right, s.alone
    else:
        assert s.ids == {"v": 1} and vs.project(s.text, 1) == variant


def test_settle_leaves_out_a_stillborn_switch_and_gives_up_sharing_on_any_other_error(tmp_path):
    """variant_schema.settle with a compiler stand-in that answers from the schema's text (the
    real compiler's output format): a switch holding an error line is left out and the rest
    rebuilt with their ids; an error on no switch's line leaves every variant alone, quoted."""
    blocks = vs.blocks_of(parse(tmp_path, RIGHT))
    tried = []

    def rejects(needle):
        def compiles(s):
            tried.append(sorted(s.ids))
            lines = s.text.split("\n")
            return "".join(f"t.cpp:{i}:5: error: no\n" for i, line in enumerate(lines, 1) if needle in line)
        return compiles
    s = vs.settle(RIGHT, VARIANTS, blocks, rejects("n += 3;"))
    assert "plus-three" not in s.ids and s.alone["plus-three"] == "its switch did not compile"
    assert s.ids["decl"] == 2 and len(tried) == 2 and "plus-three" in tried[0] and "plus-three" not in tried[1]
    s = vs.settle(RIGHT, VARIANTS, blocks, rejects("static int g("))
    assert s.ids == {} and s.text == RIGHT and set(s.alone) == set(VARIANTS)
    assert re.fullmatch(r"the schema did not compile: t\.cpp:\d+:5: error: no", s.alone["decl"]), s.alone


def test_a_schema_that_does_not_reproduce_a_variant_builds_that_variant_alone(tmp_path, monkeypatch):
    """The guard before any build: a rendering defect (here a region that loses its last line) is
    caught by projecting the schema, and costs that variant its share of the build, never a
    verdict on the wrong text; a defect in the file around the switches gives every variant up."""
    blocks = vs.blocks_of(parse(tmp_path, RIGHT))
    good = vs.build(RIGHT, VARIANTS, blocks)
    assert "plus-three" in good.ids
    regions = vs.regions

    def short(name, right, other, blocks):
        r = regions(name, right, other, blocks)
        if name == "plus-three" and not isinstance(r, str):
            return [vs.Region(x.variant, x.start, x.end, x.lines[:-1]) for x in r]
        return r
    monkeypatch.setattr(vs, "regions", short)
    bad = vs.build(RIGHT, VARIANTS, blocks)
    assert "plus-three" not in bad.ids and bad.alone["plus-three"] == vs.MISFIT
    assert sorted(bad.ids) == sorted(n for n in good.ids if n != "plus-three")
    for name, k in bad.ids.items():
        assert vs.project(bad.text, k) == VARIANTS[name], name
    assert vs.project(bad.text, 0) == RIGHT
    # a defect outside every switch (a line of the file itself lost): nothing shares the build
    monkeypatch.setattr(vs, "regions", regions)
    monkeypatch.setattr(vs, "_with_prelude", lambda body: body.replace("    return y;\n", ""))
    none = vs.build(RIGHT, VARIANTS, blocks)
    assert none.ids == {} and none.text == RIGHT and set(none.alone) >= set(good.ids)
