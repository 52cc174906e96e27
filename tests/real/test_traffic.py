"""The users' traffic (issue 35), for real: seeded chat sessions through the official `openai`
client against the default tree's llama-server on upstream's defaults (prompt cache on, slots
chosen by similarity, a queue), base and candidate, each turn against its solo control. Each
check the traffic adds is shown failing on a wrong patch, for its reason."""
import json
import re
import subprocess
import sys

import git

from toolkit import apply, runner, source

from .conftest import blocked_eviction, clone


def patchkit(*args, **kw):
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True, **kw)


def sides(doc, name):
    """(base, candidate): each side's first run."""
    w = next(w for w in doc["workloads"] if w["traffic"] == name)
    return w["sides"].get("base", [None])[0], w["sides"]["candidate"][0]


def failed(side):
    return {c["name"]: c["detail"] for c in side["checks"] if c["status"] == "fail"}


def test_the_users_reports_on_base_and_candidate(c2_base, c2_patched, tmp_path):
    """LM Studio #1757 and lemonade #3276, scaled: the base ends every processing request at an
    overflow and users give up; the eviction ends one per overflow, every retry completes and
    equals its control, every conversation completes."""
    res = patchkit("traffic", "--json", "--report-dir", str(tmp_path))
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    doc = json.loads(res.stdout)
    assert doc["outcome"] == "PASS" and doc["promise"] == "one-victim-per-overflow"
    assert json.loads((tmp_path / "traffic.json").read_text())["outcome"] == "PASS"
    # the bug, as the users reported it: one overflow ends several users' turns at once. Whether a
    # base run of these two reaches the n_batch == 1 failure is timing (a CI run in two processes:
    # lmstudio-1757's base ran out of room once and ended nobody, the candidate then evicted 3
    # times): one of the two in each run (lemonade's six users on four slots, in every run so far)
    assert any(n > 1 for name in ("lmstudio-1757", "lemonade-3276") for n in sides(doc, name)[0]["overflows"])
    # a user who gives up does so at its last try's end, not after one more backoff (16 s): a run
    # ends within a few seconds of its last answer (the users' threads are joined every 0.5 s)
    for w in doc["workloads"]:
        for side in (s for runs in w["sides"].values() for s in runs):
            gave_up = any(u["lost"] for u in side["users"])
            idle = side["wall_s"] - max(a["start_s"] + a["latency_s"] for a in side["attempts"])
            assert not gave_up or idle < 8.0, (w["traffic"], idle)
    # and LM Studio #1757's overlap by design, in every run: resend-together's three users send their
    # second turn at the same moment (the server stopped while they send), so the pool runs out while
    # all three are in their prompts. The base ends all three at that one overflow; the eviction ends
    # one, whose retry completes
    base, cand = sides(doc, "resend-together")
    assert 3 in base["overflows"], base["overflows"]
    assert set(cand["overflows"]) == {1} and all(u["turns"] == u["planned"] for u in cand["users"]), cand
    for name in ("lmstudio-1757", "lemonade-3276"):
        base, cand = sides(doc, name)
        # (how many turns the base's users lose varies with timing: with backoff they often recover,
        # docs/measured.md; the count of failed attempts is no invariant, who ends per overflow is)
        # the candidate: one request per overflow, and only those retried; every turn exact
        assert cand["outcome"] == "PASS", (name, cand["checks"])
        assert cand["overflows"] and set(cand["overflows"]) == {1}, (name, cand["overflows"])
        assert sum(u["failed"] for u in cand["users"]) == len(cand["overflows"]), name
        assert all(u["turns"] == u["planned"] for u in cand["users"]), name
        assert cand["serves_after"] == "completed"
        # a real client on the server's defaults: slots by similarity, the prompt cache both ways
        for shape in ("slot-by-similarity", "idle-slot-saved", "prompt-cache-loaded"):
            assert shape in cand["shapes"], (name, shape, cand["shapes"])
        # an eviction reaches the client inside a 200 stream: the SDK's own retry never sees it
        assert all(a["status"] == 200 for a in cand["attempts"]), name
    # bad input: a turn longer than the pool refused at once with a 4xx that says so, a hang-up
    # costing only its own turn; nobody else's conversation lost
    _, rude = sides(doc, "rude-clients")
    got = {c["name"]: c for c in rude["checks"]}
    assert got["bad-input-handled"]["status"] == "pass" and "400" in got["bad-input-handled"]["detail"], got
    # every conversation completes, or a user gave up only as the one victim of each overflow, try
    # after try (terminate-one behind a queue evicts the longest conversation each time it returns:
    # measured once in a clean-clone CI run, users 3 and 7 evicted 7 times each): starved, reported
    # as the design's limit, never excused for a request no overflow answers for
    assert got["conversations-complete"]["status"] == "pass", got["conversations-complete"]
    assert rude["lost"] == rude["starved"], (rude["lost"], rude["starved"])
    if rude["starved"]:
        assert "starved" in got["conversations-complete"]["detail"] and set(rude["overflows"]) == {1}
    # eight users on two slots: six wait in the queue from the first burst on, whatever the timing
    # (lemonade-3276's six on four reach it in most runs, not all: docs/measured.md)
    assert "task-queued" in rude["shapes"], rude["shapes"]
    # queue-starvation: the long conversation ends at every try while the chats go on, by the
    # arithmetic (tests/fast/test_traffic.py): starved, the policy's own victim each time, reported;
    # the 24 chats complete every turn
    _, q = sides(doc, "queue-starvation")
    got = {c["name"]: c for c in q["checks"]}
    assert q["outcome"] == "PASS" and q["lost"] == q["starved"] == [0], (q["lost"], q["starved"], q["checks"])
    tries = [a for a in q["attempts"] if a["user"] == 0]
    assert len(tries) == 3 and not any(a["ok"] for a in tries) and set(q["overflows"]) == {1}, (tries, q["overflows"])
    assert len(q["overflows"]) == 3 and "users [0] starved" in got["conversations-complete"]["detail"]
    assert all(u["turns"] == u["planned"] for u in q["users"][1:]), q["users"]


