// llama-spec: greedy generation with llama.cpp's own speculation
// (common/speculative.h), for specstate's benchmark peer rows.
//
//   llama-spec MODEL PROMPT_FILE N_TOKENS THREADS N_DRAFT [SPEC_TYPE [SIZE_N SIZE_M]]
//   llama-spec MODEL PROMPT_FILE N_TOKENS THREADS N_DRAFT draft-simple DRAFT_MODEL
//
// SPEC_TYPE: ngram-simple (default), ngram-map-k or ngram-cache (any name
// common_speculative_type_from_name knows is accepted). SIZE_N / SIZE_M
// override the lookup n-gram and draft m-gram sizes of ngram-simple and
// ngram-map-k (llama.cpp's defaults otherwise); drafts are cut to N_DRAFT.
// draft-simple drafts with DRAFT_MODEL (greedy, up to N_DRAFT tokens) in a
// context of its own, which sees every batch the target decodes (the prompt
// and each verification, through common_speculative_process) and loses the
// rows the target rejects, as llama-server keeps its draft context.
//
// The prompt is tokenized with special-token parsing and no added BOS, decoded,
// then N_TOKENS tokens are generated greedily (stopping at end-of-generation):
// each step drafts from the token history, decodes the last token plus the
// draft in one batch, keeps the draft up to the first row whose argmax differs,
// adds the target's own token and drops the rejected rows from the KV cache.
// Timing starts after the first generated token (prefill excluded). Prints one
// JSON line: {"tokens_per_s", "n_tokens", "drafted", "accepted", "tokens"}.

#include "common.h"
#include "log.h"
#include "llama.h"
#include "speculative.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr uint32_t N_CTX   = 1024;
constexpr uint32_t N_BATCH = 512;

struct options {
    std::string model;
    std::string prompt_file;
    int n_tokens = 0;
    int threads  = 0;
    int n_draft  = 0;
    std::string spec_type = "ngram-simple";
    int size_n = -1;  // -1: llama.cpp's default
    int size_m = -1;
    std::string draft_model;  // draft-simple's model; empty for the n-gram types
};

struct totals {
    llama_tokens generated;
    long drafted  = 0;
    long accepted = 0;
    double seconds = 0.0;
};

void quiet_log(ggml_log_level /*level*/, const char * /*text*/, void * /*user_data*/) {}

int positive_int(const char * text, const char * name) {
    const int value = std::atoi(text);
    if (value <= 0) {
        throw std::runtime_error(std::string(name) + " must be a positive integer, not '" + text + "'");
    }
    return value;
}

options parse_args(int argc, char ** argv) {
    if (argc < 6 || argc > 9) {
        throw std::runtime_error(
            "usage: llama-spec MODEL PROMPT_FILE N_TOKENS THREADS N_DRAFT [SPEC_TYPE [SIZE_N SIZE_M]] "
            "or ... N_DRAFT draft-simple DRAFT_MODEL");
    }
    options opt;
    opt.model       = argv[1];
    opt.prompt_file = argv[2];
    opt.n_tokens    = positive_int(argv[3], "N_TOKENS");
    opt.threads     = positive_int(argv[4], "THREADS");
    opt.n_draft     = positive_int(argv[5], "N_DRAFT");
    if (argc >= 7) {
        opt.spec_type = argv[6];
    }
    const bool drafting = opt.spec_type == "draft-simple";
    if (argc == 8 && drafting) {
        opt.draft_model = argv[7];
    } else if (argc == 9 && !drafting) {
        opt.size_n = positive_int(argv[7], "SIZE_N");
        opt.size_m = positive_int(argv[8], "SIZE_M");
    } else if (argc != 6 && argc != 7) {
        throw std::runtime_error("draft-simple takes DRAFT_MODEL alone; the n-gram types take SIZE_N SIZE_M");
    }
    if (drafting && opt.draft_model.empty()) {
        throw std::runtime_error("draft-simple needs DRAFT_MODEL");
    }
    return opt;
}

std::string read_file(const std::string & path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        throw std::runtime_error("cannot read " + path);
    }
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

