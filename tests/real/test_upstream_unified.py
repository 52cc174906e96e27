"""Issue 20, item 3: upstream's unified-pool test (test_completion_unified), its overflowing case as the
`upstream-unified` workload, on the real base and patched llama-server of the default tree. Upstream's
own rule passes both sides; patchkit's verdict tells the bug from the fix and names the victim."""
import json

import git

from toolkit import measure, report, verify, workload
from toolkit.compare import EXCEEDED
from toolkit.ui import UI
from toolkit.upstream_unified import CASE


def test_upstream_rule_passes_both_sides_patchkit_names_the_victim(c2, c2_base, tmp_path):
    wls = [workload.load("upstream-unified"), workload.load("overflow-nonstream")]
    res = verify.verify(git.Repo(c2.path), base_ref="patchkit-baseline", workloads=wls, repeat=2,
                        out_dir=tmp_path, ui=UI(quiet=True))
    assert res.ok, [(r.workload.name, v.side, c.name, c.detail) for r in res.results for v in r.verdicts
                    for c in v.checks if c.status == "fail"]
    wr = next(r for r in res.results if r.workload.name == "upstream-unified")
    cmp = wr.upstream_test
    assert cmp is not None and len(cmp.sides) == 4
    assert cmp.upstream_passes_both, [(s.side, s.run, s.upstream.detail) for s in cmp.sides]
    assert cmp.patchkit_separates

    for run in wr.base:
        # the bug, for real: every request HTTP 500 with the KV error; upstream asserted nothing
        assert [(o.http_status, o.error) for o in run.outcomes] == [(500, EXCEEDED)] * 4
    for s in (s for s in cmp.sides if s.side == "base"):
        assert s.upstream.ok and s.upstream.asserted == 0
        assert not s.as_candidate_ok, "the base's runs, judged as a fix, fail patchkit's eviction expectations"

    for k, run in enumerate(wr.candidate):
        ev, = measure.overflows(run, wr.workload)
        assert ev.full and len(ev.expected) == 1 and ev.margin > ev.uncertainty, ev.describe()
        victim = ev.expected[0]        # the measured largest (slot 1 by the sizing, unless a start skewed)
        assert ev.terminated == (victim,), ev.describe()
        by = {o.slot: o for o in run.outcomes}
        assert (by[victim].http_status, by[victim].error) == (500, EXCEEDED)
        for o in run.outcomes:
            if o.slot != victim:
                # what upstream's rule reads: HTTP 200, content, timings.predicted_n == n_predict
                assert (o.http_status, o.has_content, o.predicted_n) == (200, True, CASE.n_predict[o.slot]), o
        side = next(s for s in cmp.sides if s.side == "candidate" and s.run == k)
        assert side.upstream.ok and side.upstream.asserted == 6, side.upstream
        checks = {c.name: c for c in side.patchkit}
        assert side.patchkit_ok and checks["victim-is-largest"].status == "pass"
        assert f"terminated [{victim}], measured largest: [{victim}]" in checks["victim-is-largest"].detail
        assert checks["survivors-complete"].status == checks["integrity"].status == "pass"
        assert checks["witness-agrees"].status == "pass"

    # the reports carry the section for that workload only
    paths = report.write(res, tmp_path / "report")
    data = json.loads(paths["json"].read_text())
    ut = data["workloads"]["upstream-unified"]["upstream_test"]
    assert ut["upstream_passes_both"] and ut["patchkit_separates"] and len(ut["sides"]) == 4
    assert "upstream_test" not in data["workloads"]["overflow-nonstream"]
    md = paths["md"].read_text()
    assert md.count("### Upstream's unified-pool test on the same requests") == 1
    assert "Upstream's unified-pool test on the same requests" in paths["html"].read_text()
