"""Rendering the eviction patch from layout facts: pure text, no processes."""
import dataclasses
import re
from pathlib import Path

import jinja2
import pytest

from toolkit import anchors, patch
from toolkit.errors import UsageError

SRC = b"""// the server
struct server_context {
    // returns true = success
    bool decode(int32_t & n_batch, int32_t off) {
        if (ret != 0) {
            if (n_batch == 1 && ret == 1) {
                // TODO: try to terminate only the largest active slot/sequence and continue with the rest
                //       need to remove the tokens from the current batch too
                err = "Context size has been exceeded.";
            }
        }
        return true;
    }
};

void routes(server_context & ctx_server) {
    auto get_metrics = [&](response * res) {
        res->data = res_task->to_metrics();
        return res;
    };
}
"""


def facts(**kw):
    surgery_at = 0
    helper_at = SRC.index(b"    // returns")
    hook_at = SRC.index(b"ret == 1) {") + len(b"ret == 1) {")
    hook_end = SRC.index(b"too\n") + len(b"too")
    base = dict(layout="C2", file="tools/server/server-context.cpp", handler="decode", off="off", ctx="ctx_tgt",
                n_batch="n_batch", retry="return false;", batch_model="tokens", has_embd=True, has_tokens_ptr=True,
                has_spec_i_batch=True,
                terminate="if (slot.is_processing()) {\n    send_error(slot, err);\n    slot.release();\n"
                          "    slot.prompt_clear();\n}",
                frees_cells=True, cache_tokens="prompt.tokens", task_id="(SLOT->task ? SLOT->task->id : -1)",
                surgery_at=surgery_at, helper_at=helper_at, helper_indent="    ", hook_at=hook_at, hook_indent="                ",
                hook_end=hook_end, metrics_sites=anchors.metrics_sites(SRC))
    base.update(kw)
    return anchors.Facts(**base)


SPEC = patch.load_patch()
LAYOUTS = {
    "A": dict(layout="A", batch_model="plain", has_embd=False, has_tokens_ptr=False, has_spec_i_batch=False,
              frees_cells=False, cache_tokens="cache_tokens", task_id="SLOT->id_task",
              off="i", retry="continue;", ctx="ctx", terminate="slot.release();\nsend_error(slot, err);"),
    "B": dict(layout="B", batch_model="plain", has_embd=False, has_tokens_ptr=False, off="i", retry="continue;"),
    "C": dict(layout="C", has_embd=False, has_tokens_ptr=False),
    "C2": {},
    "D": dict(layout="D", batch_model="view", has_tokens_ptr=False),
}
# B to D hand a parent's prompt to its children in the decode handler (anchors._handover): here,
# a line of SRC's handler stands for that loop's first statement. B's handler restores n_batch
# before that loop: its view's size is the variable the view was cut with.
HANDOVER = dict(handover_at=SRC.index(b"        return true;\n"), handover_indent="        ", handover_slot="slot")
for _k in ("B", "C", "C2", "D"):
    LAYOUTS[_k] = {**LAYOUTS[_k], **HANDOVER}
LAYOUTS["B"]["handover_view"] = "n_tokens"
LAYOUTS["C"]["batched_per_view"] = True   # C's decode() reads batch.slot_batched on every view


TODO = ("// TODO: try to terminate only the largest", "//       need to remove the tokens from the current batch too")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy", ["largest", "smallest", "newest"])
def test_every_layout_and_policy_renders_what_a_maintainer_would_take(layout, policy):
    f = facts(**LAYOUTS[layout])
    out = patch.render(SRC, f, SPEC, stage=1, policy=policy).decode()
    assert patch.state(out, SPEC) == "applied"
    assert out.count(f"{patch.HELPER}(") == 2  # definition + hook
    assert out.count(f"{patch.SURGERY}(") == 2  # definition + call
    assert "patchkit" not in out.lower()  # no tool names in the C++
    assert "MUTANT" not in out and "{{" not in out and "{%" not in out
    assert not any(t in out for t in TODO)  # upstream's TODO is resolved, in its place
    assert f.retry in out
    # its counter goes out with upstream's own in /metrics
    assert "        res->data = res_task->to_metrics();\n        // the KV-full counters after upstream's own\n" \
           "        res->data += ctx_server.kv_full_metrics();\n" in out
    # what it logs, it logs as upstream logs a slot's events: SLT_* with the slot and task prefix
    added = "\n".join(sorted(set(out.splitlines()) - set(SRC.decode().splitlines())))
    calls = re.findall(r"\b([A-Z]+)_(?:WRN|INF|ERR|DBG)\(", added)
    assert calls and set(calls) == {"SLT"}, calls
    # every original line but the TODO is still there, in order
    orig = [l for l in SRC.decode().splitlines() if l.strip() and not l.strip().startswith(TODO)]
    lines = out.splitlines()
    pos = 0
    for l in orig:
        pos = lines.index(l, pos) + 1  # ValueError if a line went missing or moved before another


