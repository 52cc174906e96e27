"""Traffic workloads: the plan, the judge's verdicts on constructed runs (each check able to fail,
and failing for its reason), the overflow grouping read from upstream's log."""
from __future__ import annotations

from dataclasses import replace

import pytest

from toolkit import model, traffic
from toolkit.errors import UsageError
from toolkit.record import Trace


def test_every_fixture_loads_and_plans_the_same_traffic_twice():
    assert {"lmstudio-1757", "lemonade-3276"} <= set(traffic.available())
    for name in traffic.available():
        t = traffic.load(name)
        assert t.cite.startswith("https://github.com/")
        assert traffic.plan(t) == traffic.plan(t)
        assert len(traffic.plan(t)) == t.users and all(len(u) == t.turns for u in traffic.plan(t))


def test_a_user_backs_off_doubling_between_tries_and_gives_up_without_a_last_wait():
    t = traffic.load("lmstudio-1757")
    assert [traffic.backoff(t, r) for r in range(t.retries)] == [0.25, 0.5, 1, 2, 4, 8]
    # what a user who gives up waited in all, beyond thinking: the six waits between seven tries
    # (the loop once slept a seventh, 16 s after its last try, before it gave up: 31.75 s)
    assert sum(traffic.backoff(t, r) for r in range(t.retries)) == 15.75


def test_a_server_is_stalled_only_when_silent_with_a_request_waiting(tmp_path):
    """runner.Stall: no token (the pulse's count) and no log line but keep-alive pings for quiet_s
    while a request waits. Users thinking (none waiting), a token or a loop's log line each start
    the clock again, a ping does not (C2 logs one per open stream every 30 s, whatever its loop
    does), nor half a line until it is whole."""
    import time

    from toolkit import runner
    log = tmp_path / "server.log"
    log.write_text("start\n")

    def logged(text):
        with open(log, "a") as fh:
            fh.write(text)
    stall = runner.Stall(log, quiet_s=0.2)
    assert stall(1, 1) is None
    time.sleep(0.25)
    assert stall(2, 1) is None                  # a token heard: not silent
    time.sleep(0.25)
    logged("0.01.000.000 D slot update_slots: id  0 | task 3 | ...\n")
    assert stall(2, 1) is None                  # a line of the loop: not silent
    time.sleep(0.25)
    assert stall(2, 0) is None                  # silent, but nobody waits (users thinking)
    time.sleep(0.25)
    assert stall.silent_for() == 0.0
    assert stall(2, 2) is None                  # someone waits: the clock starts now
    time.sleep(0.25)
    logged("0.30.606.944 D srv    operator(): sending SSE ping\n0.30.607.544 D srv    operator(): http: "
           "streamed chunk: :\n\n\n0.30.607.600 D srv    oper")
    said = stall(2, 2)                          # pings, and a line not yet whole, are no progress
    assert said and said.startswith("the server sent no token and logged nothing but keep-alive pings for 0 s") \
        and "while 2 request(s) waited: its loop is blocked" in said, said
    logged("ator(): sending SSE ping\n")
    assert stall(2, 2) == said                  # its end, another ping: still silent
    assert stall.silent_for() >= 0.25
    logged("0.31.000.000 D que    start_loop: processing new tasks\n")
    assert stall(2, 2) is None
    # a growth past READ_MAX is a loop at work, counted without reading it (a flooding log costs no read)
    time.sleep(0.25)
    assert stall(2, 2) is not None
    logged("0.31.000.001 D srv    operator(): sending SSE ping\n" * 200)
    assert stall(2, 2) is None and stall.offset == log.stat().st_size


