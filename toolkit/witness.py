"""The witness model: a llama-architecture GGUF whose weights are set by construction, so that its
stream sees every KV cell of its history, the cells' positions, and its sampler's state, while a
sequence's stream stays the same whatever else shares the batch or the pool.

The argument is in docs/DESIGN.md ("The witness model"); in short, one layer:

- Token t's embedding has constant RMS (a constant dimension, a code dimension holding t, and a
  compensating dimension), so RMSNorm scales every token alike.
- Attention: one head per distance D in DISTANCES. Its query and key come from the constant
  dimension only, RoPE-rotated (base ROPE_BASE, 8 pairs), so the score of a cell at distance d is
  KAPPA^2 * sum_i cos(theta_i * (D - d)) / 4: the cell exactly D back wins by at least 4390
  logits (min over 0 < |D - d| < 4200: score_gap()), so exp() gives it weight 1.0 and every
  other cell 0.0, bit for bit, wherever the cells sit in the pool. Its value is the cell's token id,
  which f16 holds exactly. The heads' outputs sum (exactly, integers / 64) into one dimension:
  s = sum over D of the token D cells back.
- The FFN is a lookup table on that integer s: one SiLU ramp per integer, combined by second
  differences into a bump at s, which writes s's vote: a winner, three runners-up 0.5 logit
  behind, every other token ~12 logits behind. Greedy picks the winner with a margin of 0.5 (float
  noise is ~1e-5); a seeded temperature picks among four, so the RNG and the penalties matter.
- With heads 64 apart back to 1024, each of the last 1024 cells is read by some head within 64
  generated tokens; a cell changed, dropped, duplicated, shifted or borrowed from another sequence
  changes s at that step, and another winner wins: the winner is linear in s modulo the 110
  candidates, so no change of one token maps s to the same winner (vote_table()).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

HEAD_DIM = 16                   # 8 RoPE pairs per head (4 pairs measured 2x slower prompts: ggml's
#                                 KQ product over 8 elements; and their least deficit is 7x smaller)
ROPE_BASE = 10.0                # theta_i = 10^(-i/8): 1 .. 0.0056 rad/position
KAPPA = 128.0                   # |q| = |k| per pair: the matching cell's score 128^2 * 8 / 4 = 32768,
#                                 every other cell's at least 128^2 * 1.0718 / 4 = 4390 below
#                                 (1.0718: the least deficit of sum_i cos(theta_i m) over 0 < |m| < 4200, at m = 1).
# Why so large: a head whose distance is longer than the history has no matching cell and takes the
# best one there is; two near-tied candidates share its weight, and their shares round differently
# with where the cells sit in the pool. Scores 16x wider make such near-ties 16x rarer: measured
# 13 of 1000 batch compositions diverged with KAPPA 32, 0 of 1000 with 128 (docs/measured.md).
MAX_DISTANCE = 4200                 # the farthest two cells of one sequence the margin is argued for


def distances(reach: int = 1024) -> tuple[int, ...]:
    """The distances the heads read: the cell itself, the three before, then every 64th back to
    `reach`. With 64 generated tokens each head sweeps 64 cells, so every one of the last
    reach + 63 cells is read by some head at some step."""
    return (0, 1, 2, 3) + tuple(64 * k for k in range(1, reach // 64 + 1))


DISTANCES = distances()
S_SCALE = 64.0                  # s enters the residual as s / 64 (a power of two: exact)
GATE = 12.0                     # SiLU(-12) = -7e-5: a ramp below its integer is off
WINNER, RUNNER = 16.0, 15.36    # residual vote; the output scales them to ~12.5 and ~12.0 logits
LOGIT_SCALE = 0.78

# residual dimensions
D_CONST, D_CODE, D_COMP, D_S = 0, 1, 2, 3
D_VOTE = 4                       # D_VOTE + token id: the vote for that token
K_CONST, CODE_ALPHA = 64.0, 0.25


def score_gap(hd: int = HEAD_DIM, base: float = ROPE_BASE, kappa: float = KAPPA, span: int = MAX_DISTANCE) -> float:
    """The least margin (in softmax logits) by which the cell at the head's distance beats any other
    cell within `span`: above ~104, exp() of every other cell is exactly 0.0f."""
    theta = base ** (-2.0 * np.arange(hd // 2) / hd)
    m = np.arange(1, span)
    deficit = hd // 2 - np.cos(np.outer(m, theta)).sum(1).max()
    return kappa ** 2 * deficit / np.sqrt(hd)


def n_embd(n_vocab: int, reach: int = 1024) -> int:
    return -(-(D_VOTE + n_vocab) // 16) * 16


def s_max(n_vocab: int, reach: int = 1024) -> int:
    return len(distances(reach)) * (n_vocab - 1)


def n_ff(n_vocab: int, reach: int = 1024) -> int:
    return s_max(n_vocab, reach) + 3      # ramps at c = -1 .. s_max + 1


def embeddings(n_vocab: int, e: int) -> np.ndarray:
    """Part 1: token t is (64, t/4, c_t, 0, ...), every row with the same sum of squares; a
    construction adds its own constant dimensions on top (their squares are the same for every t)."""
    ids = np.arange(n_vocab)
    emb = np.zeros((n_vocab, e), np.float32)
    emb[:, D_CONST] = K_CONST
    emb[:, D_CODE] = ids * CODE_ALPHA
    emb[:, D_COMP] = np.sqrt(K_CONST ** 2 + ((n_vocab - 1) * CODE_ALPHA) ** 2 - K_CONST ** 2 - (ids * CODE_ALPHA) ** 2)
    return emb


def pointer(wq: np.ndarray, wk: np.ndarray, h: int, dist: int, unit: float, neox: bool) -> None:
    """Part 2: head h's query and key from the constant dimension only (`unit` turns its normalised
    value into 1), so that the cell `dist` back wins the head's softmax outright. RoPE pairs are
    (2i, 2i + 1) in ggml's NORM layout (llama) and (i, i + 8) in NEOX (gemma2, lfm2)."""
    hd = HEAD_DIM
    theta = ROPE_BASE ** (-2.0 * np.arange(hd // 2) / hd)
    for i, th in enumerate(theta):
        a, b = (i, i + hd // 2) if neox else (2 * i, 2 * i + 1)
        wq[h * hd + a, D_CONST] = KAPPA * np.cos(th * dist) * unit
        wq[h * hd + b, D_CONST] = -KAPPA * np.sin(th * dist) * unit
        wk[h * hd + a, D_CONST] = KAPPA * unit


def ramps(n_vocab: int, seed: int, reach: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """Part 4, the lookup table on s: the ramps' integers c = -1 .. s_max + 1, and per c the vote
    its ramp adds (the second difference of the votes around c, / GATE), shape (len(c), n_vocab).
    For an integer s exactly one bump, the one at s, is on, and it writes s's vote."""
    smax = s_max(n_vocab, reach)
    cs = np.arange(-1, smax + 2)
    padded = np.zeros((smax + 5, n_vocab), np.float32)             # vote_c for c = -2 .. smax + 2
    padded[2:smax + 3] = vote_table(n_vocab, seed, reach)
    return cs, (padded[cs + 3] - 2 * padded[cs + 2] + padded[cs + 1]) / GATE


def lookup(writer, layer: int, e: int, cs: np.ndarray, bumps: np.ndarray, s_dims: tuple[int, ...],
           s_unit: float, const_dim: int, const_unit: float, vote: int) -> None:
    """Part 4's FFN at `layer`: ramp c's gate is GATE * (s - c), read from the dimensions that hold s
    (s = their sum over s_unit, the value one unit of s has there once normalised) and the constant
    (const_unit: its normalised value); the up projection is that constant, 1; the down projection
    writes each bump's vote into the vote dimensions from `vote` on."""
    f32 = np.float32
    gate = np.zeros((len(cs), e), f32)
    gate[:, list(s_dims)] = GATE / s_unit
    gate[:, const_dim] = -GATE * cs / const_unit
    up = np.zeros((len(cs), e), f32)
    up[:, const_dim] = 1.0 / const_unit
    down = np.zeros((e, len(cs)), f32)
    down[vote:vote + bumps.shape[1]] = bumps.T
    writer.add_tensor(f"blk.{layer}.ffn_gate.weight", gate)
    writer.add_tensor(f"blk.{layer}.ffn_up.weight", up)
    writer.add_tensor(f"blk.{layer}.ffn_down.weight", down)


def attention_keys(writer, n_head: int, n_head_kv, eps: float) -> None:
    """Every witness's heads: 16 dimensions, all of them RoPE-rotated at base 10."""
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(eps)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(ROPE_BASE)


def keys(writer, spec, n_vocab: int) -> None:
    n_head = len(distances(spec.witness_reach))
    attention_keys(writer, n_head, n_head, 1e-5)


def tensors(writer, spec, n_vocab: int, seed: int) -> None:
    """Every weight, by construction; the only randomness is the vote table (seeded)."""
    dists = distances(spec.witness_reach)
    e, n_head, hd = n_embd(n_vocab), len(dists), HEAD_DIM
    f32 = np.float32
    # embeddings: constant sum of squares C, so every token's RMS is r0
    C = K_CONST ** 2 + ((n_vocab - 1) * CODE_ALPHA) ** 2
    r0 = float(np.sqrt(C / e + 1e-5))
    emb = embeddings(n_vocab, e)
    ids = np.arange(n_vocab)
    writer.add_tensor("token_embd.weight", emb)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(e, f32))
    # attention: rows are output features (numpy (out, in); GGUF stores it reversed)
    wq = np.zeros((n_head * hd, e), f32)
    wk = np.zeros((n_head * hd, e), f32)
    wv = np.zeros((n_head * hd, e), f32)
    wo = np.zeros((e, n_head * hd), f32)
    unit = r0 / K_CONST                      # normalised constant dimension -> 1
    for h, dist in enumerate(dists):
        pointer(wq, wk, h, dist, unit, neox=False)
        wv[h * hd, D_CODE] = r0 / CODE_ALPHA  # the token id, exactly, once rounded to f16
        wo[D_S, h * hd] = 1.0 / S_SCALE
    for name, t in (("attn_q", wq), ("attn_k", wk), ("attn_v", wv), ("attn_output", wo)):
        writer.add_tensor(f"blk.0.{name}.weight", t)
    # FFN: ramp_c = SiLU(GATE * (s - c)) for c = -1 .. s_max + 1; bump_c = ramp_{c-1} - 2 ramp_c + ramp_{c+1}
    smax = s_max(n_vocab, spec.witness_reach)
    cs, bumps = ramps(n_vocab, seed, spec.witness_reach)
    r1 = float(np.sqrt((C + (smax / S_SCALE / 2) ** 2) / e))   # typical RMS after attention
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(e, f32))
    lookup(writer, 0, e, cs, bumps, (D_S,), 1 / (S_SCALE * r1), D_CONST, K_CONST / r1, D_VOTE)
    writer.add_tensor("output_norm.weight", np.ones(e, f32))
    out = np.zeros((n_vocab, e), f32)
    rf = float(np.sqrt((C + (smax / S_SCALE / 2) ** 2 + WINNER ** 2 + 3 * RUNNER ** 2) / e))
    out[ids, D_VOTE + ids] = LOGIT_SCALE * rf
    writer.add_tensor("output.weight", out)


STRIDE, OFFSET = 37, 11         # the winner of s: candidate (37 s + 11) mod 110 (37 is coprime to 110)


def vote_table(n_vocab: int, seed: int, reach: int = 1024) -> np.ndarray:
    """Per value of s: a winner and three runners-up, among the ordinary tokens (never a special:
    the stream never ends by itself and never emits <unk>).

    - The winner is LINEAR in s modulo the 110 candidates: s and s + d (0 < |d| < 110) never share
      a winner. One cell holding another token moves s by less than 110, so whenever a head reads
      it, greedy's next token changes: no 1-in-110 coincidence of a random table.
    - Two of the three runners-up are SHARED with the neighbours: one with s - 1, one with s + 1.
      A fractional s (a head reading two cells at once: another sequence's cell at the same
      position, a hole between two cells) mixes the votes of its two integers, and their shared
      runner-up (15.36 from both halves, against <= 8 for either winner) wins: a token neither
      integer's winner is. The third runner-up is drawn at random (seeded)."""
    rng = np.random.default_rng(seed)
    smax = s_max(n_vocab, reach)
    cand = np.arange(3, n_vocab)
    n = len(cand)
    win = [int(cand[(STRIDE * k + OFFSET) % n]) for k in range(smax + 1)]

    def draw(avoid: set[int]) -> int:
        while True:
            t = int(rng.choice(cand))
            if t not in avoid:
                return t

    near = lambda k: {win[j] for j in range(k - 1, k + 3) if 0 <= j <= smax}  # noqa: E731
    shared = []                                   # shared[k]: the runner-up of both k and k + 1
    for k in range(smax):
        shared.append(draw(near(k) | set(shared[-2:])))   # k's two shared runners-up differ, and
        #                                                      k + 1 shares only one with k
    table = np.zeros((smax + 1, n_vocab), np.float32)
    third = None
    for k in range(smax + 1):
        runners = {shared[j] for j in (k - 1, k) if 0 <= j < smax}
        # the third: shared with nobody (not a neighbour's runner-up nor winner), so two
        # neighbours have exactly one runner-up in common
        others = {shared[j] for j in (k - 2, k + 1) if 0 <= j < smax} | {third}
        while len(runners) < 3:
            third = draw(runners | others | {win[j] for j in (k - 1, k, k + 1) if 0 <= j <= smax})
            runners.add(third)
        table[k, win[k]] = WINNER
        table[k, sorted(runners)] = RUNNER
    return table


# ------------------------------------------------------------- the sliding-window witness (gemma2)
#
# The same reading of the history, on gemma2's graph and its iSWA cache: layer 0 slides (the
# ModelSpec's window, 64 cells) and holds the heads at distances 0-3; layer 1 is global and holds
# the far heads. So both of the cache's parts are read: a cell wrong in the sliding-window cache
# changes the stream as surely as one in the global cache. gemma2 differs from llama in five
# places, each met exactly:
# - the input embedding is scaled by sqrt(n_embd) and the output is TIED to it: the output norm's
#   gain is 0 on every dimension but the votes, and each token's embedding carries BETA on its own
#   vote dimension (the logit's other factor), small enough that the current token's own bias
#   (~0.004 logit) stays far under the winner's 0.5-logit margin;
# - RMS norms AFTER attention and after the FFN: a head's output s/64 alone would be normalised
#   to +-1, so each layer's first head also writes a constant M_OUT beside it. The normalised
#   s is then s/64/M_OUT times a constant, linear to 1e-7 (s/64 <= 28 against 65536), and each
#   post-norm's output has a constant RMS, so every later norm scales by a constant too;
# - GELU, not SiLU: ggml's GELU is exact for |x| >= 10 (0 or x), and the ramps are read at
#   multiples of GATE = 12 from their integers, so a bump is exactly 12 there;
# - softcaps on the attention scores and the logits: set so wide (1e6, 1e4) that tanh is linear
#   to 4e-4 on scores <= 32768 (the winning cell's margin stays > 4000) and to 2e-7 on logits;
# - NEOX RoPE: a head's pair i is dimensions (i, i + 8), not (2i, 2i + 1).

SWA_SHORT = 4                      # the heads at distances 0-3 slide; the rest are global
D_S0, D_X0, D_S1, D_X1 = 3, 4, 5, 6  # per layer: its heads' sum s_l / 64, and its constant M_OUT
SWA_VOTE = 7
M_OUT = 65536.0
BETA = 1.0 / 256                  # each token's embedding on its own vote dimension (tied output)
POST_GAIN = 1.0                   # the post-norms' gain on the dimensions they write
ATTN_SOFTCAP, FINAL_SOFTCAP = 1e6, 1e4
SWA_EPS = 1e-6


def swa_n_embd(n_vocab: int, reach: int = 1024) -> int:
    return -(-(SWA_VOTE + n_vocab) // 16) * 16


def swa_keys(writer, spec, n_vocab: int) -> None:
    n_head = len(distances(spec.witness_reach))
    attention_keys(writer, n_head, n_head, SWA_EPS)
    writer.add_sliding_window(spec.sliding_window)
    writer.add_attn_logit_softcapping(ATTN_SOFTCAP)
    writer.add_final_logit_softcapping(FINAL_SOFTCAP)


def swa_tensors(writer, spec, n_vocab: int, seed: int) -> None:
    """Two layers of gemma2, every weight by construction (module comment above)."""
    dists = distances(spec.witness_reach)
    e, n_head, hd = swa_n_embd(n_vocab), len(dists), HEAD_DIM
    f32 = np.float32
    C = K_CONST ** 2 + ((n_vocab - 1) * CODE_ALPHA) ** 2 + BETA ** 2   # every embedding's sum of squares
    ids = np.arange(n_vocab)
    emb = embeddings(n_vocab, e)
    emb[ids, SWA_VOTE + ids] = BETA
    writer.add_tensor("token_embd.weight", emb)
    # The residual is sqrt(e) * embedding, plus POST_GAIN * sqrt(e) per post-norm (unit RMS each):
    # each norm's input has a constant mean square, so its output is its input times a constant.
    g2 = POST_GAIN ** 2
    norm_in = [np.sqrt(e / (C + SWA_EPS)), np.sqrt(e / (C + g2 + SWA_EPS))]   # the attn norms' factor per layer
    norm_ffn = np.sqrt(e / (C + 2 * g2 + SWA_EPS)) / np.sqrt(e)                # sa_out -> ffn input, per unit
    for layer in (0, 1):
        wq = np.zeros((n_head * hd, e), f32)
        wk = np.zeros((n_head * hd, e), f32)
        wv = np.zeros((n_head * hd, e), f32)
        wo = np.zeros((e, n_head * hd), f32)
        mine = [h for h in range(n_head) if (h < SWA_SHORT) == (layer == 0)]
        unit = 1.0 / (norm_in[layer] * K_CONST)         # the normalised constant dimension -> 1
        code = 1.0 / (norm_in[layer] * CODE_ALPHA)      # the normalised code dimension -> the token id
        d_s, d_x = (D_S0, D_X0) if layer == 0 else (D_S1, D_X1)
        for h in mine:
            pointer(wq, wk, h, dists[h], unit, neox=True)
            wv[h * hd, D_CODE] = code
            wo[d_s, h * hd] = 1.0 / S_SCALE
        if mine:                                         # every cell's 1: the post-norm's anchor
            wv[mine[0] * hd + 1, D_CONST] = unit
            wo[d_x, mine[0] * hd + 1] = M_OUT
        post = np.zeros(e, f32)
        post[[d_s, d_x]] = POST_GAIN
        writer.add_tensor(f"blk.{layer}.attn_norm.weight", np.ones(e, f32))
        for name, t in (("attn_q", wq), ("attn_k", wk), ("attn_v", wv), ("attn_output", wo)):
            writer.add_tensor(f"blk.{layer}.{name}.weight", t)
        writer.add_tensor(f"blk.{layer}.post_attention_norm.weight", post)
        writer.add_tensor(f"blk.{layer}.ffn_norm.weight", np.ones(e, f32))
    # layer 0's FFN writes nothing (its post-norm of a zero vector is zero)
    cs, bumps = ramps(n_vocab, seed, spec.witness_reach)
    for name, shape in (("ffn_gate", (len(cs), e)), ("ffn_up", (len(cs), e)), ("ffn_down", (e, len(cs)))):
        writer.add_tensor(f"blk.0.{name}.weight", np.zeros(shape, f32))
    writer.add_tensor("blk.0.post_ffw_norm.weight", np.ones(e, f32))
    # layer 1's FFN: the lookup table on s = s0 + s1; a post-norm writes s_l / 64 as
    # POST_GAIN * sqrt(e) * (s_l / 64) / M_OUT (to 1e-7), the FFN norm multiplies by norm_ffn
    per_s = POST_GAIN * np.sqrt(e) / (S_SCALE * np.sqrt(M_OUT ** 2 + e * SWA_EPS)) * norm_ffn
    one = K_CONST * np.sqrt(e) * norm_ffn                # the FFN input's constant dimension
    lookup(writer, 1, e, cs, bumps, (D_S0, D_S1), per_s, D_CONST, one, SWA_VOTE)
    ffn_post = np.zeros(e, f32)
    ffn_post[SWA_VOTE:SWA_VOTE + n_vocab] = POST_GAIN
    writer.add_tensor("blk.1.post_ffw_norm.weight", ffn_post)
    # the output: tied to token_embd, so logit_u = gain * x[vote u] * BETA; the vote after its
    # post-norm is POST_GAIN * sqrt(e) * v / |v| (|v|: a vote row's norm, the same for every s)
    v_norm = float(np.sqrt(WINNER ** 2 + 3 * RUNNER ** 2))
    rms_out = np.sqrt(C + 3 * g2)
    out_norm = np.zeros(e, f32)
    out_norm[SWA_VOTE:SWA_VOTE + n_vocab] = LOGIT_SCALE * v_norm * rms_out / (BETA * POST_GAIN * np.sqrt(e))
    writer.add_tensor("output_norm.weight", out_norm)


# ------------------------------------------------------------------ the hybrid witness (lfm2)
#
# The same next token again, on lfm2's graph and its hybrid memory (a KV cache for the attention
# layer, a recurrent conv state per sequence): layer 0 is attention with the heads at every
# distance but 1; layer 1 is a short convolution whose state holds the previous token, and it adds
# that token to s. So s is the same sum as the witness's, and a sequence's recurrent state that is
# lost, reset or another sequence's changes the stream as surely as a wrong KV cell. lfm2 differs
# from llama in four places:
# - n_embd must equal n_head * head_dim (its attention output is n_embd x n_embd): 19 heads of 16;
# - RMS norms on each head's query and key: every used head's q (and k) has the same norm
#   (KAPPA per RoPE pair), so a gain of exactly that RMS gives it back;
# - the conv layer reads the residual AFTER the attention wrote s_att / 64 into it, so the RMS it
#   normalises by would move with s: every embedding carries an anchor M_OUT (65536) that makes the
#   residual's RMS constant to 1.3e-7 (s_att / 64 <= 34 against 65536), and the anchor is also the
#   constant the conv's gates and the FFN's ramps read;
# - the conv: in_proj makes b = 1, c = 1 and x = the token id on one channel, the kernel (0, 1, 0)
#   over (t-2, t-1, t) picks the previous token from the state, and out_proj adds it / 64 to s.

HY_D_S, HY_D_X, HY_VOTE = 3, 4, 5   # s / 64; the anchor; the votes
HY_EPS = 1e-5
HY_L_CACHE = 3                      # the conv's kernel: two cells of state and the current one
HY_KERNEL = (0.0, 1.0, 0.0)         # over (t - 2, t - 1, t): the previous token, from the state


def hybrid_heads(reach: int = 1024) -> tuple[int, ...]:
    """The attention layer's distances: all but 1, which the conv reads from its state."""
    return tuple(d for d in distances(reach) if d != 1)


def hybrid_n_head(n_vocab: int, reach: int = 1024) -> int:
    return max(len(hybrid_heads(reach)), -(-(HY_VOTE + n_vocab) // HEAD_DIM))


def hybrid_n_embd(n_vocab: int, reach: int = 1024) -> int:
    return hybrid_n_head(n_vocab, reach) * HEAD_DIM


def hybrid_keys(writer, spec, n_vocab: int) -> None:
    n_head = hybrid_n_head(n_vocab, spec.witness_reach)
    attention_keys(writer, n_head, [n_head, 0], HY_EPS)    # layer 1 is recurrent (head_count_kv 0)
    writer.add_shortconv_l_cache(HY_L_CACHE)


def hybrid_tensors(writer, spec, n_vocab: int, seed: int) -> None:
    """Two layers of lfm2 (attention, short conv), every weight by construction (comment above)."""
    heads = hybrid_heads(spec.witness_reach)
    n_head, hd = hybrid_n_head(n_vocab, spec.witness_reach), HEAD_DIM
    e = n_head * hd
    f32 = np.float32
    C = K_CONST ** 2 + ((n_vocab - 1) * CODE_ALPHA) ** 2 + M_OUT ** 2
    ids = np.arange(n_vocab)
    emb = embeddings(n_vocab, e)
    emb[:, HY_D_X] = M_OUT
    writer.add_tensor("token_embd.weight", emb)
    r0 = float(np.sqrt(C / e + HY_EPS))          # every norm's divisor, s's share (<= 2.5e-7) aside
    # layer 0: attention
    wq = np.zeros((e, e), f32)
    wk = np.zeros((e, e), f32)
    wv = np.zeros((e, e), f32)
    wo = np.zeros((e, e), f32)
    for h, dist in enumerate(heads):
        pointer(wq, wk, h, dist, r0 / K_CONST, neox=True)
        wv[h * hd, D_CODE] = r0 / CODE_ALPHA
        wo[HY_D_S, h * hd] = 1.0 / S_SCALE
    qk_gain = np.full(hd, np.sqrt(KAPPA ** 2 / 2 + HY_EPS), f32)    # a head's RMS: KAPPA / sqrt(2)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(e, f32))
    writer.add_tensor("blk.0.attn_q_norm.weight", qk_gain)
    writer.add_tensor("blk.0.attn_k_norm.weight", qk_gain)
    for name, t in (("attn_q", wq), ("attn_k", wk), ("attn_v", wv), ("attn_output", wo)):
        writer.add_tensor(f"blk.0.{name}.weight", t)
    cs, bumps = ramps(n_vocab, seed, spec.witness_reach)
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(e, f32))
    for name, shape in (("ffn_gate", (len(cs), e)), ("ffn_up", (len(cs), e)), ("ffn_down", (e, len(cs)))):
        writer.add_tensor(f"blk.0.{name}.weight", np.zeros(shape, f32))
    # layer 1: the short conv; channel HY_D_S carries the token id, the kernel picks t - 1
    in_proj = np.zeros((3 * e, e), f32)            # rows: b, then c, then x (each e channels)
    in_proj[0 * e + HY_D_S, HY_D_X] = r0 / M_OUT
    in_proj[1 * e + HY_D_S, HY_D_X] = r0 / M_OUT
    in_proj[2 * e + HY_D_S, D_CODE] = r0 / CODE_ALPHA
    conv = np.zeros((e, HY_L_CACHE), f32)
    conv[HY_D_S] = HY_KERNEL
    out_proj = np.zeros((e, e), f32)
    out_proj[HY_D_S, HY_D_S] = 1.0 / S_SCALE
    writer.add_tensor("blk.1.attn_norm.weight", np.ones(e, f32))
    writer.add_tensor("blk.1.shortconv.conv.weight", conv)
    writer.add_tensor("blk.1.shortconv.in_proj.weight", in_proj)
    writer.add_tensor("blk.1.shortconv.out_proj.weight", out_proj)
    # layer 1's FFN: the lookup table on s (the anchor is its constant)
    writer.add_tensor("blk.1.ffn_norm.weight", np.ones(e, f32))
    lookup(writer, 1, e, cs, bumps, (HY_D_S,), 1 / (S_SCALE * r0), HY_D_X, M_OUT / r0, HY_VOTE)
    writer.add_tensor("token_embd_norm.weight", np.ones(e, f32))   # lfm2's name for its output norm
    out = np.zeros((n_vocab, e), f32)
    rf = float(np.sqrt((C + WINNER ** 2 + 3 * RUNNER ** 2) / e))
    out[ids, HY_VOTE + ids] = LOGIT_SCALE * rf
    writer.add_tensor("output.weight", out)


@dataclass(frozen=True)
class Construction:
    """A witness as model.py writes it: the architecture llama.cpp loads, its metadata, its weights,
    and its n_embd."""
    arch: str
    keys: Callable       # (writer, spec, n_vocab)
    tensors: Callable    # (writer, spec, n_vocab, seed)
    n_embd: Callable     # (n_vocab, reach) -> int


CONSTRUCTIONS = {"witness": Construction("llama", keys, tensors, n_embd),
                 "witness-swa": Construction("gemma2", swa_keys, swa_tensors, swa_n_embd),
                 "witness-hybrid": Construction("lfm2", hybrid_keys, hybrid_tensors, hybrid_n_embd)}


# ------------------------------------------------------------- a LoRA adapter for the plain witness
#
# A request that names an adapter is decoded with it, and so must its cells be when a preemption
# recomputes them (the server sets the adapters per batch, from the batch's first slot). The
# adapter MIRRORS every value the witness reads: token t is read as n_vocab - 1 - t. So a cell
# computed without it holds another value, s moves by twice the difference (< 110 for one cell,
# never 0 unless t is the middle token), and the next token read over it changes. Rank 1 (alpha 1:
# scale = the request's scale): delta W_v = B A, A the row that maps the normalised code and constant
# dimensions to (n_vocab - 1) - 2 t, B a 1 in every head's value slot.

def mirror_lora(writer, spec, n_vocab: int) -> None:
    dists = distances(spec.witness_reach)
    e, n_head, hd = n_embd(n_vocab), len(dists), HEAD_DIM
    C = K_CONST ** 2 + ((n_vocab - 1) * CODE_ALPHA) ** 2
    r0 = float(np.sqrt(C / e + 1e-5))
    a = np.zeros((1, e), np.float32)                       # numpy (rank, in): GGUF's ne = (in, rank)
    a[0, D_CODE] = -2 * r0 / CODE_ALPHA                     # -2 t
    a[0, D_CONST] = (n_vocab - 1) * r0 / K_CONST            # + n_vocab - 1
    b = np.zeros((n_head * hd, 1), np.float32)              # numpy (out, rank)
    b[np.arange(n_head) * hd, 0] = 1.0
    writer.add_tensor("blk.0.attn_v.weight.lora_a", a)
    writer.add_tensor("blk.0.attn_v.weight.lora_b", b)
