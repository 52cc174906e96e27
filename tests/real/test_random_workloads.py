"""Randomized overflow workloads on the patched binary (hypothesis; bounded in count and time)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit import compare, measure, model, runner, workload

STATS: list[int] = []  # evictions per example, checked below: the search must hit the eviction path


@st.composite
def workloads(draw):
    n = draw(st.integers(2, 6))
    prompts = draw(st.lists(st.integers(8, 150), min_size=n, max_size=n))
    n_predict = draw(st.lists(st.integers(150, 300), min_size=n, max_size=n))
    starts = draw(st.lists(st.sampled_from([0, 0, 0, 0, 2, 5]), min_size=n, max_size=n))
    demand = sum(prompts) + sum(n_predict)
    # a pool between 40% and 85% of the demand, never below the prompts: overflow is likely, not certain
    ctx = max(256, sum(prompts) + 64, int(demand * draw(st.floats(0.40, 0.85))) // 64 * 64)
    return workload.parse({
        "name": "random",
        "server": {"ctx": ctx, "parallel": n},
        "expect": {"base": "all-error", "candidate": "one-victim", "integrity": False},
        "requests": [{"slot": i, "prompt_len": p, "n_predict": k, "start_ms": s}
                     for i, (p, k, s) in enumerate(zip(prompts, n_predict, starts))],
    })


@settings(max_examples=10, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(wl=workloads())
def test_random_overflows_keep_the_invariants(c2_base, c2_patched, tmp_path, wl):
    """Crash-freedom, and the policy: every termination happened on a measured full pool, one per
    overflow, on the slot holding the most cells (measured), and survivors equal the control."""
    m = model.ensure().path
    r = runner.run(c2_patched.binary, m, wl, tmp_path / "random.log", timeout=60, attempts=1)
    ctl = runner.run(c2_base.binary, m, wl.control(), tmp_path / "control.log", timeout=60, attempts=1)
    shape = ([(len(q.prompt), q.n_predict, q.start_ms) for q in wl.requests], wl.server.ctx)
    assert r.exit_code is None and r.alive_after and r.followup_ok, shape
    evs = measure.overflows(r, wl)
    STATS.append(sum(1 for e in evs if len(e.in_play) > 1))
    for e in evs:
        assert e.full, ("terminated while the pool was not full", shape, e.describe())
        if len(e.in_play) > 1:  # with one slot in play the old behaviour stays: it errors
            assert len(e.terminated) == 1, ("more than one victim in one overflow", shape, e.describe())
            if e.margin > e.uncertainty:
                assert set(e.terminated) <= set(e.expected), ("not the largest", shape, e.describe())
    ref = {o.slot: o for o in ctl.outcomes}
    for o, q in zip(r.outcomes, wl.requests):
        if o.outcome == "errored":
            assert o.error == measure.EXCEEDED, (shape, o.slot, o.error)
            assert tuple(ref[o.slot].tokens[:len(o.tokens)]) == o.tokens, ("victim not a prefix", shape, o.slot)
            continue
        if len(q.prompt) + q.n_predict <= wl.server.ctx:
            assert o.outcome == "completed" and len(o.tokens) == q.n_predict, (shape, o.slot, o.outcome)
            assert o.tokens == ref[o.slot].tokens, ("survivor differs from the control", shape, o.slot,
                                                     compare.first_difference(o.tokens, ref[o.slot].tokens))
        else:  # longer than one slot's context: the server stops it, not the patch
            assert o.outcome in ("completed", "truncated"), (shape, o.slot, o.outcome)


def test_random_search_reached_the_eviction_path():
    """Runs after the property (file order): a search that never evicted proved nothing."""
    assert STATS, "the property test did not run first"
    assert sum(1 for n in STATS if n) >= 3, f"evictions per example: {STATS}"