def test_a_wait_on_a_silent_server_is_said_once_per_period_until_a_byte_comes():
    """runner.Waiting, a laboratory run's exchange watcher: a request that waits its idle timeout
    (30 s or more) on a silent server is said every WAIT_SAID_S (10 s), each period once, and a byte (a
    newer `last`) starts the count again. It never cuts anything (exchange's flood: None)."""
    import time

    from toolkit import runner
    said = []
    w = runner.Waiting(said.append, "overflow-4.candidate.0", 30)
    now = time.monotonic()
    assert w(now - 3) is None and said == []                 # 3 s: not yet a period
    w(now - 10.5)
    w(now - 12)                                             # the same period: said once
    assert said == ["  overflow-4.candidate.0: no byte from the server for 10 s with a request open "
                    "(timeout at 30 s)"], said
    w(now - 21)
    assert said[-1].endswith("for 20 s with a request open (timeout at 30 s)") and len(said) == 2
    w(now - 1)                                              # a byte came: the count starts again
    w(now - 10.2)
    assert len(said) == 3 and "for 10 s" in said[-1]


def test_a_pulse_counts_what_is_heard_and_the_requests_still_waiting():
    class Failing:           # a client whose request fails at once: the pulse still closes it
        class chat:
            class completions:
                @staticmethod
                def create(**_kw):
                    raise RuntimeError("no server")
    pulse = traffic.Pulse()
    a = traffic._ask(Failing(), [], traffic.Turn(0, 0, "hi", 4, 0.0), 0, 0.0, [0], pulse)
    assert a.cause == "client" and (pulse.heard, pulse.waiting) == (1, 0)


def test_messages_are_vocabulary_characters_so_they_tokenize_one_per_character():
    vocab = set(model.vocabulary()[3:])
    for name in traffic.available():
        for user in traffic.plan(traffic.load(name)):
            for turn in user:
                assert set(turn.message.replace(" ", "\u2581")) <= vocab, turn.message
                assert turn.message == turn.message.strip() and turn.max_tokens > 0


def _cells(turns):
    """Cells a conversation holds at the end of each turn (its prompt as traffic counts it, then
    the longest reply the turn allows)."""
    out, messages = [], []
    for x in turns:
        messages.append({"role": "user", "content": x.message})
        out.append(traffic._cells(messages) + x.max_tokens)
        messages.append({"role": "assistant", "content": "x" * x.max_tokens})
    return out


def test_the_heavy_user_outgrows_its_share_in_lmstudio_by_arithmetic():
    """The overflow by design, not by timing: user 0 beside either other user at the same turn 3,
    or at its turn 4 beside either at turn 2, holds more than the pool; alone every one fits."""
    t = traffic.load("lmstudio-1757")
    cells = [_cells(u) for u in traffic.plan(t)]
    assert all(cells[0][2] + c[2] > t.ctx for c in cells[1:])
    assert all(cells[0][3] + c[1] > t.ctx for c in cells[1:])
    assert max(c[-1] for c in cells) < t.ctx


def test_queue_starvation_makes_the_long_conversation_the_victim_by_arithmetic():
    """User 0's first turn fits the pool alone and overflows beside any other request's prompt; at
    any overflow it holds more cells than any chat can (its first 512-token batch always fits
    beside one), and two chats never outgrow the pool between them: whenever user 0 runs beside a
    chat, terminate-one ends user 0, whatever the timing (margins of 16 cells for template marks)."""
    t = traffic.load("queue-starvation")
    plans = traffic.plan(t)
    cells = [_cells(u) for u in plans]
    first_prompt = min(1 + len(u[0].message) + 1 for u in plans[1:])
    chats = max(c[-1] for c in cells[1:])
    assert cells[0][0] + 16 <= t.ctx < cells[0][0] + first_prompt - 16
    assert chats + 16 < 512 and 512 + chats + 16 < t.ctx and 2 * chats + 16 < t.ctx
    assert t.retries == 2 and t.think_s == (0.0, 0.0)


