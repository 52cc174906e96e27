"""Operator mutants (issue 26), pure: sites on the added lines only, one switch per mutant, the
schema's default (no mutant selected) is the original code. libclang parses in-process."""
import clang.cindex as ci

from toolkit import operators

SRC = """#include <vector>
#include <cstdio>
#if defined(_WIN32)
#include <windows.h>
#endif

static int keep(int a) { return a < 3 ? a + 1 : a; }

static int patched(std::vector<int> & v, int off) {
    int n = 0;
    for (int i = off; i < (int) v.size(); ++i) {
        if (v[i] == 7 && !v.empty()) {
            n += 2;
        }
        printf("%d\\n", i + 1);
    }
    return n;
}
"""


def schema(tmp_path, added):
    f = tmp_path / "t.cpp"
    f.write_text(SRC)
    tu = ci.Index.create().parse(str(f), args=["-std=c++17", "-x", "c++"])
    return operators.build_schema(tu, SRC, added)


def test_sites_only_on_added_lines_and_the_default_is_the_original(tmp_path):
    added = set(range(9, 18))  # the function `patched`, not `keep`
    s = schema(tmp_path, added)
    ops = {(m.operator, m.original, m.mutated) for m in s.mutants}
    assert ("ROR", "i < (int) v.size()", "i <= (int) v.size()") in ops
    assert ("ROR", "v[i] == 7", "v[i] != 7") in ops
    assert ("LCR", "v[i] == 7 && !v.empty()", next(m.mutated for m in s.mutants if m.operator == "LCR")) in ops
    assert ("ASR", "n += 2", "n -= 2") in ops
    assert ("CRP", "2", "3") in ops and ("NEG", "v[i] == 7 && !v.empty()", "!(v[i] == 7 && !v.empty())") in ops
    assert any(m.operator == "UOD" for m in s.mutants)
    assert all(9 <= m.line <= 17 for m in s.mutants), "nothing of `keep` (not added)"
    assert "a < 3 ? a + 1 : a" in s.text, "an unchanged line stays as it was"
    # the selector is defined once, at depth 0 (not under the _WIN32 block), before any use
    text = s.text
    # (twice: read at run time, and under -DPATCHKIT_TCE from a per-mutant constant: toolkit/tce.py)
    assert text.count("static inline bool patchkit_mutant(int k)") == 2 and text.count("#ifdef PATCHKIT_TCE") == 1
    at = text.index("patchkit_mutant(int k)")
    assert not text.index("#if defined(_WIN32)") < at < text.index("#endif") and at < text.index("static int keep")
    # every mutant has exactly one switch (nested sites appear in both arms of an outer one)
    for m in s.mutants:
        assert f"patchkit_mutant({m.id})" in text


def test_stillborn_ids_come_from_the_error_lines(tmp_path):
    s = schema(tmp_path, set(range(9, 18)))
    lines = s.text.split("\n")
    n = next(i for i, line in enumerate(lines, 1) if "patchkit_mutant(" in line and "inline" not in line)
    ids = operators.stillborn(f"t.cpp:{n}:5: error: something", s)
    assert ids and ids <= {m.id for m in s.mutants}
    # skipped ids keep the others' ids stable
    again = operators.build_schema(ci.Index.create().parse(str(tmp_path / "t.cpp"), args=["-std=c++17", "-x", "c++"]),
                                   SRC, set(range(9, 18)), frozenset(ids))
    assert {m.id for m in again.mutants} == {m.id for m in s.mutants} - ids


def test_a_seeded_sample_is_stable():
    ms = tuple(operators.Mutant(i, 1, "ROR", "a", "b") for i in range(1, 50))
    assert operators.sample(ms, 10, 3) == operators.sample(ms, 10, 3)
    assert len(operators.sample(ms, 10, 3)) == 10 and operators.sample(ms, None, 3) == ms
