// divergence: does a (k+1)-row verification batch give the same logits, bit for bit, as k+1
// single-token decodes at the same positions? And if not, which graph op differs first?
//
// For each thread count T and batch width n = k+1:
//   prefill P prompt tokens in one batch (1 thread), save sequence 0's state S;
//   (b) restore S, decode tokens P..P+n-1 one at a time (T threads), keep each row's logits;
//   (a) restore S, decode the same n tokens in one llama_decode with logits for every row;
//   memcmp row j of (a) against decode j of (b); compare the sequence state (KV bytes) after both.
// --dump records every graph node's output through cb_eval and prints, per (T, n), the ops
// whose row j differs between (a) and (b), in graph order, with the largest absolute difference.
// --bench times plain single-token decode (32 tokens) and verification batches of 1/2/4/8/16 rows
// (medians of --reps; process CPU time, or wall time with --wall). --profile N repeats one batch of
// N rows (for perf record).
//
// Build: benchmarks/divergence/build.sh (CMake build of the pinned llama.cpp outside the repository,
// then g++ -std=c++17 against its include/ and static libraries libllama, libggml, libggml-cpu,
// libggml-base, with -lpthread -ldl -lm).

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <string>
#include <vector>

static const char * TEXT =
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
    "The quick brown fox jumps over the lazy dog. Speculative decoding drafts a few tokens "
    "cheaply and verifies them with one forward pass of the target model; the tokens that the "
    "target agrees with are kept, and the first disagreement is replaced by the target's own choice. ";

struct Rec {  // one graph node's output, as floats, with its shape
    std::string name;
    std::string op;
    int64_t     ne[4];
    std::vector<float> v;
};

struct Recorder {
    bool on = false;
    std::vector<Rec> recs;
};

static bool tensor_to_floats(const ggml_tensor * t, std::vector<float> & out) {
    if (t->type != GGML_TYPE_F32 && t->type != GGML_TYPE_F16) {
        return false;
    }
    if (!t->buffer || !ggml_backend_buffer_is_host(t->buffer)) {
        return false;
    }
    out.resize(ggml_nelements(t));
    size_t i = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++)
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++)
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++)
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
                    const char * p = (const char *) t->data + i0 * t->nb[0] + i1 * t->nb[1] + i2 * t->nb[2] + i3 * t->nb[3];
                    out[i++] = t->type == GGML_TYPE_F32 ? *(const float *) p : ggml_fp16_to_fp32(*(const ggml_fp16_t *) p);
                }
    return true;
}

static bool eval_cb(ggml_tensor * t, bool ask, void * ud) {
    Recorder * r = (Recorder *) ud;
    if (ask) {
        return r->on;
    }
    if (!r->on) {
        return true;
    }
    Rec rec;
    rec.name = t->name;
    rec.op   = ggml_op_desc(t);
    for (int d = 0; d < 4; d++) rec.ne[d] = t->ne[d];
    if (tensor_to_floats(t, rec.v)) {
        r->recs.push_back(std::move(rec));
    }
    return true;
}

struct Opts {
    std::string model;
    std::vector<int> threads = {1, 2, 3, 4};
    std::vector<int> widths  = {2, 3, 4, 5, 8, 9, 16, 17};
    int  prompt  = 40;
    int  fa      = -1;   // -1 auto (specstate's setting), 0 off, 1 on
    int  dump    = 0;    // 0: none; else the batch width to localise
    bool bench   = false;
    int  profile = 0;    // >0: repeat one batch of this many rows (for perf record)
    int  reps    = 7;
    int  ctx     = 2048;
    int  first   = 12;   // --dump: how many differing nodes to list in graph order
};

static std::vector<int> parse_list(const char * s) {
    std::vector<int> v;
    for (const char * p = s; *p;) {
        v.push_back(atoi(p));
        while (*p && *p != ',') p++;
        if (*p == ',') p++;
    }
    return v;
}