def test_bad_files_are_refused_with_the_reason(tmp_path):
    with pytest.raises(UsageError, match="no traffic workload"):
        traffic.load("nope")
    p = tmp_path / "x.toml"
    p.write_text("name = 'x'\nbogus = 1\n")
    with pytest.raises(UsageError, match="bogus"):
        traffic.load(str(p))
    p.write_text("name = [")
    with pytest.raises(UsageError, match="invalid traffic workload file"):
        traffic.load(str(p))


def _t(**kw):
    base = dict(name="t", description="", cite="", sizing="", ctx=512, parallel=2, users=2, turns=1,
                user_chars=(4, 4), reply_tokens=(4, 4), think_s=(0, 0))
    return traffic.Traffic(**{**base, **kw})


def _a(user, turn, attempt, prompt, text, error="", status=200, cached=None):
    return traffic.Attempt(user, turn, attempt, prompt, 0.0, 0.1, 1.0, error, status, text, 1, cached)


def _run(attempts, overflows=(1,), lost=(), after="completed", pressure=1):
    return traffic.TrafficRun("t", "candidate", 2.0, tuple(attempts), ((), ()), tuple(lost), after, "log", (),
                              tuple(overflows), None, pressure)


def test_a_right_run_passes_and_says_what_it_covered():
    run = _run([_a(0, 0, 0, "p0", "abcd"), _a(1, 0, 0, "p1", "ab", error="Context size has been exceeded."),
                _a(1, 0, 1, "p1", "wxyz")])
    side = traffic.judge(_t(), run, {"p0": "abcd", "p1": "wxyz"})
    # the partial "ab" is not a prefix of "wxyz": that is its own failure
    assert side.outcome == "FAIL" and "partials-prefix" in [c.name for c in side.checks if c.status == "fail"]
    side = traffic.judge(_t(), run, {"p0": "abcd", "p1": "abyz"})
    assert side.outcome == "FAIL" and [c.name for c in side.checks if c.status == "fail"] == ["turns-exact"]
    run = _run([_a(0, 0, 0, "p0", "abcd"), _a(1, 0, 0, "p1", "ab", error="x"), _a(1, 0, 1, "p1", "abyz")])
    side = traffic.judge(_t(), run, {"p0": "abcd", "p1": "abyz"})
    assert side.outcome == "PASS", side.checks
    assert side.users[1].failed == 1 and side.users[1].turns == 1 and dict(side.users[1].statuses)["stream-error"] == 1
    assert side.goodput == pytest.approx((4 + 4) / 2.0)


def test_a_changed_turn_fails_with_the_place_and_both_texts_quoted():
    side = traffic.judge(_t(), _run([_a(0, 0, 0, "p0", "abcX"), _a(1, 0, 0, "p1", "q")]), {"p0": "abcd", "p1": "q"})
    bad = [c for c in side.checks if c.status == "fail"]
    assert [c.name for c in bad] == ["turns-exact"]
    assert "user 0 turn 0 try 0" in bad[0].detail and "character 3" in bad[0].detail and "'X'" in bad[0].detail


def test_two_requests_ended_by_one_overflow_fail_and_no_overflow_is_inconclusive():
    ok = [_a(0, 0, 0, "p0", "abcd"), _a(1, 0, 0, "p1", "q")]
    ctl = {"p0": "abcd", "p1": "q"}
    side = traffic.judge(_t(), _run(ok, overflows=(1, 2)), ctl)
    assert side.outcome == "FAIL" and "ended more than one" in side.checks[2].detail
    side = traffic.judge(_t(), _run(ok, overflows=(), pressure=0), ctl)
    assert side.outcome == "INCONCLUSIVE" and "never ran out" in side.checks[2].detail
    # pressure resolved without ending anyone (idle slots purged): reached, and one victim each holds
    assert traffic.judge(_t(), _run(ok, overflows=(), pressure=2), ctl).outcome == "PASS"