common_params_speculative spec_params(const options & opt, llama_context * ctx, llama_context * ctx_dft) {
    const common_speculative_type type = common_speculative_type_from_name(opt.spec_type);
    if (type == COMMON_SPECULATIVE_TYPE_COUNT || type == COMMON_SPECULATIVE_TYPE_NONE) {
        throw std::runtime_error("unknown SPEC_TYPE '" + opt.spec_type + "'");
    }
    common_params_speculative params;
    params.types = { type };
    params.draft.n_max   = opt.n_draft;
    params.draft.ctx_tgt = ctx;
    params.draft.ctx_dft = ctx_dft;
    for (auto * sizes : { &params.ngram_simple, &params.ngram_map_k, &params.ngram_map_k4v }) {
        if (opt.size_n > 0) {
            sizes->size_n = (uint16_t) opt.size_n;
            sizes->size_m = (uint16_t) opt.size_m;
        }
    }
    return params;
}

llama_token argmax(llama_context * ctx, int32_t row, int32_t n_vocab) {
    const float * logits = llama_get_logits_ith(ctx, row);
    return (llama_token) (std::max_element(logits, logits + n_vocab) - logits);
}

void decode(llama_context * ctx, common_batch & batch) {
    if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch.get()) != 0) {
        throw std::runtime_error("llama_process failed");
    }
}

// Decodes the prompt in chunks of N_BATCH (and hands each chunk to the drafter: a draft model decodes it too);
// the last row's logits stay readable at row `last`.
int32_t prefill(llama_context * ctx, common_speculative * spec, const llama_tokens & prompt) {
    common_batch batch(ctx);
    int32_t last = 0;
    for (size_t start = 0; start < prompt.size(); start += N_BATCH) {
        const size_t end = std::min(prompt.size(), start + N_BATCH);
        batch.clear();
        for (size_t i = start; i < end; ++i) {
            batch.add(prompt[i], (llama_pos) i, 0, i + 1 == prompt.size());
        }
        decode(ctx, batch);
        common_speculative_process(spec, batch);
        last = (int32_t) (end - start - 1);
    }
    return last;
}

// Drafts up to `n_max` tokens continuing `history` + `id_last`; empty when there is no match.
llama_tokens draft(common_speculative * spec, const llama_tokens & history, llama_token id_last, int n_max) {
    llama_tokens result;
    if (n_max <= 0) {
        return result;
    }
    common_speculative_draft_params & dp = common_speculative_get_draft_params(spec, 0);
    dp.drafting = true;
    dp.n_max    = n_max;
    dp.pos0     = (llama_pos) history.size();
    dp.id_last  = id_last;
    dp.prompt   = &history;
    dp.result   = &result;
    common_speculative_draft(spec);
    dp.prompt = nullptr;
    dp.result = nullptr;
    return result;
}

// Drops every row from position `from` on, in the target's context and the draft model's (if any).
void forget(llama_context * ctx, llama_context * ctx_dft, llama_pos from) {
    for (llama_context * c : { ctx, ctx_dft }) {
        if (c != nullptr) {
            llama_memory_seq_rm(llama_get_memory(c), 0, from, -1);
        }
    }
}

// One speculative step: verifies `id_last` + draft, appends the committed tokens
// to `run.generated` and `history`, and returns the target's next token. A draft
// model's own rows of the draft are dropped before it decodes the verified batch.
llama_token step(llama_context * ctx, llama_context * ctx_dft, common_speculative * spec, const options & opt,
                 int32_t n_vocab, llama_tokens & history, llama_token id_last, totals & run) {
    const int remaining = opt.n_tokens - (int) run.generated.size();
    const llama_pos n_past = (llama_pos) history.size();
    const llama_tokens proposal = draft(spec, history, id_last, std::min(opt.n_draft, remaining - 1));
    forget(nullptr, ctx_dft, n_past);

    common_batch batch(ctx);
    batch.add(id_last, n_past, 0, true);
    for (size_t i = 0; i < proposal.size(); ++i) {
        batch.add(proposal[i], n_past + 1 + (llama_pos) i, 0, true);
    }
    decode(ctx, batch);
    common_speculative_process(spec, batch);

    history.push_back(id_last);
    size_t n_accepted = 0;
    llama_token next = argmax(ctx, 0, n_vocab);
    while (n_accepted < proposal.size() && next == proposal[n_accepted]) {
        history.push_back(next);
        run.generated.push_back(next);
        ++n_accepted;
        if (llama_vocab_is_eog(llama_model_get_vocab(llama_get_model(ctx)), next)) {
            break;
        }
        next = argmax(ctx, (int32_t) n_accepted, n_vocab);
    }
    forget(ctx, ctx_dft, (llama_pos) history.size());
    if (!proposal.empty()) {
        common_speculative_accept(spec, 0, (uint16_t) n_accepted);
    }
    run.drafted  += (long) proposal.size();
    run.accepted += (long) n_accepted;
    return next;
}

