// llama.cpp's grammar sampler calls with every C++ exception caught (specstate's own C++, compiled by build.rs).
//
// llama.cpp's grammar engine throws std::runtime_error when a grammar exceeds the bounds of specstate's patch 0004
// (llama-cpp-sys-4/README.md: too many parse stacks, too deep a stack, too much work for one step), from
// llama_sampler_init_grammar, llama_sampler_apply and llama_sampler_reset. A C++ exception unwinding into Rust is
// undefined behaviour (in practice the process aborts), so src/native/grammar.rs calls these wrappers instead: each
// returns SPECSTATE_GRAMMAR_OK, or SPECSTATE_GRAMMAR_THROWN with the exception's message copied (truncated,
// NUL-terminated) into the caller's buffer. The llama.cpp functions and types are declared here as llama.h declares
// them (C linkage; the types are only pointed at), so no header of the sys crate is needed.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>

extern "C" {
struct llama_vocab;
struct llama_sampler;
struct llama_token_data_array;

struct llama_sampler * llama_sampler_init_grammar(const struct llama_vocab * vocab, const char * grammar_str,
                                                  const char * grammar_root);
void llama_sampler_apply(struct llama_sampler * smpl, struct llama_token_data_array * cur_p);
void llama_sampler_reset(struct llama_sampler * smpl);
struct llama_sampler * llama_sampler_clone(const struct llama_sampler * smpl);
}

namespace {

constexpr int32_t SPECSTATE_GRAMMAR_OK = 0;
constexpr int32_t SPECSTATE_GRAMMAR_THROWN = 1;

void copy_message(const char * what, char * out, size_t out_len) {
    if (out == nullptr || out_len == 0) {
        return;
    }
    size_t n = what == nullptr ? 0 : std::strlen(what);
    if (n >= out_len) {
        n = out_len - 1;
    }
    if (n > 0) {
        std::memcpy(out, what, n);
    }
    out[n] = '\0';
}

template <typename Fn> int32_t guarded(Fn && fn, char * message, size_t message_len) {
    copy_message("", message, message_len);
    try {
        fn();
        return SPECSTATE_GRAMMAR_OK;
    } catch (const std::exception & e) {
        copy_message(e.what(), message, message_len);
    } catch (...) {
        copy_message("unknown C++ exception", message, message_len);
    }
    return SPECSTATE_GRAMMAR_THROWN;
}

} // namespace

extern "C" {

// llama_sampler_init_grammar; *out is NULL when the grammar does not parse (or on an exception).
int32_t specstate_grammar_init(const struct llama_vocab * vocab, const char * grammar_str, const char * grammar_root,
                               struct llama_sampler ** out, char * message, size_t message_len) {
    *out = nullptr;
    return guarded([&] { *out = llama_sampler_init_grammar(vocab, grammar_str, grammar_root); }, message,
                   message_len);
}

// llama_sampler_apply; on an exception the sampler is unchanged and some logits may already be lowered.
int32_t specstate_grammar_apply(struct llama_sampler * smpl, struct llama_token_data_array * cur_p, char * message,
                                size_t message_len) {
    return guarded([&] { llama_sampler_apply(smpl, cur_p); }, message, message_len);
}

// llama_sampler_reset; on an exception the sampler keeps its state.
int32_t specstate_grammar_reset(struct llama_sampler * smpl, char * message, size_t message_len) {
    return guarded([&] { llama_sampler_reset(smpl); }, message, message_len);
}

// llama_sampler_clone; NULL on an exception (out of memory).
struct llama_sampler * specstate_grammar_clone(const struct llama_sampler * smpl) {
    struct llama_sampler * result = nullptr;
    guarded([&] { result = llama_sampler_clone(smpl); }, nullptr, 0);
    return result;
}

} // extern "C"
