"""The witness model's construction (toolkit/witness.py), checked without a process: the GGUF it
writes is read back and run by a float32 numpy forward pass of llama's layer (RMSNorm, RoPE in
ggml's NORM layout, K and V rounded to f16 as the KV cache holds them, softmax attention, SwiGLU),
and its next token is compared with the design's: the vote table's winner at s = the sum of the
tokens 0, 1, 2, 3, 64, ..., 1024 cells back. The real tier holds llama-server to the same
prediction and measures the perturbations (tests/real/test_witness.py)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from toolkit import model, witness


def _forward(path, tokens: list[int]):
    """Logits of the last position, and each head's attention weights there."""
    import gguf
    r = gguf.GGUFReader(str(path))
    t = {x.name: np.array(x.data, dtype=np.float32) for x in r.tensors}
    hd = witness.HEAD_DIM
    n_head = t["blk.0.attn_q.weight"].shape[0] // hd

    def norm(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * g

    def rope(x, pos):            # x: (n, n_head * hd); ggml's NORM mode: adjacent pairs
        x = x.reshape(len(pos), n_head, hd // 2, 2)
        theta = pos[:, None] * witness.ROPE_BASE ** (-2.0 * np.arange(hd // 2) / hd)[None, :]
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        out = np.stack([x[..., 0] * c - x[..., 1] * s, x[..., 0] * s + x[..., 1] * c], -1)
        return out.reshape(len(pos), n_head * hd).astype(np.float32)

    pos = np.arange(len(tokens), dtype=np.float64)
    x = t["token_embd.weight"][tokens]
    h = norm(x, t["blk.0.attn_norm.weight"])
    q = rope(h[-1:] @ t["blk.0.attn_q.weight"].T, pos[-1:]).astype(np.float16).astype(np.float32)
    k = rope(h @ t["blk.0.attn_k.weight"].T, pos).astype(np.float16).astype(np.float32)
    v = (h @ t["blk.0.attn_v.weight"].T).astype(np.float16).astype(np.float32)
    q, k, v = (a.reshape(len(a), n_head, hd) for a in (q, k, v))
    scores = np.einsum("hd,nhd->hn", q[0], k) / np.float32(np.sqrt(hd))
    w = np.exp(scores - scores.max(1, keepdims=True))
    w = (w / w.sum(1, keepdims=True)).astype(np.float32)
    o = np.einsum("hn,nhd->hd", w.astype(np.float16).astype(np.float32), v).reshape(1, -1)
    x = x[-1:] + o @ t["blk.0.attn_output.weight"].T
    h2 = norm(x, t["blk.0.ffn_norm.weight"])
    g = h2 @ t["blk.0.ffn_gate.weight"].T
    with np.errstate(over="ignore"):          # SiLU of a ramp far below its integer: exp overflows to inf, g/inf = 0
        silu = g / (1 + np.exp(-g))
    x = x + (silu * (h2 @ t["blk.0.ffn_up.weight"].T)) @ t["blk.0.ffn_down.weight"].T
    logits = (norm(x, t["output_norm.weight"]) @ t["output.weight"].T)[0]
    return logits, w


@pytest.fixture(scope="module")
def witness_file(tmp_path_factory):
    return model.ensure(model.WITNESS, tmp_path_factory.mktemp("w") / "witness.gguf")


def test_the_pointer_heads_margin_zeroes_every_other_cell():
    """The argument's number: the cell at the head's distance beats every other cell within 4200
    positions by more than exp() can tell from zero in float32 (~104)."""
    assert witness.score_gap() > 150
    # and the number can fail: one RoPE pair cannot separate distances (cos repeats)
    assert witness.score_gap(hd=2, base=10.0) < 104


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_written_weights_compute_the_designed_next_token(witness_file, seed):
    rng = np.random.default_rng(seed)
    n_vocab = witness_file.n_vocab
    tokens = [int(x) for x in rng.integers(3, n_vocab, 1100)]
    logits, w = _forward(witness_file.path, tokens)
    # every head puts weight exactly 1.0 on one cell: the one its distance names
    for h, dist in enumerate(witness.DISTANCES):
        assert w[h].max() == 1.0 and np.count_nonzero(w[h]) == 1, f"head {dist}: {np.sort(w[h])[-3:]}"
        assert int(w[h].argmax()) == len(tokens) - 1 - dist
    s = sum(tokens[-1 - d] for d in witness.DISTANCES)
    votes = witness.vote_table(n_vocab, model.WITNESS.seed)[s]
    winner = int(votes.argmax())
    order = np.argsort(logits)[::-1]
    assert order[0] == winner
    runners = set(np.flatnonzero(votes == witness.RUNNER))
    assert set(order[1:4]) == runners
    # margins: greedy's winner by ~0.5 logit, the rest far behind (float noise is ~1e-5)
    assert logits[winner] - logits[order[1]] > 0.35
    assert logits[winner] - logits[order[4]] > 8


def test_one_cell_changed_far_back_changes_the_next_token(witness_file):
    """What the oracle is for, in the construction: the cell 512 back holds another token."""
    rng = np.random.default_rng(7)
    tokens = [int(x) for x in rng.integers(3, witness_file.n_vocab, 1100)]
    a, _ = _forward(witness_file.path, tokens)
    tokens[-1 - 512] = 3 + (tokens[-1 - 512] - 3 + 1) % (witness_file.n_vocab - 3)
    b, _ = _forward(witness_file.path, tokens)
    assert a.argmax() != b.argmax()


def test_the_blind_variant_has_no_far_heads(tmp_path):
    """The broken variant the real tier proves the harness with: heads at 0-3 only."""
    blind = model.ensure(replace(model.WITNESS, name="witness-blind", witness_reach=0), tmp_path / "blind.gguf")
    rng = np.random.default_rng(7)
    tokens = [int(x) for x in rng.integers(3, blind.n_vocab, 1100)]
    a, w = _forward(blind.path, tokens)
    assert len(w) == 4
    tokens[-1 - 512] = 3 + (tokens[-1 - 512] - 3 + 1) % (blind.n_vocab - 3)
    b, _ = _forward(blind.path, tokens)
    assert (a == b).all()


def test_no_change_of_one_token_keeps_the_winner_and_a_mixture_picks_a_third_token():
    """The vote table's two guarantees (witness.vote_table): s and s + d never share a winner for
    0 < |d| < 110 (one token changed moves s by less), and the even mix of two neighbouring
    integers (a head reading two cells) is won by their shared runner-up, neither's winner."""
    n_vocab = len(model.vocabulary())
    t = witness.vote_table(n_vocab, model.WITNESS.seed)
    win = t.argmax(1)
    for d in range(1, n_vocab - 3):
        assert (win[d:] != win[:-d]).all(), d
    assert (win[110:] == win[:-110]).all()    # and the period is exactly the candidates' count
    mix = (t[:-1] + t[1:]) / 2
    third = mix.argmax(1)
    assert (third != win[:-1]).all() and (third != win[1:]).all()
    assert (mix.max(1) - np.sort(mix, 1)[:, -2] > 7).all()
    assert (win >= 3).all() and not t[:, :3].any()   # never a special token