def test_a_start_whose_pool_never_ran_out_is_made_again_and_an_earlier_starts_failure_is_kept():
    """compare() makes a run again while its pool never ran out (at most STARTS in all); of the
    starts, the first with a failed check is reported, else the last, with the count."""
    ok = [_a(0, 0, 0, "p0", "abcd"), _a(1, 0, 0, "p1", "q")]
    ctl = {"p0": "abcd", "p1": "q"}
    idle = traffic.judge(_t(), _run(ok, overflows=(), pressure=0), ctl)
    reached = traffic.judge(_t(), _run(ok, overflows=(1,), pressure=2), ctl)
    wrong = traffic.judge(_t(), _run([_a(0, 0, 0, "p0", "abcX"), _a(1, 0, 0, "p1", "q")], overflows=(), pressure=0), ctl)
    assert (idle.outcome, reached.outcome, wrong.outcome) == ("INCONCLUSIVE", "PASS", "FAIL")
    got = traffic.reported([idle, reached])
    assert (got.outcome, got.starts, got.run.pressure) == ("PASS", 2, 2)
    got = traffic.reported([wrong, reached])
    assert (got.outcome, got.starts) == ("FAIL", 2), "an earlier start's evidence is never dropped"
    got = traffic.reported([idle] * traffic.STARTS)
    assert (got.outcome, got.starts) == ("INCONCLUSIVE", traffic.STARTS)
    assert traffic.reported([reached]).starts == 1
    assert "3 starts made" in "\n".join(traffic._side_text("candidate", got, _t()))


def test_a_start_is_made_again_when_its_pool_never_ran_out_or_a_queue_never_met_a_park():
    """traffic.missed decides compare()'s next start: none made yet, a pool that never ran out, or,
    for a candidate promising parked-first on a traffic that queues (more users than slots), no
    request arriving while one was parked. Otherwise, or when it holds evidence, the start stands."""
    from dataclasses import replace

    ok = [_a(0, 0, 0, "p0", "abcd")]
    idle, reached = _run(ok, overflows=(), pressure=0), _run(ok, overflows=(), pressure=2)
    queued = replace(reached, admissions=("a request that arrived while one was parked",))
    queue = _t(users=3, parallel=2)
    assert traffic.missed(queue, [], True) == "not started"
    assert traffic.missed(queue, [idle], False) == "the pool never ran out"
    assert traffic.missed(queue, [reached], True) == "no request arrived while one was parked"
    assert traffic.missed(queue, [reached], False) == ""       # no such promise, or the base side
    assert traffic.missed(queue, [queued], True) == ""
    assert traffic.missed(_t(users=2, parallel=2), [reached], True) == ""   # nobody queues: not sized for it
    # a start holding evidence (cut at its flooding log or deadline, a server that died) stands,
    # its pool run out or not: serves-after fails on it, another start would wait out another hang
    for after in ("the traffic was cut: the server logged 17 MB while no request received anything", "the server died"):
        assert traffic.missed(queue, [replace(idle, serves_after=after)], True) == ""


def test_a_preemption_family_promises_no_request_ends():
    ok = [_a(0, 0, 0, "p0", "abcd"), _a(1, 0, 0, "p1", "q")]
    ctl = {"p0": "abcd", "p1": "q"}
    assert traffic.judge(_t(), _run(ok, overflows=(), pressure=3), ctl, "preemption").outcome == "PASS"
    ended = ok + [_a(1, 0, 0, "p1", "", error="Context size has been exceeded.")]
    side = traffic.judge(_t(), _run(ended, overflows=(1,), pressure=3), ctl, "preemption")
    bad = [c for c in side.checks if c.status == "fail"]
    assert [c.name for c in bad] == ["no-request-ended"] and "Context size has been exceeded." in bad[0].detail