def test_two_victims_per_overflow_fail_the_traffic_for_that_reason(c2_base, tmp_path):
    res = patchkit("traffic", "--variant", "two-victims", "--workload", "lmstudio-1757", "--candidate-only",
                   "--json", "--report-dir", str(tmp_path))
    assert res.returncode == 1, res.stderr[-3000:] + res.stdout[-3000:]
    _, cand = sides(json.loads(res.stdout), "lmstudio-1757")
    bad = failed(cand)
    assert "one-victim-per-overflow" in bad and "ended more than one" in bad["one-victim-per-overflow"], bad


def test_a_parked_slot_never_resumed_is_cut_at_its_quiet_log_in_one_start(c2_base, tmp_path):
    """A server that loops without progress (a parked slot nothing resumes: "posting NEXT_RESPONSE"
    each loop turn) is cut as soon as its log grows QUIET_CAP while no user sends or receives
    anything, not at the whole log's cap; and a start cut so is evidence, never made again
    (measured before: 3 starts, each to 128 MB, 72 s; after: one start, 12 s)."""
    res = patchkit("traffic", "--patch", "park-slot", "--variant", "never-resumed", "--workload", "rude-clients",
                   "--candidate-only", "--json", "--report-dir", str(tmp_path))
    assert res.returncode == 1, res.stderr[-3000:] + res.stdout[-3000:]
    _, cand = sides(json.loads(res.stdout), "rude-clients")
    bad = failed(cand)
    assert "while no request received anything: it loops without progress" in bad["serves-after"], bad
    assert "were still waiting for an answer when the traffic was cut" in bad["conversations-complete"], bad
    assert cand["starts"] == 1, cand["starts"]
    # the quiet cap cut it (the reason above; the whole log's cap says "the server's log passed"); how much
    # more the server wrote before the poll saw it depends on the machine's load, so it is not
    # bounded here (a CI run beside three CPU hogs and a demo: 197 MB in all, once)
    assert runner.QUIET_CAP < cand["log_quiet_bytes"] <= cand["log_bytes"], cand


