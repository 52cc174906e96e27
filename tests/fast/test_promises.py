"""Issue 34: every author's patch is held to the promises it makes. A declaration file gives a
foreign change the checks of patchkit's own series that promise the same; a bad one is refused
with the reason."""
import pytest

from toolkit import compare, patch, promises
from toolkit.errors import UsageError
from toolkit.pauses import PARK_BOUND


def write(tmp_path, text):
    p = tmp_path / "promises.toml"
    p.write_text(text)
    return p


def test_a_declaration_like_a_family_gets_that_familys_promises(tmp_path):
    d = promises.load(write(tmp_path, 'like = "park-slot"\npolicy = "smallest"\n'))
    assert (d.expect, d.policy, d.family) == ("preemption", "smallest", "park-slot")
    assert d.own == compare.Promises(park_bound=PARK_BOUND, resume_path="swap", resume_cells="exact", counters=True,
                                     parked_first=True)
    assert d.own == promises.of_family("park-slot", "smallest", "x").own
    assert "resume by swap" in d.text and f"file {tmp_path}" in d.text
    assert "new requests wait while one is parked" in d.text


def test_each_family_promises_what_its_design_does():
    own = {f: promises.of_family(f, "largest", "x").own for f in patch.families()}
    assert own["evict-largest-slot"] == compare.Promises(witness=True, counters=True)
    assert all(o.counters for o in own.values())   # every family's /metrics counts what it does
    assert own["recompute-slot"].resume_cells == "exact" and own["recompute-slot"].resume_path == "recompute"
    assert own["recompute-prefill-slot"].resume_cells == "pending"   # its pending token decoded with the history
    # every preemption family holds new requests back while one is parked; an eviction parks nobody
    assert all(o.parked_first == (f != "evict-largest-slot") for f, o in own.items())


def test_a_declaration_of_its_own_overrides_key_by_key(tmp_path):
    d = promises.load(write(tmp_path, '[promises]\nexpect = "preemption"\npark_bound = 5\nresume_path = "recompute"\n'))
    assert (d.expect, d.policy, d.family) == ("preemption", "largest", "")
    assert d.own == compare.Promises(park_bound=5, resume_path="recompute")
    d = promises.load(write(tmp_path, 'expect = "eviction"\npolicy = "newest"\neviction_log = true\n'))
    assert d.own == compare.Promises(witness=True) and d.policy == "newest"
    d = promises.load(write(tmp_path, 'like = "evict-largest-slot"\ncounters = false\n'))
    assert d.own == compare.Promises(witness=True) and "/metrics" not in d.text
    d = promises.load(write(tmp_path, 'like = "park-slot"\nparked_first = false\n'))
    assert not d.own.parked_first and d.own.park_bound == PARK_BOUND and "new requests wait" not in d.text


@pytest.mark.parametrize("text,why", [
    ('expect = "evict"\n', "expect = 'evict' is not one of eviction, preemption"),
    ('like = "park-everything"\n', "is no patchkit family"),
    ('policy = "largest"\n', "declares neither `expect`"),
    ('expect = "preemption"\npark_bound = "3"\n', "park_bound = '3' is not one of int"),
    ('expect = "preemption"\neviction_log = 1\n', "eviction_log = 1 is not one of bool"),
    ('expect = "eviction"\nresume_path = "swap"\n', "are promises of a preemption"),
    ('expect = "eviction"\nparked_first = true\n', "are promises of a preemption"),
    ('expect = "preemption"\nparked_first = "yes"\n', "parked_first = 'yes' is not one of bool"),
    ('expect = "preemption"\nbound = 3\n', "unknown keys ['bound']"),
    ('expect = \n', "is not TOML"),
])
def test_a_bad_declaration_is_refused_with_its_reason(tmp_path, text, why):
    with pytest.raises(UsageError) as e:
        promises.load(write(tmp_path, text))
    assert why in str(e.value), e.value


def test_a_missing_declaration_is_refused(tmp_path):
    with pytest.raises(UsageError, match="cannot read the promises file"):
        promises.load(tmp_path / "nowhere.toml")


def test_every_family_says_how_its_code_is_recognised():
    """promises.recognise reads these: each family's policies all have a phrase, and families that
    share templates differ in their signatures (the most specific match wins)."""
    sigs = {}
    for f in patch.families():
        spec = patch.load_patch(f)
        assert set(spec.policy_said) == set(spec.policies), f
        assert spec.signature, f
        sigs[f] = set(spec.signature)
    assert len({frozenset(s) for s in sigs.values()}) == len(sigs)