totals generate(llama_context * ctx, llama_context * ctx_dft, common_speculative * spec, const options & opt,
                const llama_tokens & prompt) {
    const llama_vocab * vocab = llama_model_get_vocab(llama_get_model(ctx));
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);

    totals run;
    llama_tokens history = prompt;  // every token whose KV is in the cache
    llama_token id_last = argmax(ctx, prefill(ctx, spec, prompt), n_vocab);
    run.generated.push_back(id_last);
    common_speculative_begin(spec, 0, prompt);

    const auto started = std::chrono::steady_clock::now();
    while ((int) run.generated.size() < opt.n_tokens && !llama_vocab_is_eog(vocab, run.generated.back())) {
        id_last = step(ctx, ctx_dft, spec, opt, n_vocab, history, id_last, run);
        if (llama_vocab_is_eog(vocab, run.generated.back())) {
            break;
        }
        run.generated.push_back(id_last);
    }
    run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return run;
}

void print_json(const totals & run) {
    const double rate = run.generated.size() > 1 && run.seconds > 0.0
                            ? (double) (run.generated.size() - 1) / run.seconds
                            : 0.0;
    std::printf("{\"tokens_per_s\": %.4f, \"n_tokens\": %zu, \"drafted\": %ld, \"accepted\": %ld, \"tokens\": [",
                rate, run.generated.size(), run.drafted, run.accepted);
    for (size_t i = 0; i < run.generated.size(); ++i) {
        std::printf(i == 0 ? "%d" : ", %d", run.generated[i]);
    }
    std::printf("]}\n");
}

llama_context * make_context(llama_model * model, const options & opt) {
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx           = N_CTX;
    cparams.n_batch         = std::max<uint32_t>(N_BATCH, (uint32_t) opt.n_draft + 1);
    cparams.n_ubatch        = cparams.n_batch;
    cparams.n_seq_max       = 1;
    cparams.n_threads       = opt.threads;
    cparams.n_threads_batch = opt.threads;
    cparams.no_perf         = true;
    return llama_init_from_model(model, cparams);
}

llama_model * load_model(const std::string & path) {
    llama_model * model = llama_model_load_from_file(path.c_str(), llama_model_default_params());
    if (model == nullptr) {
        throw std::runtime_error("cannot load model " + path);
    }
    return model;
}

llama_context * new_context(llama_model * model, const options & opt) {
    llama_context * ctx = make_context(model, opt);
    if (ctx == nullptr) {
        throw std::runtime_error("cannot create a context");
    }
    return ctx;
}

int run(const options & opt) {
    llama_model * model = load_model(opt.model);
    llama_context * ctx = new_context(model, opt);
    llama_model * model_dft = opt.draft_model.empty() ? nullptr : load_model(opt.draft_model);
    llama_context * ctx_dft = model_dft == nullptr ? nullptr : new_context(model_dft, opt);
    const llama_tokens prompt = common_tokenize(llama_model_get_vocab(model), read_file(opt.prompt_file),
                                                /*add_special=*/false, /*parse_special=*/true);
    if (prompt.empty() || prompt.size() + (size_t) opt.n_tokens + (size_t) opt.n_draft >= N_CTX) {
        throw std::runtime_error("the prompt is empty or does not fit in the context with N_TOKENS");
    }
    common_params_speculative params = spec_params(opt, ctx, ctx_dft);
    common_speculative_ptr spec(common_speculative_init(params, 1));
    if (!spec) {
        throw std::runtime_error("common_speculative_init returned no implementation");
    }
    const totals result = generate(ctx, ctx_dft, spec.get(), opt, prompt);
    spec.reset();
    if (model_dft != nullptr) {
        llama_free(ctx_dft);
        llama_model_free(model_dft);
    }
    llama_free(ctx);
    llama_model_free(model);
    print_json(result);
    return 0;
}

}  // namespace

int main(int argc, char ** argv) {
    llama_log_set(quiet_log, nullptr);
    common_log_set_verbosity_thold(-1);
    try {
        const options opt = parse_args(argc, argv);
        llama_backend_init();
        const int rc = run(opt);
        llama_backend_free();
        return rc;
    } catch (const std::exception & err) {
        std::fprintf(stderr, "llama-spec: %s\n", err.what());
        return 1;
    }
}