struct Runner {
    llama_model *   model = nullptr;
    llama_context * ctx   = nullptr;
    Recorder        rec;
    int             n_vocab = 0;
    std::vector<llama_token> toks;
    std::vector<uint8_t> state;

    void init(const Opts & o, bool with_cb) {
        llama_model_params mp = llama_model_default_params();
        mp.n_gpu_layers       = 0;
        model = llama_model_load_from_file(o.model.c_str(), mp);
        if (!model) { fprintf(stderr, "load failed\n"); exit(1); }
        const llama_vocab * vocab = llama_model_get_vocab(model);
        n_vocab = llama_vocab_n_tokens(vocab);
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = o.ctx; cp.n_batch = 512; cp.n_ubatch = 512; cp.n_seq_max = 1;
        cp.n_threads = 4; cp.n_threads_batch = 4; cp.no_perf = true;
        cp.flash_attn_type = (llama_flash_attn_type) o.fa;
        if (with_cb) { cp.cb_eval = eval_cb; cp.cb_eval_user_data = &rec; }
        ctx = llama_init_from_model(model, cp);
        if (!ctx) { fprintf(stderr, "ctx failed\n"); exit(1); }
        std::string text;
        while ((int) toks.size() < o.prompt + 64) {
            text += TEXT;
            toks.resize(text.size() + 16);
            int n = llama_tokenize(vocab, text.c_str(), (int) text.size(), toks.data(), (int) toks.size(), true, false);
            toks.resize(n);
        }
    }
    void decode(int pos, int n, bool all_logits) {
        llama_batch b = llama_batch_init(n, 0, 1);
        for (int i = 0; i < n; i++) {
            b.token[i] = toks[pos + i]; b.pos[i] = pos + i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0;
            b.logits[i] = all_logits || i == n - 1;
        }
        b.n_tokens = n;
        if (llama_decode(ctx, b) != 0) { fprintf(stderr, "decode failed\n"); exit(1); }
        llama_batch_free(b);
    }
    void prefill(int P) {
        llama_memory_clear(llama_get_memory(ctx), true);
        llama_set_n_threads(ctx, 1, 1);
        decode(0, P, false);
        state.resize(llama_state_seq_get_size(ctx, 0));
        llama_state_seq_get_data(ctx, state.data(), state.size(), 0);
    }
    void restore() {
        llama_memory_clear(llama_get_memory(ctx), true);
        if (llama_state_seq_set_data(ctx, state.data(), state.size(), 0) != state.size()) { fprintf(stderr, "restore failed\n"); exit(1); }
    }
    std::vector<uint8_t> seq_state() {
        std::vector<uint8_t> s(llama_state_seq_get_size(ctx, 0));
        llama_state_seq_get_data(ctx, s.data(), s.size(), 0);
        return s;
    }
    std::vector<float> logits(int i) { const float * l = llama_get_logits_ith(ctx, i); return std::vector<float>(l, l + n_vocab); }
};

static double maxdiff(const std::vector<float> & a, const std::vector<float> & b) {
    double m = 0; for (size_t i = 0; i < a.size(); i++) m = std::max(m, (double) std::fabs(a[i] - b[i])); return m;
}

static int layer_of(const std::string & name) {
    size_t p = name.rfind('-');
    if (p == std::string::npos) return -1;
    const char * s = name.c_str() + p + 1;
    if (!*s) return -1;
    for (const char * c = s; *c; c++) if (*c < '0' || *c > '9') return -1;
    return atoi(s);
}

// key: name#occurrence, so repeated names stay distinct
static std::map<std::string, const Rec *> index_recs(const std::vector<Rec> & recs, std::vector<std::string> * order) {
    std::map<std::string, const Rec *> m; std::map<std::string, int> seen;
    for (const Rec & r : recs) {
        std::string k = r.name + "#" + std::to_string(seen[r.name]++);
        m[k] = &r; if (order) order->push_back(k);
    }
    return m;
}