def test_a_server_whose_loop_blocks_for_good_is_cut_at_the_idle_floor_not_the_deadline(c2, c2_base, tmp_path):
    """A wrong patch that deadlocks silently (its eviction waits on a condition nobody signals: no
    token, no log line of its loop, the server alive) is cut once that lasted runner.IDLE_FLOOR_S
    while a request waited, the laboratory's idle rule. Before, the run waited out its 600 s
    deadline: the server's HTTP threads ping each open stream every 30 s (SSE comments, logged),
    so neither the clients' read timeouts nor a silent log ever ended the wait (measured)."""
    repo = git.Repo(c2.path)
    base = source.resolve(repo, source.BASELINE_TAG)
    blocked = blocked_eviction(repo, base)
    (tmp_path / "hang.patch").write_text(repo.git.diff(base, blocked) + "\n")
    res = patchkit("traffic", "--patch-file", str(tmp_path / "hang.patch"), "--workload", "lmstudio-1757",
                   "--candidate-only", "--report-dir", str(tmp_path / "r"))
    assert res.returncode == 1, res.stderr[-3000:] + res.stdout[-3000:]
    _, cand_side = sides(json.loads((tmp_path / "r" / "traffic.json").read_text()), "lmstudio-1757")
    bad = failed(cand_side)
    assert re.search(r"the server sent no token and logged nothing but keep-alive pings for 3\d s while \d "
                     r"request\(s\) waited: its loop is blocked", bad["serves-after"]), bad
    assert "were still waiting for an answer when the traffic was cut" in bad["conversations-complete"], bad
    assert cand_side["starts"] == 1, cand_side["starts"]        # evidence: not made again
    assert cand_side["wall_s"] < 3 * runner.IDLE_FLOOR_S, cand_side["wall_s"]
    # the wait is said while it lasts, not left as 30 s of silence
    assert re.search(r"lmstudio-1757: no token and no log line from the candidate's server for 10 s with \d "
                     r"request\(s\) open \(cut at 30 s\)", res.stderr), res.stderr[-2000:]


