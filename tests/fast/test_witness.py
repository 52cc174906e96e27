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


def _forward(path, tokens: list[int], lora=None, without: tuple[int, ...] = ()):
    """Logits of the last position, and each head's attention weights there. `lora`: an adapter
    file applied at scale 1 (llama.cpp's W x + scale * alpha / rank * B A x), except to the values
    of the positions in `without` (cells computed without it)."""
    import gguf
    r = gguf.GGUFReader(str(path))
    t = {x.name: np.array(x.data, dtype=np.float32) for x in r.tensors}
    if lora is not None:
        t.update({x.name: np.array(x.data, dtype=np.float32) for x in gguf.GGUFReader(str(lora)).tensors})
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
    v = h @ t["blk.0.attn_v.weight"].T
    if lora is not None:     # alpha 1, rank 1: scale 1
        delta = (h @ t["blk.0.attn_v.weight.lora_a"].T) @ t["blk.0.attn_v.weight.lora_b"].T
        delta[list(without)] = 0
        v = v + delta
    v = v.astype(np.float16).astype(np.float32)
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


def test_the_lora_adapter_mirrors_every_value_and_a_cell_computed_without_it_is_seen(witness_file, tmp_path,
                                                                                     monkeypatch):
    """The adapter a `lora` request applies (model.lora): every head reads n_vocab - 1 - t instead of
    t, exactly, so the stream under it is the designed one for the mirrored s; one cell 512 back
    computed without it (a recompute with another task's adapters) changes the next token."""
    monkeypatch.setenv("PATCHKIT_CACHE", str(tmp_path))
    adapter = model.lora(model.ensure(model.WITNESS).path)
    n = witness_file.n_vocab
    rng = np.random.default_rng(3)
    tokens = [int(x) for x in rng.integers(3, n, 1100)]
    table = witness.vote_table(n, model.WITNESS.seed)
    plain, _ = _forward(witness_file.path, tokens)
    mirrored, _ = _forward(witness_file.path, tokens, lora=adapter)
    assert int(mirrored.argmax()) == int(table[sum(n - 1 - tokens[-1 - d] for d in witness.DISTANCES)].argmax())
    assert mirrored.argmax() != plain.argmax()
    stale, _ = _forward(witness_file.path, tokens, lora=adapter, without=(len(tokens) - 1 - 512,))
    assert stale.argmax() != mirrored.argmax()
    # any other model gets seeded noise of its own shapes (what the batch sees: other adapters)
    import gguf
    other = {t.name: [int(x) for x in t.shape] for t in gguf.GGUFReader(str(model.lora(model.ensure(model.TINY).path))).tensors}
    assert other == {"blk.0.attn_v.weight.lora_a": [64, 1], "blk.0.attn_v.weight.lora_b": [1, 64]}, other


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


# ------------------------------------------------------------ the sliding-window witness (gemma2)