// Slice row j (token dim) out of batch record a, aligned with single record b; false if shapes can't be matched.
static bool row_compare(const Rec & a, const Rec & b, int n, int j, int P, bool & equal, double & md) {
    int tokdim = -1;
    for (int d = 0; d < 4; d++) {
        if (a.ne[d] != b.ne[d]) {
            if (a.ne[d] == n && b.ne[d] == 1 && tokdim < 0) tokdim = d;
        }
    }
    if (tokdim < 0) return false;
    int64_t ext[4];
    for (int d = 0; d < 4; d++) ext[d] = d == tokdim ? 1 : std::min(a.ne[d], b.ne[d]);
    // kq (attention scores before the mask): cells after the row's own position hold the
    // batch's later tokens on one side and empty cells on the other; the mask drops both
    if (a.name.rfind("kq-", 0) == 0 && tokdim == 1) ext[0] = std::min<int64_t>(ext[0], P + j + 1);
    equal = true; md = 0;
    for (int64_t i3 = 0; i3 < ext[3]; i3++) for (int64_t i2 = 0; i2 < ext[2]; i2++)
    for (int64_t i1 = 0; i1 < ext[1]; i1++) for (int64_t i0 = 0; i0 < ext[0]; i0++) {
        int64_t ia[4] = {i0, i1, i2, i3}; ia[tokdim] = j;
        int64_t ib[4] = {i0, i1, i2, i3}; ib[tokdim] = 0;
        float va = a.v[((ia[3] * a.ne[2] + ia[2]) * a.ne[1] + ia[1]) * a.ne[0] + ia[0]];
        float vb = b.v[((ib[3] * b.ne[2] + ib[2]) * b.ne[1] + ib[1]) * b.ne[0] + ib[0]];
        if (memcmp(&va, &vb, 4) != 0) {
            equal = false;
            if (!(std::isinf(va) && std::isinf(vb))) md = std::max(md, (double) std::fabs(va - vb));
        }
    }
    return true;
}