def test_a_lost_conversation_and_a_dead_server_fail():
    ok = [_a(0, 0, 0, "p0", "abcd"), _a(1, 0, 0, "p1", "q")]
    ctl = {"p0": "abcd", "p1": "q"}
    side = traffic.judge(_t(), _run(ok, lost=(1,)), ctl)
    assert [c.name for c in side.checks if c.status == "fail"] == ["conversations-complete"]
    side = traffic.judge(_t(), _run(ok, after="the server died"), ctl)
    assert [c.name for c in side.checks if c.status == "fail"] == ["serves-after"]
    # a user still waiting when the run was cut did not give up: each is named for what happened
    cut = replace(_run(ok, lost=(0, 1), after="the traffic was cut: ..."), stuck=(1,))
    said = {c.name: c.detail for c in traffic.judge(_t(), cut, ctl).checks if c.status == "fail"}
    assert said["conversations-complete"] == ("users [0] gave up after 6 regenerates; users [1] were still waiting "
                                              "for an answer when the traffic was cut"), said


def test_a_user_lost_only_as_the_one_victim_of_each_overflow_is_starved_not_failed():
    """Terminate-one behind a queue: user 1's turn was the one request each of three overflows
    ended, three tries in a row. The promise held; the loss is the design's, reported as such.
    The same loss with an ended request no overflow answers for, or an overflow that ended two, or
    under a preemption family's promise, fails."""
    ctl = {"p0": "abcd", "p1": "wxyz"}
    tries = [_a(1, 0, k, "p1", "wx", error="Context size has been exceeded.") for k in range(3)]
    run = _run([_a(0, 0, 0, "p0", "abcd")] + tries, overflows=(1, 1, 1), lost=(1,))
    side = traffic.judge(_t(), run, ctl)
    got = {c.name: c for c in side.checks}
    assert side.outcome == "PASS" and side.starved == (1,), side.checks
    assert "users [1] starved" in got["conversations-complete"].detail
    assert "1 of them starved by the policy" in traffic.text(traffic.Result(_t(), (), (side,)))
    assert traffic.summary((side,), _t())["users_starved"] == 1
    # an ended request no overflow accounts for: lost, not starved
    side = traffic.judge(_t(), _run([_a(0, 0, 0, "p0", "abcd")] + tries, overflows=(1, 1), lost=(1,)), ctl)
    assert side.starved == () and [c.name for c in side.checks if c.status == "fail"] == ["conversations-complete"]
    # an overflow that ended two: the promise fails, and the loss is not excused either
    side = traffic.judge(_t(), _run([_a(0, 0, 0, "p0", "ab", error="x")] + tries, overflows=(2, 1, 1), lost=(1,)), ctl)
    assert side.starved == () and {"one-victim-per-overflow", "conversations-complete"} <= \
        {c.name for c in side.checks if c.status == "fail"}
    # a try the client itself broke is no evidence that the policy starved anyone
    broken = tries[:2] + [traffic.Attempt(1, 0, 2, "p1", 0.0, None, 1.0, "PydanticUserError", None, "", 1, None,
                                          "client")]
    side = traffic.judge(_t(), _run([_a(0, 0, 0, "p0", "abcd")] + broken, overflows=(1, 1), lost=(1,)), ctl)
    assert side.starved == () and "conversations-complete" in {c.name for c in side.checks if c.status == "fail"}
    # a user still waiting when the run was cut, its earlier tries each an overflow's one victim: its
    # last try was never answered, so nothing shows the policy starved it
    side = traffic.judge(_t(), replace(run, stuck=(1,), serves_after="the traffic was cut: ..."), ctl)
    assert side.starved == () and "users [1] were still waiting" in \
        {c.name: c.detail for c in side.checks}["conversations-complete"], side.checks
    # no-request-ended: a preemption family never starves by design
    side = traffic.judge(_t(), run, ctl, "preemption")
    assert side.starved == () and "conversations-complete" in {c.name for c in side.checks if c.status == "fail"}