@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_complete_commit_on_every_layout(layout):
    """Each commit of a series must build and run on its own; the eviction is one change."""
    texts = patch.stage_texts(SRC, facts(**LAYOUTS[layout]), SPEC)
    assert len(texts) == 1 and patch.state(texts[0][1].decode(), SPEC) == "applied"


def test_the_surgery_is_a_server_batch_member_where_there_is_one():
    c2 = patch.render(SRC, facts(), SPEC, stage=1).decode()
    assert f"    void {patch.SURGERY}(int32_t id_slot, int32_t off," in c2
    assert f"batch.{patch.SURGERY}(victim->id, off, indices);" in c2
    a = patch.render(SRC, facts(**LAYOUTS["A"]), SPEC, stage=1).decode()
    assert f"static void {patch.SURGERY}(llama_batch & batch, int32_t id_slot," in a


def test_the_copied_termination_drops_the_always_true_guard():
    guarded = "if (slot.is_processing()) {\n    send_error(slot, err);\n    slot.release();\n}"
    assert anchors.unguard(guarded) == "send_error(slot, err);\nslot.release();"
    assert anchors.unguard("slot.release();\nsend_error(slot, err);") == "slot.release();\nsend_error(slot, err);"
    # a guard with an else, or more after it, is not the always-true wrapper: kept verbatim
    other = "if (slot.is_processing()) {\n    a();\n} else {\n    b();\n}"
    assert anchors.unguard(other) == other


def test_every_familys_log_lines_carry_the_slot_prefix():
    """Issue 36: an operator reads which slot and task an eviction, park or resume was about, as
    upstream's own lines about one slot show it (SLT_*: "slot <fn>: id N | task M | ..."). No
    family's template logs with the server-wide SRV_* or the bare LOG_* macros."""
    templates = sorted((Path(patch.__file__).resolve().parents[1] / "patches").glob("*/*.j2"))
    found: dict[str, list[str]] = {}
    for t in templates:
        found.setdefault(t.parent.name, []).extend(re.findall(r"\b([A-Z]+)_(?:WRN|INF|ERR|DBG)\(", t.read_text()))
    assert {"evict-largest-slot", "park-slot"} <= {k for k, v in found.items() if v}, found
    assert {m for v in found.values() for m in v} == {"SLT"}, found


def test_unknown_policy_and_variant_refused():
    with pytest.raises(UsageError):
        patch.render(SRC, facts(), SPEC, stage=1, policy="oldest")
    with pytest.raises(UsageError):
        patch.render(SRC, facts(), SPEC, stage=1, variant="nope")


def test_templates_are_strict():
    broken = dataclasses.asdict(facts())
    del broken["cache_tokens"]

    class F:  # facts missing a field must not render silently
        def __getattr__(self, k):
            if k not in broken:
                raise AttributeError(k)
            return broken[k]

    with pytest.raises((jinja2.UndefinedError, AttributeError)):
        patch.templates(SPEC).get_template("helper.cpp.j2").render(f=F(), helper="h", surgery="s", policy="largest",
                                                               stage=1, **patch.RIGHT)


def test_state_is_read_from_the_definitions():
    out = patch.render(SRC, facts(), SPEC, stage=1).decode()
    assert patch.state(out, SPEC) == "applied"
    assert patch.state(SRC.decode(), SPEC) == "clean"
    cut = out.replace(f"void {patch.SURGERY}(int32_t id_slot", "void other(int32_t id_slot", 1)
    assert patch.state(cut, SPEC) == "partial"