def _forward_swa(path, tokens: list[int], window: int = 64):
    """gemma2's graph in float32 numpy, as llama.cpp builds it (src/models/gemma2.cpp): the input
    scaled by sqrt(n_embd), two layers (0: sliding window, 1: global), NEOX RoPE, the query scaled
    by 1/sqrt(16), softcapped scores, an RMSNorm after attention and after the FFN, GELU gating with
    ggml's exact branch for |x| >= 10, a softcapped output tied to the embedding. Returns the last
    position's logits and layer l's attention weights there."""
    import gguf
    r = gguf.GGUFReader(str(path))
    t = {x.name: np.array(x.data, dtype=np.float32) for x in r.tensors}
    hd, half = witness.HEAD_DIM, witness.HEAD_DIM // 2
    n_head = t["blk.0.attn_q.weight"].shape[0] // hd
    e = t["token_embd.weight"].shape[1]

    def norm(x, g):
        return x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + witness.SWA_EPS).astype(np.float32) * g

    def rope(x, pos):            # NEOX: pair i is dimensions (i, i + half) of each head
        x = x.reshape(len(pos), n_head, hd)
        theta = pos[:, None] * witness.ROPE_BASE ** (-2.0 * np.arange(half) / hd)[None, :]
        c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * c - b * s, a * s + b * c], -1).reshape(len(pos), -1).astype(np.float32)

    def gelu(x):                 # ggml: 0 below -10, x above 10, the tanh form between (an f16 table)
        inner = np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3))
        return np.where(x <= -10, 0.0, np.where(x >= 10, x, 0.5 * x * (1 + inner))).astype(np.float32)

    def layer(il: int, x: np.ndarray, queries: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer il on every position's input x, for the last `queries` positions."""
        pos = np.arange(len(x), dtype=np.float64)
        h = norm(x, t[f"blk.{il}.attn_norm.weight"])
        q = rope(h[-queries:] @ t[f"blk.{il}.attn_q.weight"].T, pos[-queries:]) / np.float32(np.sqrt(hd))
        k = rope(h @ t[f"blk.{il}.attn_k.weight"].T, pos).astype(np.float16).astype(np.float32)
        v = (h @ t[f"blk.{il}.attn_v.weight"].T).astype(np.float16).astype(np.float32)
        q, k, v = (a.reshape(len(a), n_head, hd) for a in (q, k, v))
        scores = np.einsum("qhd,nhd->qhn", q, k)
        scores = witness.ATTN_SOFTCAP * np.tanh(scores / witness.ATTN_SOFTCAP)
        ahead = pos[None, :] > pos[-queries:, None]                       # causal
        if il == 0:
            ahead |= pos[-queries:, None] - pos[None, :] >= window        # the sliding window
        scores[np.broadcast_to(ahead[:, None, :], scores.shape)] = -np.inf
        w = np.exp(scores - scores.max(-1, keepdims=True))
        w = (w / w.sum(-1, keepdims=True)).astype(np.float32)
        o = np.einsum("qhn,nhd->qhd", w, v).reshape(queries, -1) @ t[f"blk.{il}.attn_output.weight"].T
        x = x[-queries:] + norm(o, t[f"blk.{il}.post_attention_norm.weight"])
        h2 = norm(x, t[f"blk.{il}.ffn_norm.weight"])
        f = (gelu(h2 @ t[f"blk.{il}.ffn_gate.weight"].T) * (h2 @ t[f"blk.{il}.ffn_up.weight"].T)) \
            @ t[f"blk.{il}.ffn_down.weight"].T
        return x + norm(f, t[f"blk.{il}.post_ffw_norm.weight"]), w[-1]

    x = t["token_embd.weight"][tokens] * np.float32(np.sqrt(e))
    x, w0 = layer(0, x, len(tokens))       # layer 1 reads every position's layer-0 output
    x, w1 = layer(1, x, 1)
    logits = (norm(x, t["output_norm.weight"]) @ t["token_embd.weight"].T)[0]
    return witness.FINAL_SOFTCAP * np.tanh(logits / witness.FINAL_SOFTCAP), (w0, w1)


@pytest.fixture(scope="module")
def swa_file(tmp_path_factory):
    return model.ensure(model.WITNESS_SWA, tmp_path_factory.mktemp("w") / "witness-swa.gguf")


@pytest.mark.parametrize("seed", [0, 1])
def test_the_sliding_window_witness_computes_the_designed_next_token(swa_file, seed):
    rng = np.random.default_rng(seed)
    tokens = [int(x) for x in rng.integers(3, swa_file.n_vocab, 1100)]
    logits, (w0, w1) = _forward_swa(swa_file.path, tokens)
    short = witness.SWA_SHORT
    for h, dist in enumerate(witness.DISTANCES):      # each head on its one cell, in its own layer
        w = w0[h] if h < short else w1[h]
        assert w.max() == 1.0 and np.count_nonzero(w) == 1 and int(w.argmax()) == len(tokens) - 1 - dist, dist
    s = sum(tokens[-1 - d] for d in witness.DISTANCES)
    votes = witness.vote_table(swa_file.n_vocab, model.WITNESS_SWA.seed)[s]
    order = np.argsort(logits)[::-1]
    assert order[0] == votes.argmax() and set(order[1:4]) == set(np.flatnonzero(votes == witness.RUNNER))
    assert logits[order[0]] - logits[order[1]] > 0.35 and logits[order[0]] - logits[order[4]] > 8


def test_the_sliding_window_witness_sees_a_cell_in_each_cache(swa_file):
    """A cell 2 back (read by the sliding-window layer) and one 512 back (the global layer)."""
    rng = np.random.default_rng(7)
    tokens = [int(x) for x in rng.integers(3, swa_file.n_vocab, 1100)]
    a, _ = _forward_swa(swa_file.path, tokens)
    for back in (2, 512):
        edited = list(tokens)
        edited[-1 - back] = 3 + (edited[-1 - back] - 3 + 1) % (swa_file.n_vocab - 3)
        b, _ = _forward_swa(swa_file.path, edited)
        assert a.argmax() != b.argmax(), back


def test_without_its_anchor_the_post_norm_erases_s(tmp_path, monkeypatch):
    """The broken variant: no constant beside a layer's head sum, so gemma2's RMSNorm after the
    attention turns s/64 into +-1 whatever s is, and the lookup reads the wrong entry."""
    monkeypatch.setattr(witness, "M_OUT", 0.0)
    broken = model.ensure(replace(model.WITNESS_SWA, name="witness-swa-unanchored"), tmp_path / "broken.gguf")
    table = witness.vote_table(broken.n_vocab, model.WITNESS_SWA.seed)
    wrong = 0
    for seed in range(3):
        tokens = [int(x) for x in np.random.default_rng(seed).integers(3, broken.n_vocab, 1100)]
        logits, _ = _forward_swa(broken.path, tokens)
        wrong += int(logits.argmax() != table[sum(tokens[-1 - d] for d in witness.DISTANCES)].argmax())
    assert wrong == 3


# ------------------------------------------------------------------ the hybrid witness (lfm2)

def _forward_hybrid(path, tokens: list[int]):
    """lfm2's graph in float32 numpy (src/models/lfm2.cpp): layer 0 attention with RMS norms on each
    head's q and k and NEOX RoPE, layer 1 a short conv (in_proj to b, c, x; b*x convolved over
    (t-2, t-1, t); times c; out_proj), a SwiGLU FFN after each. Returns the last position's logits."""
    import gguf
    r = gguf.GGUFReader(str(path))
    t = {x.name: np.array(x.data, dtype=np.float32) for x in r.tensors}
    hd, half = witness.HEAD_DIM, witness.HEAD_DIM // 2
    e = t["token_embd.weight"].shape[1]
    n_head = e // hd

    def norm(x, g):
        return x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + witness.HY_EPS).astype(np.float32) * g

    def rope(x, pos):
        theta = pos[:, None, None] * witness.ROPE_BASE ** (-2.0 * np.arange(half) / hd)[None, None, :]
        a, b = x[..., :half], x[..., half:]
        return np.concatenate([a * np.cos(theta) - b * np.sin(theta), a * np.sin(theta) + b * np.cos(theta)], -1)

    def ffn(x, il):
        h = norm(x, t[f"blk.{il}.ffn_norm.weight"])
        g = h @ t[f"blk.{il}.ffn_gate.weight"].T
        with np.errstate(over="ignore"):
            silu = g / (1 + np.exp(-g))
        return x + (silu * (h @ t[f"blk.{il}.ffn_up.weight"].T)) @ t[f"blk.{il}.ffn_down.weight"].T

    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    x = t["token_embd.weight"][tokens]
    h = norm(x, t["blk.0.attn_norm.weight"])
    q, k, v = ((h @ t[f"blk.0.attn_{w}.weight"].T).reshape(n, n_head, hd) for w in "qkv")
    q = rope(norm(q[-3:], t["blk.0.attn_q_norm.weight"]), pos[-3:])
    k = rope(norm(k, t["blk.0.attn_k_norm.weight"]), pos).astype(np.float16).astype(np.float32)
    scores = np.einsum("qhd,nhd->qhn", q, k) / np.float32(np.sqrt(hd))
    scores[np.broadcast_to((pos[None, :] > pos[-3:, None])[:, None, :], scores.shape)] = -np.inf
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    o = np.einsum("qhn,nhd->qhd", w, v.astype(np.float16).astype(np.float32)).reshape(3, e)
    x = ffn(x[-3:] + o @ t["blk.0.attn_output.weight"].T, 0)           # the last three positions
    h = norm(x, t["blk.1.attn_norm.weight"]) @ t["blk.1.shortconv.in_proj.weight"].T
    b, c, xx = h[:, :e], h[:, e:2 * e], h[:, 2 * e:]
    conv = ((b * xx) * t["blk.1.shortconv.conv.weight"].T).sum(0)       # kernel column j on t - 2 + j
    x = ffn(x[-1] + (c[-1] * conv) @ t["blk.1.shortconv.out_proj.weight"].T, 1)
    return norm(x, t["token_embd_norm.weight"]) @ t["output.weight"].T


