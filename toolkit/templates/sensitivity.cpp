// patchkit's perturbation harness: how much of a sequence's KV history does a model's stream see?
// Built against the tree's own libllama with the tree's own compile flags (toolkit/sensitivity.py).
//
//   sensitivity MODEL SEED TRIALS N_GEN  ->  one JSON line per trial and kind, then "done"
//
// Per trial: a seeded history of 300-900 token ids is decoded once into sequence 0 and saved
// (llama_state_seq_get_data). Each kind restores that history into a fresh sequence, perturbs it
// with llama.cpp's own memory API (or decodes a history one token apart), continues it N_GEN tokens
// and compares with the unperturbed continuation. "batch" continues the same history beside 1-3
// other sequences (decoded before, between and after it, so its cells sit elsewhere in the pool)
// and counts divergences: the model must be batch-invariant for the comparisons to mean anything.
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

static llama_context * ctx = nullptr;
static const llama_vocab * vocab = nullptr;
static int n_vocab = 0;

static bool decode(const std::vector<llama_token> & toks, llama_pos p0, llama_seq_id seq, bool logits_last) {
    const int n_batch = (int) llama_n_batch(ctx);
    for (size_t i = 0; i < toks.size(); i += n_batch) {
        const int n = (int) std::min(toks.size() - i, (size_t) n_batch);
        llama_batch b = llama_batch_init(n, 0, 1);
        for (int j = 0; j < n; j++) {
            b.token[j] = toks[i + j];
            b.pos[j] = p0 + (llama_pos) (i + j);
            b.n_seq_id[j] = 1;
            b.seq_id[j][0] = seq;
            b.logits[j] = logits_last && i + j + 1 == toks.size();
        }
        b.n_tokens = n;
        const int rc = llama_decode(ctx, b);
        llama_batch_free(b);
        if (rc != 0) return false;
    }
    return true;
}

// the penalties' signature lost its n_vocab argument across trees: take either
static llama_sampler * penalties(llama_sampler * (*f)(int32_t, int32_t, float, float, float)) { return f(n_vocab, 64, 1.1f, 0.0f, 0.5f); }
static llama_sampler * penalties(llama_sampler * (*f)(int32_t, float, float, float)) { return f(64, 1.1f, 0.0f, 0.5f); }

static llama_sampler * make_sampler(bool stateful, uint32_t seed) {
    llama_sampler * s = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (stateful) {
        // stateful-4's settings: penalties over the last 64, top-k 40, temperature 0.8, seeded RNG
        llama_sampler_chain_add(s, penalties(&llama_sampler_init_penalties));
        llama_sampler_chain_add(s, llama_sampler_init_top_k(40));
        llama_sampler_chain_add(s, llama_sampler_init_temp(0.8f));
        llama_sampler_chain_add(s, llama_sampler_init_dist(seed));
    } else {
        llama_sampler_chain_add(s, llama_sampler_init_greedy());
    }
    return s;
}

// continue sequence `seq` (its last token's logits are in batch index `idx`) for n tokens;
// reset_at >= 0: reset chain element `reset_which` before sampling token number reset_at
static std::vector<llama_token> generate(llama_seq_id seq, int n, bool stateful, uint32_t seed,
                                         int reset_at = -1, int reset_which = -1) {
    llama_sampler * s = make_sampler(stateful, seed);
    std::vector<llama_token> out;
    llama_pos pos = llama_memory_seq_pos_max(llama_get_memory(ctx), seq) + 1;
    int idx = -1;
    for (int i = 0; i < n; i++) {
        if (i == reset_at) llama_sampler_reset(llama_sampler_chain_get(s, reset_which));
        const llama_token t = llama_sampler_sample(s, ctx, idx);
        out.push_back(t);
        if (!decode({t}, pos++, seq, true)) { out.push_back(-1); break; }
        idx = -1;
    }
    llama_sampler_free(s);
    return out;
}

// Flash attention off, in either spelling of llama_context_params: `flash_attn_type` (an enum whose
// DISABLED is 0) since late 2025, the bool `flash_attn` before (layout A's trees). The unused
// overload is never instantiated, so each tree compiles the one its header has.
template <typename P> static auto flash_attn_off(P & p, int) -> decltype(p.flash_attn_type, void()) {
    p.flash_attn_type = (decltype(p.flash_attn_type)) 0;
}
template <typename P> static void flash_attn_off(P & p, long) { p.flash_attn = false; }

static int first_diff(const std::vector<llama_token> & a, const std::vector<llama_token> & b) {
    for (size_t i = 0; i < a.size() && i < b.size(); i++) if (a[i] != b[i]) return (int) i;
    return a.size() == b.size() ? -1 : (int) std::min(a.size(), b.size());
}

