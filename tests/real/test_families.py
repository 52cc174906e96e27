"""The right victim on every model family we can build a tiny model of (sliding-window gemma2,
hybrid lfm2), on layouts C2 and D, 3 of 3 runs; the first release's position-span count caught
picking the wrong one; no unified pool: nothing changes; a real model (SmolLM2, from its PyPI
wheel) with real text."""
import git
import pytest

from toolkit import measure, verify, workload
from toolkit.ui import UI

LAYOUTS = {"C2": "0.3.35", "D": "0.3.36"}


def run(tree, tmp_path, names, **kw):
    return verify.verify(git.Repo(tree.path), base_ref="patchkit-baseline", workloads=[workload.load(n) for n in names],
                         out_dir=tmp_path, ui=UI(quiet=True), **kw)


def failures(res):
    return [(v.workload, v.side, v.run_index, c.name, c.detail) for r in res.results for v in r.verdicts
            for c in v.checks if c.status == "fail"]


@pytest.mark.parametrize("layout", ["C2", "D"])
@pytest.mark.parametrize("family", ["swa", "hybrid"])
def test_family_victim_is_the_largest(trees, tmp_path, layout, family):
    names = [f"{family}-overflow-4", f"{family}-victim-first"]
    res = run(trees(LAYOUTS[layout]), tmp_path, names, repeat=3)
    assert res.ok and res.layout == layout, failures(res)
    for wr, victim in zip(res.results, (3, 0)):
        assert wr.model == {"swa": "gemma2", "hybrid": "lfm2"}[family]
        for c in wr.candidate:
            ev, = measure.overflows(c, wr.workload)
            assert ev.terminated == (victim,) and ev.expected == (victim,) and ev.full, ev.describe()
            assert ev.margin > ev.uncertainty


@pytest.mark.parametrize("name,largest", [("swa-victim-first", 0), ("hybrid-overflow-4", 3)])
def test_position_span_count_picks_the_wrong_victim_on_families(c2, tmp_path, name, largest):
    """The first release's count (the memory's position span). iSWA: seq_pos_min comes from the
    sliding-window cache, whose masked cells are overwritten oldest-cell first, so each long
    slot reports ~190-200 and the largest (whose prompt cells were written first) reports the
    least. Hybrid: ~1 per slot, so slot 0 wins the tie. Measured: another slot terminated, and
    the patch's own log (its count) contradicted by the measurement."""
    res = run(c2, tmp_path, [name], variant="count-positions")
    v = next(v for v in res.results[0].verdicts if v.side == "candidate")
    checks = {c.name: c for c in v.checks}
    assert checks["victim-is-largest"].status == "fail", checks["victim-is-largest"].detail
    assert f"measured largest: [{largest}]" in checks["victim-is-largest"].detail
    assert checks["witness-agrees"].status == "fail" and "log says slot" in checks["witness-agrees"].detail
    ev, = measure.overflows(res.results[0].candidate[0], res.results[0].workload)
    assert ev.terminated != (largest,)


def test_no_unified_pool_changes_nothing(c2, tmp_path):
    res = run(c2, tmp_path, ["no-kvu"])
    assert res.ok, failures(res)
    base = res.results[0].base[0]
    assert not any(o.error for o in base.outcomes), "no KV error without a unified pool: each slot stops at its share"
    assert all(o.outcome == "truncated" for o in base.outcomes)


def test_real_model_text_workload(c2, tmp_path):
    res = run(c2, tmp_path, ["text-overflow-4"], model_name="smollm2")
    assert res.ok, failures(res)
    wr = res.results[0]
    ev, = measure.overflows(wr.candidate[0], wr.workload)
    assert ev.terminated == ev.expected and len(ev.terminated) == 1
    assert not any(o.outcome == "rejected" for r in wr.base + wr.candidate for o in r.outcomes)