static void run_dump(Runner & R, const Opts & o, int T, int n) {
    R.prefill(o.prompt);
    llama_set_n_threads(R.ctx, T, T);
    // singles
    std::vector<std::vector<Rec>> single(n);
    std::vector<std::vector<float>> lb(n);
    R.restore();
    for (int j = 0; j < n; j++) {
        R.rec.recs.clear(); R.rec.on = true;
        R.decode(o.prompt + j, 1, true);
        R.rec.on = false;
        single[j] = std::move(R.rec.recs);
        lb[j] = R.logits(0);
    }
    R.restore();
    R.rec.recs.clear(); R.rec.on = true;
    R.decode(o.prompt, n, true);
    R.rec.on = false;
    std::vector<Rec> batch = std::move(R.rec.recs);
    int rows_eq = 0;
    for (int j = 0; j < n; j++) rows_eq += memcmp(R.logits(j).data(), lb[j].data(), 4 * R.n_vocab) == 0;
    printf("## dump T=%d n=%d: logits rows equal %d/%d (recording on)\n", T, n, rows_eq, n);
    std::vector<std::string> order;
    auto ia = index_recs(batch, &order);
    std::vector<std::map<std::string, const Rec *>> ib(n);
    for (int j = 0; j < n; j++) ib[j] = index_recs(single[j], nullptr);
    // per op (name without layer): first layer where a row differs, max diff there, and overall
    struct Agg { int first_layer = 1 << 30; std::string first_key; double md_first = 0, md_all = 0; int ndiff = 0; std::string op; std::string rows; };
    std::map<std::string, Agg> agg; std::vector<std::string> agg_order;
    int printed = 0;
    for (const std::string & k : order) {
        const Rec * a = ia[k];
        bool any = false, matched = false; double md = 0; std::string rows;
        for (int j = 0; j < n; j++) {
            auto it = ib[j].find(k);
            if (it == ib[j].end()) continue;
            bool eq; double d;
            if (!row_compare(*a, *it->second, n, j, o.prompt, eq, d)) continue;
            matched = true;
            if (!eq) { any = true; md = std::max(md, d); rows += std::to_string(j) + ","; }
        }
        if (!matched) continue;
        std::string base = a->name; int L = layer_of(base);
        if (L >= 0) base = base.substr(0, base.rfind('-'));
        if (!agg.count(base)) agg_order.push_back(base);
        Agg & g = agg[base]; g.op = a->op;
        if (any) {
            g.ndiff++; g.md_all = std::max(g.md_all, md);
            if (g.first_key.empty()) { g.first_layer = L; g.first_key = k; g.md_first = md; g.rows = rows; }  // first in graph order
            if (printed < o.first) { printf("  first diffs: %-28s %-10s layer %3d  max|d| %.3g  rows %s  ne %lld,%lld,%lld,%lld\n", a->name.c_str(), a->op.c_str(), L, md, rows.c_str(), (long long) a->ne[0], (long long) a->ne[1], (long long) a->ne[2], (long long) a->ne[3]); printed++; }
        }
    }
    printf("  %-24s %-12s %8s %8s %12s %12s %s\n", "node", "op", "nodiff", "first_L", "maxd@first", "maxd_all", "rows@first");
    for (const std::string & b : agg_order) {
        const Agg & g = agg[b];
        if (g.ndiff == 0) { printf("  %-24s %-12s %8s\n", b.c_str(), g.op.c_str(), "equal"); continue; }
        printf("  %-24s %-12s %8d %8d %12.3g %12.3g %s\n", b.c_str(), g.op.c_str(), g.ndiff, g.first_layer, g.md_first, g.md_all, g.rows.c_str());
    }
}

static void run_check(Runner & R, const Opts & o) {
    int nmax = *std::max_element(o.widths.begin(), o.widths.end());
    R.prefill(o.prompt);
    std::vector<std::vector<float>> ref;  // singles at T=1
    int total_bad = 0;
    for (int T : o.threads) {
        llama_set_n_threads(R.ctx, T, T);
        std::vector<std::vector<float>> lb(nmax);
        std::vector<std::vector<uint8_t>> sb(nmax);
        R.restore();
        for (int j = 0; j < nmax; j++) { R.decode(o.prompt + j, 1, true); lb[j] = R.logits(0); sb[j] = R.seq_state(); }
        if (ref.empty()) ref = lb;
        int single_vs_t1 = 0; double md_t1 = 0;
        for (int j = 0; j < nmax; j++) { single_vs_t1 += memcmp(lb[j].data(), ref[j].data(), 4 * R.n_vocab) == 0; md_t1 = std::max(md_t1, maxdiff(lb[j], ref[j])); }
        printf("T=%d singles equal to T=%d singles: %d/%d rows (max|d| %.3g)\n", T, o.threads[0], single_vs_t1, nmax, md_t1);
        // a digest of the single decodes' logits, to compare across runs at other thread counts
        uint64_t h = 1469598103934665603ull;
        for (int j = 0; j < nmax; j++) {
            const uint8_t * b = (const uint8_t *) lb[j].data();
            for (size_t i = 0; i < lb[j].size() * sizeof(float); i++) { h ^= b[i]; h *= 1099511628211ull; }
        }
        printf("T=%d singles digest %016llx (rows %d..%d)\n", T, (unsigned long long) h, o.prompt, o.prompt + nmax - 1);
        for (int n : o.widths) {
            R.restore();
            R.decode(o.prompt, n, true);
            int eq = 0; double md = 0; std::string bad;
            for (int j = 0; j < n; j++) {
                std::vector<float> la = R.logits(j);
                bool e = memcmp(la.data(), lb[j].data(), 4 * R.n_vocab) == 0;
                eq += e; md = std::max(md, maxdiff(la, lb[j]));
                if (!e) bad += std::to_string(j) + ",";
            }
            std::vector<uint8_t> sa = R.seq_state();
            bool kv_eq = sa.size() == sb[n - 1].size() && memcmp(sa.data(), sb[n - 1].data(), sa.size()) == 0;
            total_bad += n - eq + !kv_eq;
            printf("T=%d n=%2d: rows memcmp-equal %2d/%2d  max|d| %-9.3g kv-state %s  %s%s\n", T, n, eq, n, md,
                   kv_eq ? "equal" : "DIFFERS", bad.empty() ? "" : "differing rows: ", bad.c_str());
        }
    }
    printf("RESULT %s: %s (P=%d, fa=%d)\n", o.model.c_str(), total_bad == 0 ? "ALL EQUAL" : "DIFFERENCES", o.prompt, o.fa);
}

