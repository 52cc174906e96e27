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


def n_embd(n_vocab: int) -> int:
    return -(-(D_VOTE + n_vocab) // 16) * 16


def s_max(n_vocab: int, reach: int = 1024) -> int:
    return len(distances(reach)) * (n_vocab - 1)


def n_ff(n_vocab: int, reach: int = 1024) -> int:
    return s_max(n_vocab, reach) + 3      # ramps at c = -1 .. s_max + 1


def keys(writer, spec) -> None:
    n_head = len(distances(spec.witness_reach))
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_freq_base(ROPE_BASE)


def tensors(writer, spec, n_vocab: int, seed: int) -> None:
    """Every weight, by construction; the only randomness is the vote table (seeded)."""
    dists = distances(spec.witness_reach)
    e, n_head, hd = n_embd(n_vocab), len(dists), HEAD_DIM
    f32 = np.float32
    # embeddings: constant sum of squares C, so every token's RMS is r0
    C = K_CONST ** 2 + ((n_vocab - 1) * CODE_ALPHA) ** 2
    r0 = float(np.sqrt(C / e + 1e-5))
    emb = np.zeros((n_vocab, e), f32)
    ids = np.arange(n_vocab)
    emb[:, D_CONST] = K_CONST
    emb[:, D_CODE] = ids * CODE_ALPHA
    emb[:, D_COMP] = np.sqrt(C - K_CONST ** 2 - (ids * CODE_ALPHA) ** 2)
    writer.add_tensor("token_embd.weight", emb)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(e, f32))
    # attention: rows are output features (numpy (out, in); GGUF stores it reversed)
    theta = ROPE_BASE ** (-2.0 * np.arange(hd // 2) / hd)
    wq = np.zeros((n_head * hd, e), f32)
    wk = np.zeros((n_head * hd, e), f32)
    wv = np.zeros((n_head * hd, e), f32)
    wo = np.zeros((e, n_head * hd), f32)
    unit = r0 / K_CONST                      # normalised constant dimension -> 1
    for h, dist in enumerate(dists):
        for i, th in enumerate(theta):
            wq[h * hd + 2 * i, D_CONST] = KAPPA * np.cos(th * dist) * unit
            wq[h * hd + 2 * i + 1, D_CONST] = -KAPPA * np.sin(th * dist) * unit
            wk[h * hd + 2 * i, D_CONST] = KAPPA * unit
        wv[h * hd, D_CODE] = r0 / CODE_ALPHA  # the token id, exactly, once rounded to f16
        wo[D_S, h * hd] = 1.0 / S_SCALE
    for name, t in (("attn_q", wq), ("attn_k", wk), ("attn_v", wv), ("attn_output", wo)):
        writer.add_tensor(f"blk.0.{name}.weight", t)
    # FFN: ramp_c = SiLU(GATE * (s - c)) for c = -1 .. s_max + 1; bump_c = ramp_{c-1} - 2 ramp_c + ramp_{c+1}
    smax = s_max(n_vocab, spec.witness_reach)
    cs = np.arange(-1, smax + 2)
    r1 = float(np.sqrt((C + (smax / S_SCALE / 2) ** 2) / e))   # typical RMS after attention
    gate = np.zeros((len(cs), e), f32)
    gate[:, D_S] = GATE * S_SCALE * r1
    gate[:, D_CONST] = -GATE * cs * r1 / K_CONST
    up = np.zeros((len(cs), e), f32)
    up[:, D_CONST] = r1 / K_CONST
    votes = vote_table(n_vocab, seed, spec.witness_reach)                           # (smax + 1, n_vocab)
    padded = np.zeros((smax + 3 + 2, n_vocab), f32)             # vote_c for c = -2 .. smax + 2
    padded[2:smax + 3] = votes
    down = np.zeros((e, len(cs)), f32)
    for j, c in enumerate(cs):
        v = padded[c + 1 + 2] - 2 * padded[c + 2] + padded[c - 1 + 2]
        down[D_VOTE:D_VOTE + n_vocab, j] = v / GATE
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(e, f32))
    writer.add_tensor("blk.0.ffn_gate.weight", gate)
    writer.add_tensor("blk.0.ffn_up.weight", up)
    writer.add_tensor("blk.0.ffn_down.weight", down)
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
