"""llama.cpp's own unified-pool test, its rule applied to patchkit's runs of the same requests.

Upstream's `test_completion_unified` (tools/server/tests/unit/test_completion.py, in every fetched
tree) starts a 4-slot server on one 256-cell unified pool, sends four parallel non-streamed
/completion requests of prompt "A" and asserts, per request, only:
  - where `expected_success` is True: HTTP 200;
  - where the status is 200: "content" in the body, and timings.predicted_n == n_predict when the
    body has timings.
A request that failed is never looked at. Its overflowing case expects [False] * 4, so the base
server (every request gets "Context size has been exceeded.": the bug) and the patched one (one
request terminated, three complete) both pass it: the test cannot tell the bug from the fix.

`compare_runs` applies that rule to the outcomes patchkit recorded for the `upstream-unified`
workload (the same case), side by side with patchkit's verdict on the same runs, and with
patchkit's candidate expectations applied to each base run: what the eviction expectations would
say of a "fix" that behaves like the base. Pure: verify.py calls it, report.py prints it.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import compare, measure
from .compare import Check, Verdict
from .record import Outcome, Run
from .workload import Workload

WORKLOAD = "upstream-unified"   # the workload this comparison is made for (fixtures/workloads/)
TEST = "tools/server/tests/unit/test_completion.py::test_completion_unified"


@dataclass(frozen=True)
class Case:
    """One parametrize case of upstream's test."""
    n_ctx: int
    n_slots: int
    n_predict: tuple[int, ...]
    expected_success: tuple[bool, ...]


# upstream's overflowing case, verbatim: (256, 4, [70, 70, 70, 70], [False, False, False, False])
CASE = Case(256, 4, (70, 70, 70, 70), (False, False, False, False))

# patchkit's checks that carry the eviction expectations (compare.py), per side
BASE_CHECKS = ("all-slots-errored",)
CANDIDATE_CHECKS = ("one-victim-per-overflow", "victim-is-largest", "victim-error-text", "survivors-complete",
                    "integrity", "witness-agrees")


@dataclass(frozen=True)
class Rule:
    """What upstream's assertions say of one run."""
    ok: bool
    asserted: int        # assertions its rule ran on this run
    detail: str          # the first assertion that failed, or what it checked


def upstream_rule(outcomes: tuple[Outcome, ...], expected_success: tuple[bool, ...]) -> Rule:
    """Upstream's assertions, as written, on the requests in its order (zip: as upstream pairs them)."""
    asserted, failed = 0, []
    for o, expect_ok in zip(outcomes, expected_success):
        if expect_ok:
            asserted += 1
            if o.http_status != 200:
                failed.append(f"slot {o.slot}: expected success, got HTTP {o.http_status}")
        if o.http_status == 200:
            asserted += 1
            if not o.has_content:
                failed.append(f"slot {o.slot}: HTTP 200 without \"content\"")
            elif o.predicted_n is not None:
                asserted += 1
                if o.predicted_n != o.n_predict:
                    failed.append(f"slot {o.slot}: predicted_n {o.predicted_n} != n_predict {o.n_predict}")
    if failed:
        return Rule(False, asserted, "; ".join(failed))
    ok200 = [o.slot for o in outcomes if o.http_status == 200]
    unchecked = [o.slot for o, e in zip(outcomes, expected_success) if o.http_status != 200 and not e]
    return Rule(True, asserted, (f"HTTP 200 with predicted_n == n_predict: slots {ok200}" if ok200 else
                                 "no request succeeded, and none was expected to")
                + (f"; not looked at (failed, expected to fail): slots {unchecked}" if unchecked else ""))


@dataclass(frozen=True)
class Side:
    """One run of one side: upstream's rule and patchkit's verdict on the same four requests."""
    side: str                       # base | candidate
    run: int
    outcomes: tuple[str, ...]       # per request: "slot 1: HTTP 500 errored 0/70"
    upstream: Rule
    patchkit_ok: bool               # patchkit's whole verdict on this run (every check)
    patchkit: tuple[Check, ...]     # its eviction-expectation checks, as judged
    measured: str                   # what patchkit measured at the overflow
    # base runs only: patchkit's candidate expectations on this run, i.e. its verdict on a "fix"
    # that behaves like the base (upstream's rule passes it all the same)
    as_candidate: tuple[Check, ...] = ()

    @property
    def as_candidate_ok(self) -> bool:
        return all(c.ok for c in self.as_candidate)


@dataclass(frozen=True)
class Comparison:
    test: str
    case: Case
    sides: tuple[Side, ...]

    @property
    def upstream_passes_both(self) -> bool:
        """Upstream's rule passes every run of both sides: it cannot tell them apart."""
        return bool(self.sides) and all(s.upstream.ok for s in self.sides)

    @property
    def patchkit_separates(self) -> bool:
        """patchkit's verdict tells them apart: each base run shows the bug and fails the
        candidate's expectations; each candidate run passes them."""
        base = [s for s in self.sides if s.side == "base"]
        cand = [s for s in self.sides if s.side == "candidate"]
        return (bool(base) and bool(cand) and all(s.patchkit_ok and not s.as_candidate_ok for s in base)
                and all(s.patchkit_ok for s in cand))


def _outcome(o: Outcome) -> str:
    return f"slot {o.slot}: HTTP {o.http_status} {o.outcome} {len(o.tokens)}/{o.n_predict}"


def _measured(run: Run, wl: Workload, policy: str) -> str:
    evs = measure.overflows(run, wl, policy)
    if not evs:
        return "no overflow measured"
    return "; ".join(f"off {e.off}, cells {', '.join(f'{s.slot}:{s.cells}' for s in e.in_play)}; "
                     f"terminated {list(e.terminated)}; measured {policy}: {list(e.expected)} (margin {e.margin})"
                     for e in evs)


def compare_runs(wl: Workload, base: tuple[Run, ...], candidate: tuple[Run, ...],
                 verdicts: tuple[Verdict, ...], policy: str = "largest",
                 case: Case = CASE) -> Comparison:
    """Upstream's rule and patchkit's verdict, run by run, on both sides."""
    by = {(v.side, v.run_index): v for v in verdicts}
    sides = []
    for side, runs, names in (("base", base, BASE_CHECKS), ("candidate", candidate, CANDIDATE_CHECKS)):
        for k, run in enumerate(runs):
            v = by.get((side, k))
            checks = tuple(c for c in (v.checks if v else ()) if c.name in names)
            extra = tuple(c for c in compare.one_victim(measure.measure(run, wl, policy))
                          if c.name in CANDIDATE_CHECKS) if side == "base" else ()
            sides.append(Side(side, k, tuple(_outcome(o) for o in run.outcomes),
                              upstream_rule(run.outcomes, case.expected_success),
                              bool(v and v.ok), checks, _measured(run, wl, policy), extra))
    return Comparison(TEST, case, tuple(sides))