@pytest.fixture(scope="module")
def hybrid_file(tmp_path_factory):
    return model.ensure(model.WITNESS_HYBRID, tmp_path_factory.mktemp("w") / "witness-hybrid.gguf")


def _designed(tokens: list[int], n_vocab: int) -> int:
    return int(witness.vote_table(n_vocab, model.WITNESS.seed)[sum(tokens[-1 - d] for d in witness.DISTANCES)].argmax())


@pytest.mark.parametrize("seed", [0, 1])
def test_the_hybrid_witness_computes_the_designed_next_token(hybrid_file, seed):
    tokens = [int(x) for x in np.random.default_rng(seed).integers(3, hybrid_file.n_vocab, 1100)]
    logits = _forward_hybrid(hybrid_file.path, tokens)
    order = np.argsort(logits)[::-1]
    assert order[0] == _designed(tokens, hybrid_file.n_vocab)
    assert logits[order[0]] - logits[order[1]] > 0.35 and logits[order[0]] - logits[order[4]] > 8


def test_the_hybrid_witness_reads_the_previous_token_from_its_conv_not_a_head(hybrid_file):
    """Distance 1 has no head: the conv's state carries it (so a lost recurrent state is seen)."""
    assert 1 not in witness.hybrid_heads() and set(witness.hybrid_heads()) | {1} == set(witness.DISTANCES)
    tokens = [int(x) for x in np.random.default_rng(7).integers(3, hybrid_file.n_vocab, 1100)]
    a = _forward_hybrid(hybrid_file.path, tokens)
    tokens[-2] = 3 + (tokens[-2] - 3 + 1) % (hybrid_file.n_vocab - 3)
    assert _forward_hybrid(hybrid_file.path, tokens).argmax() != a.argmax()


def test_a_conv_on_the_current_token_breaks_the_hybrid_witness(tmp_path, monkeypatch):
    """The broken variant: the kernel on t instead of t - 1 adds the current token twice and the
    previous one never, so the lookup reads another s (unless the two tokens are equal)."""
    monkeypatch.setattr(witness, "HY_KERNEL", (0.0, 0.0, 1.0))
    broken = model.ensure(replace(model.WITNESS_HYBRID, name="witness-hybrid-current"), tmp_path / "broken.gguf")
    for seed in range(3):
        tokens = [int(x) for x in np.random.default_rng(seed).integers(3, broken.n_vocab, 1100)]
        assert tokens[-1] != tokens[-2]
        assert _forward_hybrid(broken.path, tokens).argmax() != _designed(tokens, broken.n_vocab), seed