def test_the_metrics_text_is_found_in_each_shape_upstream_has_used():
    """/metrics' text is final where it is assigned (B to D: after it, an append) or sent (A:
    before it, a write into the stream); a server without either has no place for the counters."""
    c2 = b"    {\n        res->data = res_task->to_metrics();\n        return res;\n"
    at, indent, sink = anchors.metrics_sites(c2)[0]
    assert (c2[:at].endswith(b"to_metrics();\n"), indent, sink) == (True, "        ", "res->data +=")
    a = b"        prometheus << x;\n        res.set_content(prometheus.str(), \"text/plain; version=0.0.4\");\n"
    assert anchors.metrics_sites(a) == ((a.index(b"        res.set_content"), "        ", "prometheus <<"),)
    d = c2 + b"            res->data = tmp.to_metrics();\n"
    assert len(anchors.metrics_sites(d)) == 2   # D: a sleeping server's cached text too
    assert anchors.metrics_sites(b"res->data = other();\n") == ()
    with pytest.raises(Exception, match="no place where /metrics' text is final"):
        patch.render(SRC, facts(metrics_sites=()), SPEC, stage=1)


def test_the_prompt_goes_to_n_cmpl_children_once_its_last_entry_is_decoded():
    """Upstream's decode handler hands a parent's prompt to its children after every view of the
    batch; after a full KV cache the batch is decoded in several views, and a hand-over after the
    first leaves the children without the rest (measured on C2: "Invalid input batch." for every
    slot). The guard skips the loop's slot until its last prompt entry is decoded (B: by the view's own
    size, n_batch being restored there); a layout without the loop in its handler (A) renders nothing;
    handover-early is upstream's order."""
    f = facts(**LAYOUTS["C2"])
    out = patch.render(SRC, f, SPEC, stage=1).decode()
    guard = "        if (slot.i_batch >= off + n_batch) {\n            continue;\n        }\n        return true;"
    assert guard in out and out.index(guard) > out.index("bool decode(")
    assert guard in patch.render(SRC, facts(**LAYOUTS["C"]), SPEC, stage=1).decode()
    # B: n_batch is the full size again there (restored on success): the view ends at i + n_tokens
    b = patch.render(SRC, facts(**LAYOUTS["B"]), SPEC, stage=1).decode()
    assert "        if (slot.i_batch >= i + n_tokens) {\n            continue;\n        }\n" in b
    assert "i_batch >= i + n_batch" not in b
    assert "i_batch >=" not in patch.render(SRC, facts(**LAYOUTS["A"]), SPEC, stage=1).decode()
    early = patch.render(SRC, f, SPEC, stage=1, variant="handover-early").decode()
    assert "i_batch >= off + n_batch" not in early and "a batch that did not fit the KV cache" not in early
    for name in ("park-slot", "recompute-slot", "hybrid-slot", "recompute-prefill-slot"):
        pf = dataclasses.replace(f, enum_at=0, enum_indent="    ", resume_at=0, resume_indent="    ", slot_json_at=0,
                                 slot_json_indent="    ", skip_at=0, skip_indent="    ", admit_at=0, admit_indent="    ")
        assert guard in patch.render(SRC, pf, patch.load_patch(name), stage=1).decode(), name


def test_a_victim_that_led_the_batch_hands_its_role_on_where_every_view_reads_it():
    """C's decode() sets the batch's LoRA adapters and embeddings mode from batch.slot_batched on
    every view of the batch; the victim, released, has no task (measured on a 0.3.32 build: the
    retry after the eviction aborted in GGML_ASSERT(task), 16 of the suite's workloads). Where the
    handler reads it (C) the role goes to a slot with an entry left; C2 and D set it once per batch,
    before the views, and render nothing."""
    hand_on = "        if (batch.slot_batched == victim) {\n            batch.slot_batched = nullptr;\n"
    for layout in LAYOUTS:
        out = patch.render(SRC, facts(**LAYOUTS[layout]), SPEC, stage=1).decode()
        assert (hand_on in out) == (layout == "C"), layout
    out = patch.render(SRC, facts(**LAYOUTS["C"]), SPEC, stage=1).decode()
    # after the surgery: the slots left in the batch are the survivors'
    assert out.index(hand_on) > out.index(f"batch.{patch.SURGERY}(victim->id, off, indices);")
    assert "s != victim && s->id == t.id_slot" in out