def test_a_refusal_is_excused_only_for_a_turn_longer_than_the_pool():
    """queue-starvation's user 0 under a preemption family: its first turn completes, its second is
    longer than the pool and refused (a 400, not retried): it must be, and the check says so. The
    same refusal of a turn that fits is a refusal with no reason, and fails with the cells."""
    ctl = {"p0": "abcd", "p1": "q"}
    refused = traffic.Attempt(1, 1, 0, "p2", 0.0, None, 0.1, "exceeds the available context size", 400, "", 1,
                              None, "refused")
    att = [_a(0, 0, 0, "p0", "abcd"), _a(0, 1, 0, "p0", "abcd"), _a(1, 0, 0, "p1", "q"), refused]

    def run(second: str):
        conv = ((), ({"role": "user", "content": "x"}, {"role": "assistant", "content": "q"},
                     {"role": "user", "content": second}))
        return traffic.TrafficRun("t", "candidate", 2.0, tuple(att), conv, (), "completed", "log", (), (1,), None, 1)

    side = traffic.judge(_t(turns=2), run("y" * 600), ctl)       # 2 + 2 + 601 + 1 cells > 512
    got = {c.name: c for c in side.checks}
    assert got["conversations-complete"].status == "pass", got["conversations-complete"]
    assert "1 users completed 2 turns" in got["conversations-complete"].detail
    assert "users [1] were refused a turn longer than the pool" in got["conversations-complete"].detail
    side = traffic.judge(_t(turns=2), run("y" * 40), ctl)
    got = {c.name: c for c in side.checks}
    assert got["conversations-complete"].status == "fail"
    assert "user 1 turn 1 refused although its 46 cells fit the 512-cell pool" in got["conversations-complete"].detail
    # no recorded conversation holding the refused turn: no evidence it was too long, no excuse
    bare = replace(run("y" * 600), conversations=((), ()))
    got = {c.name: c for c in traffic.judge(_t(turns=2), bare, ctl).checks}
    assert got["conversations-complete"].status == "fail"
    assert "no recorded conversation shows it longer" in got["conversations-complete"].detail


def test_overflows_group_the_errors_of_one_failed_placement():
    tr = (Trace("loop"), Trace("batch"), Trace("error", 0, 1, text="Context size has been exceeded."),
          Trace("error", 1, 2, text="Context size has been exceeded."), Trace("loop"), Trace("step"),
          Trace("retry"), Trace("error", 2, 3, text="slot evicted, retry"), Trace("loop"),
          Trace("error", 0, 4, text="something else"))
    assert traffic.overflows(tr) == (2, 1)
    assert traffic.pressure(tr) == 2
    # a right eviction: a failure, one victim, a failure again in the same loop turn, one victim
    tr = (Trace("loop"), Trace("batch"), Trace("error", 0, 1, text="Context size has been exceeded."),
          Trace("batch"), Trace("error", 1, 2, text="Context size has been exceeded."), Trace("loop"))
    assert traffic.overflows(tr) == (1, 1) and traffic.pressure(tr) == 1


def test_prompts_are_rebuilt_from_the_conversations_including_an_unanswered_last_turn():
    conv0 = ({"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"})
    run = traffic.TrafficRun("t", "base", 1.0, (), (conv0,), (0,), "completed", "", (), (), None)
    keys = traffic.prompts([run])
    assert set(keys) == {traffic.key([conv0[0]]), traffic.key(list(conv0))}


def test_shapes_read_the_log_and_a_retry_served_from_cache():
    log = "x selected slot by LCP similarity y\nz no slot is available, defer task, id_task = 3"
    got = traffic.shapes(log, [_a(0, 0, 1, "p", "t", cached=12)])
    assert got == ("slot-by-similarity", "task-queued", traffic.RETRY_CACHED)
    assert traffic.shapes("", [_a(0, 0, 0, "p", "t", cached=12)]) == ()