// process CPU time: with one thread it is the compute itself, whatever else the machine runs;
// wall time is printed beside it (--wall) for an idle machine
static bool g_wall = false;
static double now_ms() {
    if (g_wall) return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
    timespec ts; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts); return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void run_bench(Runner & R, const Opts & o) {
    R.prefill(o.prompt);
    for (int T : o.threads) {
        llama_set_n_threads(R.ctx, T, T);
        const int widths[] = {1, 2, 4, 8, 16};
        std::map<int, std::vector<double>> t;
        std::vector<double> tok;
        for (int rep = 0; rep < o.reps; rep++) {
            R.restore();
            double t0 = now_ms();
            for (int j = 0; j < 32; j++) R.decode(o.prompt + j, 1, true);
            tok.push_back(32000.0 / (now_ms() - t0));
            for (int n : widths) {
                R.restore();
                double t1 = now_ms(); R.decode(o.prompt, n, true); t[n].push_back(now_ms() - t1);
            }
        }
        auto med = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; };
        printf("BENCH(%s) T=%d decode %.1f tok/s | verify ms:", g_wall ? "wall" : "cpu", T, med(tok));
        for (int n : widths) printf(" %d:%.2f", n, med(t[n]));
        printf(" | ratio 8/1 %.2f 16/1 %.2f\n", med(t[8]) / med(t[1]), med(t[16]) / med(t[1]));
    }
}

static void quiet_log(ggml_log_level level, const char * text, void *) { if (level >= GGML_LOG_LEVEL_ERROR) fputs(text, stderr); }

int main(int argc, char ** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);
    Opts o;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto next = [&]() { return argv[++i]; };
        if (a == "-m") o.model = next();
        else if (a == "-t") o.threads = parse_list(next());
        else if (a == "-n") o.widths = parse_list(next());
        else if (a == "-p") o.prompt = atoi(next());
        else if (a == "--fa") o.fa = atoi(next());
        else if (a == "--dump") o.dump = atoi(next());
        else if (a == "--first") o.first = atoi(next());
        else if (a == "--bench") o.bench = true;
        else if (a == "--wall") g_wall = true;
        else if (a == "--profile") o.profile = atoi(next());
        else if (a == "--reps") o.reps = atoi(next());
        else { fprintf(stderr, "unknown arg %s\n", a.c_str()); return 2; }
    }
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    Runner R;
    R.init(o, o.dump > 0);
    if (o.dump > 0) {
        for (int T : o.threads) run_dump(R, o, T, o.dump);
    } else if (o.profile > 0) {
        R.prefill(o.prompt);
        llama_set_n_threads(R.ctx, o.threads[0], o.threads[0]);
        for (int r = 0; r < o.reps; r++) { R.restore(); R.decode(o.prompt, o.profile, true); }
    } else if (o.bench) {
        run_bench(R, o);
    } else {
        run_check(R, o);
    }
    llama_free(R.ctx);
    llama_model_free(R.model);
    return 0;
}