def test_a_candidate_ref_of_a_users_clone_and_a_preemption_family(c2, c2_base, tmp_path):
    """--repo/--base/--candidate on a user's clone (the default patch committed on a branch), and
    --patch park-slot: a preemption family is held to its own promise, no request ends."""
    repo = clone(c2, tmp_path / "user")
    res = patchkit("apply", "--repo", str(repo.working_dir), "--branch", "evict")
    assert res.returncode == 0, res.stderr[-2000:]
    # its own declaration wins over the series' trailer (promises.py), and is what the report names
    (tmp_path / "promises.toml").write_text('expect = "eviction"\npolicy = "largest"\n')
    res = patchkit("traffic", "--repo", str(repo.working_dir), "--base", source.BASELINE_TAG, "--candidate", "evict",
                   "--workload", "lmstudio-1757", "--candidate-only", "--report-dir", str(tmp_path / "r"),
                   "--promises", str(tmp_path / "promises.toml"))
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-3000:]
    assert "one-victim-per-overflow: the pool ran out" in res.stdout and res.stdout.strip().endswith("PASS")
    doc = json.loads((tmp_path / "r" / "traffic.json").read_text())
    assert doc["promises"] == f"eviction, policy largest (file {tmp_path / 'promises.toml'})", doc["promises"]
    # rude-clients: two slots, generation-heavy turns, so the pool runs out while a slot generates
    # (a preemption family parks only generating slots: when every slot in play is mid-prompt it
    # fails them all as upstream does, which lmstudio-1757 reached in 1 run of 5, docs/measured.md)
    res = patchkit("traffic", "--patch", "park-slot", "--workload", "rude-clients", "--candidate-only", "--repeat", "2",
                   "--json", "--report-dir", str(tmp_path / "p"))
    doc = json.loads(res.stdout)
    w = doc["workloads"][0]
    assert list(w["sides"]) == ["candidate"] and len(w["sides"]["candidate"]) == 2
    row = w["summary"]["candidate"]
    assert row["repeats"] == 2 and row["turns_exact"] == 2 and row["goodput_tok_s"]["min"] > 0, row
    assert doc["promise"] == "no-request-ended"
    _, cand = sides(doc, "rude-clients")
    assert res.returncode == 0, (cand["checks"], res.stderr[-2000:])
    # nobody's turn ended by the server: the only unfinished attempts are the client's own (a hang-up,
    # the refused turn longer than the pool)
    causes = {(a["user"], a["turn"]) for a in cand["attempts"] if not a["ok"]}
    assert causes <= {(0, 0), (1, 0)}, cand["attempts"]
    assert cand["pressure"] > 0 and not cand["overflows"]
    # resend-together: three users resend their conversations at the same moment; when every slot
    # in play is still in its prompt, park-slot parks one holding nothing (it processes its prompt
    # again on resume) where it used to fail all three; in the other runs a generating slot is parked
    res = patchkit("traffic", "--patch", "park-slot", "--workload", "resend-together", "--candidate-only", "--json",
                   "--report-dir", str(tmp_path / "t"))
    _, cand = sides(json.loads(res.stdout), "resend-together")
    assert res.returncode == 0, (cand["checks"], res.stderr[-2000:])
    assert all(a["ok"] for a in cand["attempts"]) and cand["pressure"] > 0, cand["attempts"]
    # queue-starvation: the conversation terminate-one starves is parked instead and completes its
    # first turn; its second is longer than the pool, refused with a 400 as it must be
    res = patchkit("traffic", "--patch", "park-slot", "--workload", "queue-starvation", "--candidate-only", "--json",
                   "--report-dir", str(tmp_path / "q"))
    _, cand = sides(json.loads(res.stdout), "queue-starvation")
    assert res.returncode == 0, (cand["checks"], res.stderr[-2000:])
    assert not cand["lost"] and not cand["overflows"] and cand["pressure"] > 0, cand
    first = [a for a in cand["attempts"] if a["user"] == 0 and a["turn"] == 0]
    assert len(first) == 1 and first[0]["ok"], first
    got = {c["name"]: c["detail"] for c in cand["checks"]}
    assert "users [0] were refused a turn longer than the pool" in got["conversations-complete"], got


def test_a_request_queued_while_one_is_parked_waits_for_it_in_the_users_traffic(c2_base, tmp_path):
    """parked-first (issue 36, queues) judged on the users' traffic, not only a laboratory workload:
    lemonade-3276 queues six users on four slots, so requests arrive while one is parked. park-slot
    holds them back until it is back (reached: measured 4-9 such requests per run); upstream's
    admission (the variant arrivals-first) lets them start at once, and only parked-first fails:
    every turn still completes, exact."""
    res = patchkit("traffic", "--patch", "park-slot", "--workload", "lemonade-3276", "--candidate-only", "--json",
                   "--report-dir", str(tmp_path / "right"))
    _, cand = sides(json.loads(res.stdout), "lemonade-3276")
    got = {c["name"]: c for c in cand["checks"]}
    assert res.returncode == 0, (cand["checks"], res.stderr[-2000:])
    assert got["parked-first"]["status"] == "pass" and "arrived while one was parked, each started only once it " \
        "was back" in got["parked-first"]["detail"], got["parked-first"]
    res = patchkit("traffic", "--patch", "park-slot", "--variant", "arrivals-first", "--workload", "lemonade-3276",
                   "--candidate-only", "--json", "--report-dir", str(tmp_path / "first"))
    assert res.returncode == 1, res.stderr[-3000:] + res.stdout[-3000:]
    _, cand = sides(json.loads(res.stdout), "lemonade-3276")
    bad = failed(cand)
    assert list(bad) == ["parked-first"], bad
    assert re.match(r"task \d+ \(slot \d\) arrived at step \d+ and started at step \d+, while slot \d was parked "
                    r"\(since step \d+, back at step \d+\)", bad["parked-first"]), bad
    assert all(a["ok"] for a in cand["attempts"]), cand["attempts"]