def test_rude_clients_are_planned_and_judged_for_their_own_promise():
    t = traffic.load("rude-clients")
    plan = traffic.plan(t)
    assert len(plan[0][0].message) > t.ctx and plan[1][0].hangup == t.hangup_after and plan[2][0].hangup == 0
    refused = traffic.Attempt(0, 0, 0, "big", 0, None, 0.1, "request (1090 tokens) exceeds the available context "
                              "size (1024 tokens)", 400, "", 1, None, "refused")
    hung = traffic.Attempt(1, 0, 0, "p1", 0, 0.1, 0.2, "the client closed the stream", 200, "abcdefgh", 1, None, "hangup")
    again = _a(1, 0, 1, "p1", "abcdefghij")
    ctl = {"p1": "abcdefghij"}
    side = traffic.judge(t, _run([refused, hung, again]), ctl)
    got = {c.name: c for c in side.checks}
    assert got["bad-input-handled"].status == "pass" and "400" in got["bad-input-handled"].detail
    assert got["turns-exact"].status == "pass", "a refusal has no control and needs none"
    # a server that answered the impossible turn (or with a 5xx) fails, quoting what it said
    served = replace(refused, error="", status=200, text="zz", cause="")
    side = traffic.judge(t, _run([served, hung, again]), {**ctl, "big": "zz"})
    bad = {c.name: c.detail for c in side.checks if c.status == "fail"}
    assert "bad-input-handled" in bad and "want a 4xx" in bad["bad-input-handled"]
    # a hang-up whose regenerate never completed fails too
    side = traffic.judge(t, _run([refused, hung]), ctl)
    assert "its regenerate did not complete" in {c.name: c.detail for c in side.checks}["bad-input-handled"]


def test_first_turns_arrive_together_so_a_burst_beyond_the_slots_queues_by_construction():
    for name in traffic.available():
        assert all(u[0].think_s == 0.0 for u in traffic.plan(traffic.load(name))), name


def _side(goodput, p99, outcome_ok=True):
    checks = (traffic.Check("turns-exact", "pass" if outcome_ok else "fail", ""),)
    return traffic.Side(_run([]), (), 0.1, 0.2, 0.3, p99, goodput, checks)


def test_the_referee_rows_rank_only_what_the_runs_separate():
    t = _t()
    five = {"terminate": tuple(_side(g, p) for g, p in zip((300, 310, 320, 330, 340), (.4, .6, .5, .55, .45))),
            "park": tuple(_side(g, p) for g, p in zip((500, 510, 520, 530, 540), (.5, .52, .48, .58, .44)))}

    def lines(by):
        return traffic.referee_rows(*traffic.strategy_rows(t, by))
    got = lines(five)
    assert got[2].startswith("| terminate | PASS | 0/10 | 320 [300-340]"), got[2]
    assert "goodput: park better than terminate (p = 0.008" in got[-1]
    assert "latency p99" not in got[-1], "overlapping p99s: no claim"
    three = {k: v[:3] for k, v in five.items()}
    assert lines(three)[-1].startswith("claims: none"), "3 + 3 runs: p >= 0.1, never a claim"
    # a strategy that failed a check is named with its outcome and never raced
    bad = {**five, "broken": tuple(_side(900, 0.1, outcome_ok=False) for _ in range(5))}
    rows = lines(bad)
    assert any(r.startswith("| broken | FAIL") for r in rows) and "broken" not in rows[-1]
    # the base is measured, not judged: a row with no outcome, never ranked, however fast it looks
    with_base = {"base": tuple(_side(5000, 0.01) for _ in range(5)), **five}
    rows, said = traffic.strategy_rows(t, with_base)
    assert rows[0].entry == "base" and rows[0].outcome == "-" and not any("base" in c for c in said), said
    # a starved user is a column of its own: the cost of terminate-one behind a queue, beside park
    starving = {**five, "terminate": tuple(replace(s, starved=(0,)) for s in five["terminate"])}
    got = lines(starving)
    assert got[0].endswith("| users starved |") and got[2].endswith("| 5 |") and got[3].endswith("| 0 |"), got


