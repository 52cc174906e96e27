"""Workload files, prompt ids, log parsing: no processes."""
import pytest

from toolkit import record, runner, workload
from toolkit.errors import UsageError


@pytest.mark.parametrize("name", workload.available())
def test_every_fixture_loads_and_documents_its_sizing(name):
    wl = workload.load(name)
    assert wl.requests and wl.description
    assert wl.server.ctx % 256 == 0, "llama.cpp pads the KV size to 256: other sizes break the arithmetic"
    if wl.expect.candidate == "one-victim":
        assert "->" in wl.sizing, "an overflow workload writes its arithmetic next to it"
        demand = sum(len(r.prompt) + r.n_predict for r in wl.requests)
        assert demand > wl.server.ctx, "an overflow workload must overflow"
        if wl.expect.victim is not None:
            # the victims by design: the first as sized, then the largest demands left
            victim = next(r for r in wl.requests if r.slot == wl.expect.victim)
            others = sorted((r for r in wl.requests if r is not victim), key=lambda r: -(len(r.prompt) + r.n_predict))
            gone = [victim] + others[:wl.expect.victims - 1]
            rest = demand - sum(len(r.prompt) + r.n_predict for r in gone)
            assert rest <= wl.server.ctx, "survivors must fit once the victims are gone"
            if wl.expect.victims > 1:
                assert demand - len(victim.prompt) - victim.n_predict > wl.server.ctx, "one victim is not enough"


def test_fits_fits():
    wl = workload.load("fits")
    assert sum(len(r.prompt) + r.n_predict for r in wl.requests) <= wl.server.ctx


def test_control_is_big_enough():
    wl = workload.load("overflow-8")
    c = wl.control()
    assert c.server.ctx >= sum(len(r.prompt) + r.n_predict for r in wl.requests)
    assert c.requests == wl.requests


def test_prompt_ids_are_deterministic_and_never_special():
    a, b = workload.prompt_ids(100, 3), workload.prompt_ids(100, 3)
    assert a == b and len(a) == 100
    assert min(a) >= workload.N_SPECIAL and max(a) < 113
    assert workload.prompt_ids(100, 4) != a


@pytest.mark.parametrize("text,needle", [
    ("name='x'\n[server]\nctx=1\nparallel=1\n", "requests"),
    ("name='x'\n[server]\nctx=128\nparallel=2\n[[requests]]\nslot=5\nprompt_len=3\nn_predict=1\n", "slots"),
    ("name='x'\nbogus=1\n[server]\nctx=128\nparallel=1\n[[requests]]\nslot=0\nprompt_len=3\nn_predict=1\n", "unknown"),
    ("name = [unclosed\n", "TOML"),
    # `after` names another request's slot that starts on its own, and a count of tokens
    ("name='x'\n[server]\nctx=128\nparallel=2\n[[requests]]\nslot=0\nprompt_len=3\nn_predict=1\n"
     "[[requests]]\nslot=1\nprompt_len=3\nn_predict=1\nafter=[5, 10]\n", "must be [slot, tokens] naming another"),
    ("name='x'\n[server]\nctx=128\nparallel=2\n[[requests]]\nslot=0\nprompt_len=3\nn_predict=1\n"
     "[[requests]]\nslot=1\nprompt_len=3\nn_predict=1\nafter=[0, 0]\n", "1 token or more"),
    ("name='x'\n[server]\nctx=128\nparallel=2\n[[requests]]\nslot=0\nprompt_len=3\nn_predict=1\nafter=[1, 2]\n"
     "[[requests]]\nslot=1\nprompt_len=3\nn_predict=1\nafter=[0, 2]\n", "itself starts without `after`"),
    # two n_cmpl families: a child may take the other's pinned slot, and the checks cannot tell whose
    # it is (measured: a right eviction FAILED); one family beside plain requests loads (the fixtures)
    ("name='x'\n[server]\nctx=1024\nparallel=6\n[[requests]]\nslot=0\nprompt_len=3\nn_predict=1\nn_cmpl=2\n"
     "[[requests]]\nslot=2\nprompt_len=3\nn_predict=1\nn_cmpl=2\n", "judges one family per workload"),
])
def test_invalid_workload_is_refused_clearly(tmp_path, text, needle):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(UsageError) as e:
        workload.load(str(p))
    assert needle.lower() in str(e.value).lower() and str(p) in str(e.value)


def test_unknown_workload_lists_known():
    with pytest.raises(UsageError) as e:
        workload.load("nope")
    assert "overflow-4" in str(e.value)


def test_events_from_log():
    log = ("0.01.3 W srv  evict_one_sl: KV cache is full: terminating slot 3 (287 cells, the most) so that 3 other "
           "slots can continue, off = 0\n"
           "0.00.4 E srv  decode: Context size has been exceeded. off = 2, n_batch = 1, ret = 1\n")
    ev = record.events_from_log(log)
    assert ev[0] == record.Event("evict", 0, 3, 287, ())
    assert ev[1].kind == "error-all" and ev[1].off == 2