def test_a_reviewers_patch_file_and_a_commit_merged_into_the_base(c2, c2_patched, tmp_path):
    """The reviewer's two ways to hand over a change that is not a series: a diff file, and a
    commit merged into the base. Both are the default patch's tree (one cached binary); neither
    carries a trailer, so its promise is recognised from its code."""
    repo = git.Repo(c2.path)
    base = source.resolve(repo, source.BASELINE_TAG)
    cand, _ = apply.candidate_commit(repo, base)
    (tmp_path / "fix.patch").write_text(repo.git.diff(base, cand) + "\n")
    for how, what in (("--patch-file", str(tmp_path / "fix.patch")), ("--commit", cand)):
        out = tmp_path / how.strip("-")
        res = patchkit("traffic", how, what, "--workload", "rude-clients", "--candidate-only", "--json",
                       "--report-dir", str(out))
        assert res.returncode == 0, (how, res.stderr[-3000:], res.stdout[-2000:])
        doc = json.loads(res.stdout)
        assert doc["candidate_label"].startswith("patch file fix.patch" if how == "--patch-file" else "commit "), doc
        assert "code: evict-largest-slot's definitions" in doc["promises"], doc["promises"]
        assert doc["outcome"] == "PASS" and doc["promise"] == "one-victim-per-overflow"


def test_refusals_name_the_conflict_and_build_nothing(tmp_path):
    res = patchkit("traffic", "--variant", "two-victims", "--commit", "HEAD", "--report-dir", str(tmp_path))
    assert res.returncode == 2 and "--variant renders a broken variant" in res.stderr, res.stderr
    res = patchkit("traffic", "--patch-file", str(tmp_path / "x.patch"), "--candidate", "main")
    assert res.returncode == 2 and "at most one of" in res.stderr, res.stderr
    (tmp_path / "bad.toml").write_text('expect = "evict"\n')
    res = patchkit("traffic", "--promises", str(tmp_path / "bad.toml"))
    assert res.returncode == 2 and "expect = 'evict' is not one of eviction, preemption" in res.stderr, res.stderr
    res = patchkit("traffic", "--workload", "nope")
    assert res.returncode == 2 and "no traffic workload 'nope'. Known: lemonade-3276" in res.stderr, res.stderr
    assert not (tmp_path / "traffic.json").exists()


def test_a_traffic_whose_pool_never_runs_out_is_made_again_then_inconclusive(c2_base, c2_patched, tmp_path):
    """Two short chats on a roomy pool: the pool cannot run out, whatever the timing, so each start
    is made again up to traffic.STARTS and the run is INCONCLUSIVE (exit 11), never PASS or FAIL."""
    from toolkit import traffic
    f = tmp_path / "roomy.toml"
    f.write_text('name = "roomy"\ndescription = "two short chats on a pool that holds them ten times"\n'
                 'cite = "-"\nsizing = "2 x ~40 cells of 1024"\nctx = 1024\nparallel = 2\nusers = 2\nturns = 1\n'
                 'user_chars = [20, 24]\nreply_tokens = [8, 8]\nthink_s = [0.0, 0.0]\nseed = 5\n')
    res = patchkit("traffic", "--workload", str(f), "--candidate-only", "--json", "--report-dir", str(tmp_path / "r"))
    assert res.returncode == 11, res.stderr[-2000:]
    _, cand = sides(json.loads(res.stdout), "roomy")
    assert cand["starts"] == traffic.STARTS and cand["pressure"] == 0 and not cand["overflows"], cand
    assert {c["name"]: c["status"] for c in cand["checks"]}["one-victim-per-overflow"] == "inconclusive"
    assert sorted(p.name for p in (tmp_path / "r").rglob("roomy.candidate*.log")) == [
        "roomy.candidate.log", "roomy.candidate.start2.log", "roomy.candidate.start3.log"]