def test_a_client_library_failure_is_no_evidence_against_the_server():
    ok = [_a(0, 0, 0, "p0", "abcd"), _a(1, 0, 1, "p1", "q")]
    broken = traffic.Attempt(1, 0, 0, "p1", 0, None, 0.1, "PydanticUserError: not fully defined", 200, "", 1, None,
                             "client")
    side = traffic.judge(_t(), _run(ok + [broken], overflows=(), pressure=2), {"p0": "abcd", "p1": "q"}, "preemption")
    got = {c.name: c for c in side.checks}
    assert got["no-request-ended"].status == "pass", "the client's failure is not a request the server ended"
    assert got["client-sound"].status == "inconclusive" and "PydanticUserError" in got["client-sound"].detail
    assert side.outcome == "INCONCLUSIVE"


def _queue_trace(started: int, posted: int = 4):
    """Slot 0 serves task 1 then task 5; task 1 is parked after its entry in step 2 and back in step 6
    while slot 1's task 2 decodes every step; task 9 is queued in step `posted` and starts on slot 1
    in step `started` (slot 1's task 2 ended in step 3)."""
    tr = []
    for step in range(9):
        tr.append(Trace("step"))
        if step == posted:
            tr.append(Trace("post", task=9))
        if step == started:
            tr.append(Trace("launch", 1, 9))
        if step not in (3, 4, 5):
            tr.append(Trace("entry", 0, 1 if step < 7 else 5, 100 + step))
        if step <= 3:
            tr.append(Trace("entry", 1, 2, 10 + step))
        elif step >= started:
            tr.append(Trace("entry", 1, 9, 10 + step))
    return tuple(tr)


def test_traffic_judges_parked_first_per_task_from_upstreams_log():
    """In traffic a slot serves many tasks: a park is a gap in one task's entries while others went
    on (task 1: steps 2 -> 6). Task 9, queued in step 4, kept its turn when it started in step 6;
    started in step 4 it went ahead of the parked one: a FAIL quoting where. Judged only for a
    candidate that promises it, and a run where nobody was queued during a park is not a verdict."""
    from toolkit import pauses

    (a,) = pauses.queue_admissions(_queue_trace(started=6))
    assert (a.task, a.slot, a.arrived, a.started, a.parked, a.park_step, a.resume_step, a.first) == \
        (9, 1, 4, 6, 0, 2, 6, True)
    assert not pauses.queue_admissions(_queue_trace(started=4))[0].first
    assert pauses.queue_admissions(_queue_trace(started=7, posted=7)) == ()   # queued after the resume
    # task 5 follows task 1 on slot 0 (step 7): a new task on the slot, not a pause of it
    assert {x.parked for x in pauses.queue_admissions(_queue_trace(started=6))} == {0}
    ok = [_a(0, 0, 0, "p0", "abcd"), _a(1, 0, 0, "p1", "q")]
    ctl = {"p0": "abcd", "p1": "q"}

    def side(started, parked_first=True, posted=4):
        run = replace(_run(ok, overflows=(), pressure=3),
                      admissions=pauses.queue_admissions(_queue_trace(started, posted)))
        return traffic.judge(_t(), run, ctl, "preemption", parked_first)
    assert side(6).outcome == "PASS" and [c.status for c in side(6).checks if c.name == "parked-first"] == ["pass"]
    bad = [c for c in side(4).checks if c.status == "fail"]
    assert side(4).outcome == "FAIL" and [c.name for c in bad] == ["parked-first"]
    assert bad[0].detail == ("task 9 (slot 1) arrived at step 4 and started at step 4, while slot 0 was parked "
                             "(since step 2, back at step 6)")
    assert "parked-first" not in [c.name for c in side(4, parked_first=False).checks]   # not promised: not judged
    skipped = side(7, posted=7)
    assert skipped.outcome == "PASS" and [c.status for c in skipped.checks if c.name == "parked-first"] == ["skip"]
    assert traffic.Result(_t(), (), (skipped,)).outcome == "PASS"   # a promise not reached is no verdict