int main(int argc, char ** argv) {
    if (argc < 5) { fprintf(stderr, "usage: %s MODEL SEED TRIALS N_GEN [KINDS]\n", argv[0]); return 2; }
    const char * model_path = argv[1];
    const uint32_t seed = (uint32_t) atoi(argv[2]);
    const int trials = atoi(argv[3]);
    const int n_gen = atoi(argv[4]);
    const std::string kinds = argc > 5 ? argv[5] : "change,duplicate,drop,shift,overlap,cross,sampler-rng,sampler-penalties,batch";
    auto want = [&](const char * k) { return ("," + kinds + ",").find(std::string(",") + k + ",") != std::string::npos; };

    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", model_path); return 3; }
    vocab = llama_model_get_vocab(model);
    n_vocab = llama_vocab_n_tokens(vocab);

    std::mt19937 rng(seed);
    auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    auto history = [&](int n) { std::vector<llama_token> h(n); for (auto & t : h) t = uni(3, n_vocab - 1); return h; };

    // one context per batch shape; batch invariance draws its shapes at random
    auto make_ctx = [&](int n_batch, int n_ubatch) {
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = 8192; cp.n_batch = n_batch; cp.n_ubatch = n_ubatch; cp.n_seq_max = 8;
        cp.kv_unified = true; flash_attn_off(cp, 0);
        cp.n_threads = cp.n_threads_batch = 1; cp.swa_full = false;   // one thread: no spinning barrier on a busy machine
        return llama_init_from_model(model, cp);
    };
    ctx = make_ctx(512, 512);
    llama_memory_t mem = llama_get_memory(ctx);

    for (int trial = 0; trial < trials; trial++) {
        const int len = uni(300, 900);
        const std::vector<llama_token> hist = history(len);
        const std::vector<llama_token> head(hist.begin(), hist.end() - 1);
        const uint32_t sseed = (uint32_t) uni(1, 1 << 30);
        llama_memory_clear(mem, true);
        // the history but its last token, saved; each run restores it, edits it, then decodes the
        // last token at the next position (whose logits start the continuation)
        if (!decode(head, 0, 0, false)) { printf("{\"trial\":%d,\"error\":\"decode\"}\n", trial); continue; }
        std::vector<uint8_t> saved(llama_state_seq_get_size(ctx, 0));
        llama_state_seq_get_data(ctx, saved.data(), saved.size(), 0);
        llama_memory_seq_rm(mem, 0, -1, -1);
        auto restore = [&](llama_seq_id dst) {
            llama_memory_seq_rm(mem, dst, -1, -1);
            return llama_state_seq_set_data(ctx, saved.data(), saved.size(), dst) > 0;
        };
        auto finish = [&](llama_seq_id s) {
            return decode({hist.back()}, llama_memory_seq_pos_max(mem, s) + 1, s, true);
        };
        restore(1); finish(1);
        const auto ctl = generate(1, n_gen, false, 0);
        restore(1); finish(1);
        const auto ctl_s = generate(1, n_gen, true, sseed);
        llama_memory_seq_rm(mem, 1, -1, -1);

        auto report = [&](const char * kind, int at, const std::vector<llama_token> & out,
                          const std::vector<llama_token> & ref, const char * note) {
            printf("{\"trial\":%d,\"kind\":\"%s\",\"len\":%d,\"at\":%d,\"diverged\":%d%s%s%s}\n", trial, kind, len, at,
                   out.empty() && ref.empty() ? -2 : first_diff(out, ref), note[0] ? ",\"note\":\"" : "", note,
                   note[0] ? "\"" : "");
        };
        const int p = uni(1, len - 2);       // the perturbed cell (never the last: it carries the logits)
        // a history one token apart, decoded whole: what a patch that writes the wrong token leaves
        if (want("change")) {
            auto h = hist; h[p] = (llama_token) (3 + (h[p] - 3 + uni(1, n_vocab - 4)) % (n_vocab - 3));
            llama_memory_seq_rm(mem, 2, -1, -1);
            decode(h, 0, 2, true);
            report("change", p, generate(2, n_gen, false, 0), ctl, "");
            llama_memory_seq_rm(mem, 2, -1, -1);
        }
        if (want("duplicate")) {
            auto h = hist; h.insert(h.begin() + p, h[p]);
            llama_memory_seq_rm(mem, 2, -1, -1);
            decode(h, 0, 2, true);
            report("duplicate", p, generate(2, n_gen, false, 0), ctl, "");
            llama_memory_seq_rm(mem, 2, -1, -1);
        }
        // edits of the cells themselves, with the memory API, on a restored copy
        const char * edits[] = {"drop", "shift", "overlap", "cross"};
        for (const char * kind : edits) {
            if (!want(kind)) continue;
            restore(2);
            bool ok = true;
            const std::string k = kind;
            if (k == "drop") ok = llama_memory_seq_rm(mem, 2, p, p + 1);          // a hole: one cell gone
            if (k == "shift") llama_memory_seq_add(mem, 2, p, -1, +1);            // every cell from p on one later
            if (k == "overlap") llama_memory_seq_add(mem, 2, p, -1, -1);          // two cells at p - 1
            int identical = 0;
            if (k == "cross") {                                                 // another sequence's cell made visible
                llama_memory_seq_rm(mem, 3, -1, -1);
                const auto other = history(len);
                identical = other[p] == hist[p];   // the same token at the same position: a bit-identical cell
                ok = decode(other, 0, 3, false);
                llama_memory_seq_cp(mem, 3, 2, p, p + 1);
                llama_memory_seq_rm(mem, 3, -1, -1);
            }
            if (!ok || !finish(2)) {
                report(kind, p, {}, {}, "the memory refused the edit");
            } else {
                report(kind, p, generate(2, n_gen, false, 0), ctl, identical ? "identical" : "");
            }
            llama_memory_seq_rm(mem, 2, -1, -1);
        }
        // the sampler's state: reset its RNG, or its penalties, part-way through
        const int r_at = uni(1, n_gen / 2);
        if (want("sampler-rng")) {
            restore(2); finish(2);
            report("sampler-rng", r_at, generate(2, n_gen, true, sseed, r_at, 3), ctl_s, "");
            llama_memory_seq_rm(mem, 2, -1, -1);
        }
        if (want("sampler-penalties")) {
            restore(2); finish(2);
            report("sampler-penalties", r_at, generate(2, n_gen, true, sseed, r_at, 0), ctl_s, "");
            llama_memory_seq_rm(mem, 2, -1, -1);
        }
        // batch invariance: the same history decoded beside others, in another batch shape
        if (want("batch")) {
            const int shapes[][2] = {{512, 512}, {256, 64}, {64, 32}, {1024, 256}, {37, 37}};
            const auto & sh = shapes[uni(0, 4)];
            llama_context * other = make_ctx(sh[0], sh[1]);
            llama_context * keep = ctx;
            ctx = other;
            llama_memory_t m2 = llama_get_memory(ctx);
            const int n_others = uni(1, 3);
            std::vector<std::vector<llama_token>> others;
            for (int k = 0; k < n_others; k++) others.push_back(history(uni(20, 600)));
            // others before (their cells take the pool's first slots), then ours mixed into batches
            // with the others' remaining tokens; one other removed first, leaving a hole
            std::vector<size_t> done(n_others);
            std::vector<bool> live(n_others, true);
            for (int k = 0; k < n_others; k++) {
                done[k] = others[k].size() / 2;
                decode(std::vector<llama_token>(others[k].begin(), others[k].begin() + done[k]), 0, 1 + k, false);
            }
            if (uni(0, 1)) { llama_memory_seq_rm(m2, 1, -1, -1); live[0] = false; }
            const int n_batch = (int) llama_n_batch(ctx);
            size_t i = 0;
            bool ok = true;
            while (i < hist.size() && ok) {
                llama_batch b = llama_batch_init(n_batch, 0, 1);
                int n = 0;
                const int ours = std::min((int) (hist.size() - i), uni(1, n_batch));
                for (int j = 0; j < ours; j++, n++) {
                    b.token[n] = hist[i + j]; b.pos[n] = (llama_pos) (i + j); b.n_seq_id[n] = 1; b.seq_id[n][0] = 0;
                    b.logits[n] = i + j + 1 == hist.size();
                }
                for (int k = 0; k < n_others; k++) {
                    const int take = live[k] ? uni(0, n_batch - n) : 0;
                    for (int j = 0; j < take && done[k] < others[k].size(); j++, done[k]++, n++) {
                        b.token[n] = others[k][done[k]]; b.pos[n] = (llama_pos) done[k]; b.n_seq_id[n] = 1;
                        b.seq_id[n][0] = 1 + k; b.logits[n] = false;
                    }
                }
                b.n_tokens = n;
                ok = llama_decode(ctx, b) == 0;
                llama_batch_free(b);
                i += ours;
            }
            // the continuation, each step batched with one token of every other sequence
            std::vector<llama_token> out;
            llama_sampler * s = make_sampler(false, 0);
            llama_pos pos = (llama_pos) hist.size();
            int idx = -1;
            for (int g = 0; g < n_gen && ok; g++) {
                const llama_token t = llama_sampler_sample(s, ctx, idx);
                out.push_back(t);
                llama_batch b = llama_batch_init(1 + n_others, 0, 1);
                int n = 0;
                b.token[n] = t; b.pos[n] = pos++; b.n_seq_id[n] = 1; b.seq_id[n][0] = 0; b.logits[n] = true; n++;
                for (int k = 0; k < n_others; k++) {
                    const llama_pos pk = llama_memory_seq_pos_max(m2, 1 + k);
                    if (!live[k]) continue;
                    b.token[n] = (llama_token) uni(3, n_vocab - 1); b.pos[n] = pk + 1; b.n_seq_id[n] = 1;
                    b.seq_id[n][0] = 1 + k; b.logits[n] = false; n++;
                }
                b.n_tokens = n;
                ok = llama_decode(ctx, b) == 0;
                llama_batch_free(b);
                idx = 0;
            }
            llama_sampler_free(s);
            char note[64];
            snprintf(note, sizeof note, "n_batch %d n_ubatch %d others %d", sh[0], sh[1], n_others);
            if (ok) report("batch", 0, out, ctl, ""); else report("batch", 0, {}, {}, "decode failed");
            printf("{\"trial\":%d,\"kind\":\"batch-shape\",\"shape\":\"%s\"}\n", trial, note);
            llama_free(other);
            ctx = keep;
        }
        fflush(stdout);
    }
    printf("done\n");
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