def test_launch_spread_is_the_largest_gap_of_the_first_group():
    wl = workload.load("staggered")  # slots 0-1 at 0 ms, 2-3 at 15 ms: only 0-1 were released together
    log = "\n".join([
        "0.00.100.000 I slot launch_slot_: id  0 | task 1 | processing task",
        "0.00.100.050 I slot launch_slot_: id  1 | task 2 | processing task",
        "0.00.115.000 I slot launch_slot_: id  2 | task 3 | processing task",
        "0.00.117.000 I slot launch_slot_: id  3 | task 4 | processing task",
    ])
    assert runner.launch_spread_ms(log, wl) == pytest.approx(0.05)
    eight = "\n".join(f"0.00.100.{100 * i:03d} I slot launch_slot_: id  {i} | task {i} | processing task"
                       for i in range(8))
    assert runner.launch_spread_ms(eight, workload.load("overflow-8")) == pytest.approx(0.1)


def test_a_request_sent_after_anothers_tokens_is_not_in_the_first_group():
    wl = workload.load("park-arrivals-3")
    assert wl.requests[2].after == (1, 210) and [r.slot for r in wl.first_group()] == [0, 1]
    assert [r.slot for r in workload.load("staggered").first_group()] == [0, 1]
    # the queue's "new task" line is a post; the loop's own tasks post too (no launch names them)
    trace = record.trace_from_log("que          post: new task, id = 7/1, front = 0\n"
                                  "que          post: new task, id = 8, front = 0\n"
                                  "slot launch_slot_: id  2 | task 7 | processing task\n")
    # a request's post is kept; one no launch names (the loop's own NEXT_RESPONSE, a cancel) is not
    assert [(t.kind, t.task) for t in trace] == [("post", 7), ("launch", 7)]


def test_a_sampled_token_is_read_in_every_layouts_words():
    """C2 and D log a sample as "n_gen = N", A to C as "n_decoded = N" (the same count): read as
    "n_gen" only, a layout B server's log had no samples, and every log check failed on the base as
    much as on the candidate ("2 tokens decoded for 0 sampled"; measured on 0.3.28)."""
    line = "slot process_toke: id  0 | task 5 | {} = 3, n_remaining = 1797, next token:    17 '/'\n"
    new, old = (record.trace_from_log(line.format(w)) for w in ("n_gen", "n_decoded"))
    assert new == old and [(t.kind, t.slot, t.task, t.value, t.token) for t in new] == [("token", 0, 5, 3, 17)]


def test_shift_workloads_are_marked():
    assert workload.load("victim-first").expect.shift and workload.load("victim-middle").expect.shift
    assert not workload.load("overflow-4").expect.shift


def test_request_body_pins_the_slot_and_is_greedy():
    r = workload.load("overflow-4").requests[2]
    body = r.body()
    assert body["id_slot"] == 2 and body["ignore_eos"] and body["temperature"] == 0.0
    assert body["return_tokens"] and body["n_predict"] == 240 and len(body["prompt"]) == 80


def test_pool_is_what_the_server_built():
    plain = "0.00.005.874 I llama_kv_cache: size =    0.50 MiB (   512 cells,   2 layers,  2/1 seqs), K (f16)"
    iswa = ("0.00.008.614 I llama_kv_cache_iswa: creating non-SWA KV cache, size = 1024 cells\n"
            "0.00.008.664 I llama_kv_cache_iswa: creating     SWA KV cache, size = 768 cells")
    assert record.pool_cells(plain, 278) == 512      # llama.cpp pads -c 278
    assert record.pool_cells(iswa, 1024) == 1024     # the full-attention cache, not the window's
    assert record.pool_cells("", 278) == 512         # no log: the same padding rule


# two llama-server --help excerpts, verbatim: layout A (llama-cpp-python 0.3.16) and C2 (0.3.35)
HELP_A = """-fa,   --flash-attn                     enable Flash Attention (default: disabled)
--kv-unified, -kvu                      use single unified KV buffer for the KV cache of all sequences
--slots                                 enable slots monitoring endpoint (default: disabled)
"""
HELP_C2 = """-fa,   --flash-attn [on|off|auto]       set Flash Attention use ('on', 'off', or 'auto', default: 'auto')
-cram, --cache-ram N                    set the maximum cache size in MiB (default: 8192, -1 - no limit, 0 -
-kvu,  --kv-unified, -no-kvu, --no-kv-unified
--slots, --no-slots                     expose slots monitoring endpoint (default: enabled)
"""


def test_a_workloads_flags_in_an_older_servers_words():
    """Layout A's server refused `-fa off` ("invalid argument: off"): its -fa takes no value and off is
    its default; it has no --cache-ram and no -no-kvu (their settings are its defaults) and /slots is
    off unless asked. A newer server gets the flags as they are."""
    from toolkit.server import translate

    flags = workload.load("overflow-4").server.argv()
    assert translate(flags, HELP_C2) == flags
    assert flags[flags.index("-fa") + 1] == "off" and "--cache-ram" in flags
    dropped = list(flags)
    for a in ("-fa", "--cache-ram"):   # each with its value
        del dropped[dropped.index(a):dropped.index(a) + 2]
    assert translate(flags, HELP_A) == dropped + ["--slots"]
    assert translate(["-fa", "on", "-no-kvu"], HELP_A) == ["-fa", "--slots"]
    assert translate(["-fa", "on", "-no-kvu"], HELP_C2) == ["-fa", "on", "-no-kvu"]
