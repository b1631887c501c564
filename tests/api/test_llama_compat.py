"""What ported llama-cpp-python scripts use beyond the calls: the state and cache API, the
constructor's parameters, the helper methods, signatures that show every parameter, string logit_bias keys,
and usage counted as llama-cpp-python counts it."""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import specstate
from specstate import Llama, LlamaDiskCache, LlamaRAMCache, LlamaState, Model, UnsupportedParameterError
from specstate.embeddings import EMBEDDING_POOLINGS, Embedder
from specstate.llama.compat import ACCEPTED_AT, WITHOUT_EFFECT
from specstate_testkit import models
from test_chat import TINY_TEMPLATE

N_CTX = 256
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return models.build_llama(tmp_path_factory.mktemp("llama_compat") / "templated.gguf", chat_template=TINY_TEMPLATE)


def tiny_llama(path: Path, **settings: object) -> Llama:
    return Llama(str(path), n_ctx=N_CTX, n_threads=1, seed=7, **settings)  # type: ignore[arg-type]


# --- state and cache


def test_a_saved_state_pickles_and_a_later_completion_continues_it_in_another_process(tiny_chat: Path) -> None:
    llm = tiny_llama(tiny_chat, mode="ngram")
    first = llm.create_completion(PROMPT, max_tokens=8, temperature=0)
    state = llm.save_state()
    assert state.n_tokens > 8 and state.llama_state_size == len(state.llama_state) > 0
    more = state.input_ids + tuple(llm.tokenize(b" and then", add_bos=False))
    llm.load_state(pickle.loads(pickle.dumps(state)))  # as it came back
    here = llm.create_completion(list(more), max_tokens=8, temperature=0)
    script = textwrap.dedent(
        """
        import pickle, sys
        from specstate import Llama
        state, more = pickle.loads(sys.stdin.buffer.read())
        llm = Llama(sys.argv[1], n_ctx=256, n_threads=1, seed=7, mode="ngram")
        llm.load_state(state)
        print(llm.create_completion(list(more), max_tokens=8, temperature=0)["choices"][0]["text"], end="")
        """
    )
    there = subprocess.run(
        [sys.executable, "-c", script, str(tiny_chat)],
        input=pickle.dumps((state, more)),
        capture_output=True,
        check=True,
    )
    assert there.stdout.decode() == here["choices"][0]["text"]
    assert first["choices"][0]["text"]


def test_a_chat_state_restores_the_conversation(tiny_chat: Path) -> None:
    llm = tiny_llama(tiny_chat)
    history = [{"role": "user", "content": "Hi"}]
    reply = llm.create_chat_completion(history, max_tokens=6, temperature=0)["choices"][0]["message"]["content"]
    state = llm.save_state()
    assert state.chat
    history += [{"role": "assistant", "content": reply or ""}, {"role": "user", "content": "Go on."}]
    expected = llm.create_chat_completion(history, max_tokens=6, temperature=0)
    other = tiny_llama(tiny_chat)
    other.load_state(state)
    assert other.create_chat_completion(history, max_tokens=6, temperature=0)["choices"] == expected["choices"]


@pytest.mark.parametrize("kind", ["ram", "disk"])
def test_a_cached_prefix_then_a_different_continuation_equals_a_cold_run(
    tiny_chat: Path, tmp_path: Path, kind: str
) -> None:
    llm = tiny_llama(tiny_chat)
    cache = LlamaRAMCache(capacity_bytes=64 << 20) if kind == "ram" else LlamaDiskCache(tmp_path, 64 << 20)
    llm.set_cache(cache)
    llm.create_completion(PROMPT, max_tokens=8, temperature=0)
    cached = llm.save_state().input_ids
    assert cache.cache_size > 0 and cached in cache
    for suffix in (b" the end.", b" a dragon"):
        prompt = [*cached, *llm.tokenize(suffix, add_bos=False)]
        warm = llm.create_completion(prompt, max_tokens=12, temperature=0)
        cold = tiny_llama(tiny_chat).create_completion(prompt, max_tokens=12, temperature=0)
        assert warm["choices"][0]["text"] == cold["choices"][0]["text"]
        assert warm["usage"] == cold["usage"]
    if kind == "disk":  # a later process finds the files
        assert cached in LlamaDiskCache(tmp_path, 64 << 20)


def test_a_cache_is_bounded_in_bytes(tiny_chat: Path) -> None:
    llm = tiny_llama(tiny_chat)
    llm.create_completion(PROMPT, max_tokens=4, temperature=0)
    size = llm.save_state().llama_state_size
    cache = LlamaRAMCache(capacity_bytes=size + size // 2)
    llm.set_cache(cache)
    for prompt in ("one", "two", "three"):
        llm.create_completion(prompt, max_tokens=4, temperature=0)
    assert cache.cache_size <= cache.capacity_bytes
    with pytest.raises(TypeError):
        llm.set_cache("not a cache")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        LlamaRAMCache(capacity_bytes=-1)


def make_cache(kind: str, directory: Path) -> LlamaRAMCache | LlamaDiskCache:
    return LlamaRAMCache(capacity_bytes=64 << 20) if kind == "ram" else LlamaDiskCache(directory, 64 << 20)


def cold_text(path: Path, prompt: list[int]) -> str:
    return tiny_llama(path).create_completion(prompt, max_tokens=8, temperature=0)["choices"][0]["text"]


@pytest.mark.parametrize("kind", ["ram", "disk"])
def test_a_cached_checkpoint_of_other_tokens_is_a_miss_never_that_generation_continued(
    smollm2_file: Path, tmp_path: Path, kind: str
) -> None:
    llm = tiny_llama(smollm2_file)
    held = []
    for start in ("The planets are Mercury, Venus", "Plants that eat insects: the Venus"):
        llm.create_completion(llm.tokenize(start.encode())[:6], max_tokens=6, temperature=0)
        held.append(llm.save_state())
    assert held[0].n_tokens == held[1].n_tokens and held[0].input_ids != held[1].input_ids
    cache = make_cache(kind, tmp_path)
    cache[held[1].input_ids] = held[0]  # the first generation's checkpoint under the second's tokens
    llm.set_cache(cache)
    prompt = [*held[1].input_ids, *llm.tokenize(b" and", add_bos=False)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        text = llm.create_completion(prompt, max_tokens=8, temperature=0)["choices"][0]["text"]
    assert text == cold_text(smollm2_file, prompt)  # not the first generation continued
    assert [str(w.message) for w in caught if "other tokens" in str(w.message)]
    assert held[1].input_ids not in cache
    if kind == "disk":  # its file deleted
        assert held[1].input_ids not in LlamaDiskCache(tmp_path, 64 << 20)


@pytest.mark.parametrize("kind", ["ram", "disk"])
def test_another_models_entry_in_a_shared_cache_is_a_miss_and_kept_for_that_model(
    tiny_chat: Path, tmp_path: Path, kind: str
) -> None:
    other_model = models.build_llama(tmp_path / "other.gguf", seed=5, chat_template=TINY_TEMPLATE)
    cache = make_cache(kind, tmp_path / "cache")
    other = tiny_llama(other_model)
    other.set_cache(cache)
    other.create_completion(PROMPT, max_tokens=8, temperature=0)
    cached = other.save_state().input_ids
    llm = tiny_llama(tiny_chat)
    llm.set_cache(make_cache(kind, tmp_path / "cache") if kind == "disk" else cache)
    prompt = [*cached, *llm.tokenize(b" and", add_bos=False)]
    with pytest.warns(RuntimeWarning, match="model"):
        text = llm.create_completion(prompt, max_tokens=8, temperature=0)["choices"][0]["text"]
    assert text == cold_text(tiny_chat, prompt)
    if kind == "disk":  # the other model's entry stays for it
        assert cached in LlamaDiskCache(tmp_path / "cache", 64 << 20)


def test_a_truncated_entry_is_a_miss_and_deleted(tiny_chat: Path, tmp_path: Path) -> None:
    llm = tiny_llama(tiny_chat)
    llm.set_cache(LlamaDiskCache(tmp_path, 64 << 20))
    llm.create_completion(PROMPT, max_tokens=8, temperature=0)
    cached = llm.save_state().input_ids
    [entry] = tmp_path.iterdir()
    entry.write_bytes(entry.read_bytes()[:1000])
    llm = tiny_llama(tiny_chat)
    llm.set_cache(LlamaDiskCache(tmp_path, 64 << 20))
    prompt = [*cached, *llm.tokenize(b" and", add_bos=False)]
    with pytest.warns(RuntimeWarning, match="truncated"):
        text = llm.create_completion(prompt, max_tokens=8, temperature=0)["choices"][0]["text"]
    assert text == cold_text(tiny_chat, prompt)
    assert entry.name not in [path.name for path in tmp_path.iterdir()]


def test_the_disk_cache_never_counts_reads_or_deletes_files_it_did_not_write(tiny_chat: Path, tmp_path: Path) -> None:
    llm = tiny_llama(tiny_chat)
    llm.create_completion(PROMPT, max_tokens=4, temperature=0)
    size = llm.save_state().llama_state_size
    mine = {"my_session.ckpt": llm.save_state().llama_state, "notes.txt": b"mine", "0" * 64 + ".ckpt": b"x"}
    for name, data in mine.items():
        (tmp_path / name).write_bytes(data)
    cache = LlamaDiskCache(tmp_path, capacity_bytes=size + size // 2)  # room for one entry of its own
    assert cache.cache_size == 0
    llm.set_cache(cache)
    for prompt in ("one", "two", "three"):
        llm.create_completion(prompt, max_tokens=4, temperature=0)
    assert {name: (tmp_path / name).read_bytes() for name in mine} == mine
    entries = [path.stat().st_size for path in tmp_path.iterdir() if path.name not in mine]
    assert 0 < cache.cache_size == sum(entries) <= cache.capacity_bytes


def test_an_empty_state_before_any_call_loads_as_nothing(tiny_chat: Path) -> None:
    llm = tiny_llama(tiny_chat)
    state = llm.save_state()
    assert state == LlamaState((), b"") and state.n_tokens == 0
    llm.load_state(state)
    with pytest.raises(TypeError):
        llm.load_state(b"bytes")  # type: ignore[arg-type]


# --- the constructor and the methods


def test_llama_cpp_pythons_constructor_parameters_are_accepted_as_documented(tiny_chat: Path) -> None:
    llm = tiny_llama(
        tiny_chat, logits_all=True, n_ubatch=128, n_threads_batch=2, use_mlock=True, flash_attn=True, rope_freq_base=0.0
    )
    assert llm.create_completion(PROMPT, max_tokens=2, temperature=0)["choices"][0]["text"] is not None
    with pytest.raises(UnsupportedParameterError, match="rope_freq_base"):
        tiny_llama(tiny_chat, rope_freq_base=10000.0)
    with pytest.raises(UnsupportedParameterError, match="mode='ngram'"):
        tiny_llama(tiny_chat, draft_model=object())
    with pytest.raises(TypeError, match="'n_gqa'"):
        tiny_llama(tiny_chat, n_gqa=8)
    parameters = inspect.signature(Llama).parameters
    assert set(WITHOUT_EFFECT) | set(ACCEPTED_AT) <= set(parameters) and parameters["use_mlock"].default is False


def test_llama_cpp_pythons_helpers(tiny_chat: Path) -> None:
    llm = tiny_llama(tiny_chat)
    assert llm.token_eos() == models.EOS_ID and llm.token_bos() == models.BOS_ID
    assert llm.n_vocab() == models.N_VOCAB and llm.n_embd() > 0 and llm.n_ctx() == N_CTX
    assert "general.architecture" in llm.metadata
    tokenizer = llm.tokenizer()
    assert tokenizer.decode(tokenizer.encode("hello", add_bos=False)) == "hello"
    llm.set_seed(3)
    sampled = [llm.create_completion(PROMPT, max_tokens=6)["choices"][0]["text"] for _ in range(2)]
    assert sampled[0] == sampled[1]  # the same seed each call
    with Llama(str(tiny_chat), n_ctx=N_CTX, n_threads=1) as scoped:
        scoped.create_completion(PROMPT, max_tokens=1)
    assert scoped.save_state().n_tokens == 0  # closed
    with pytest.raises(UnsupportedParameterError, match="hub"):
        Llama.from_pretrained("org/model", "model.gguf")
    assert specstate.UnsupportedParameterError is UnsupportedParameterError


def test_detokenize_takes_prev_tokens_as_llama_cpp_python_does(smollm2_file: Path) -> None:
    llm = tiny_llama(smollm2_file)
    tokens = llm.tokenize("Grüße, 東京 — naïve café ☕".encode(), add_bos=False)
    whole = llm.detokenize(tokens)
    for cut in range(len(tokens) + 1):  # the bytes the tokens after the cut add to those before it
        before, after = tokens[:cut], tokens[cut:]
        expected = whole[len(llm.detokenize(before)) :]
        assert llm.detokenize(after, prev_tokens=before) == expected
        assert llm.tokenizer().detokenize(after, prev_tokens=before) == expected
    assert llm.detokenize(tokens, None, True) == whole  # llama-cpp-python's order: tokens, prev_tokens, special
    with pytest.raises(TypeError, match="prev_tokens"):
        llm.detokenize(tokens, prev_tokens=7)  # type: ignore[arg-type]


def test_help_shows_every_parameter_with_its_default() -> None:
    chat = inspect.signature(Llama.create_chat_completion).parameters
    assert chat["temperature"].default == 0.2 and chat["top_k"].default == 40 and chat["max_tokens"].default is None
    completion = inspect.signature(Llama.create_completion).parameters
    assert completion["temperature"].default == 0.8 and completion["max_tokens"].default == 16
    assert "echo" in inspect.signature(Llama.__call__).parameters


# --- the small ones


def test_logit_bias_keys_may_be_decimal_strings(tiny_chat: Path) -> None:
    llm = tiny_llama(tiny_chat)
    plain = llm.create_completion(PROMPT, max_tokens=1, temperature=0)["choices"][0]["text"]
    first = llm.tokenize(plain.encode(), add_bos=False)[0]
    biased = llm.create_completion(PROMPT, max_tokens=1, temperature=0, logit_bias={str(first): -100.0})
    assert biased["choices"][0]["text"] != plain
    with pytest.raises(ValueError, match="'x1'"):
        llm.create_completion(PROMPT, max_tokens=1, logit_bias={"x1": 1.0})


def test_completion_tokens_leave_out_the_end_of_generation_token(tiny_chat: Path) -> None:
    llm = tiny_llama(tiny_chat)
    ends = {str(models.EOS_ID): 100.0}  # the tiny model never ends on its own: bias its end-of-generation token
    result = llm.create_chat_completion(
        [{"role": "user", "content": "Hi"}], max_tokens=20, temperature=0, logit_bias=ends
    )
    generator = llm.chat_generator
    assert generator is not None and result["choices"][0]["finish_reason"] == "stop"
    assert llm.model.is_eog(generator.tokens[-1])
    assert result["usage"]["completion_tokens"] == len(generator.tokens) - 1


def test_a_prompt_over_the_context_says_so_in_llama_cpp_pythons_words(tiny_chat: Path) -> None:
    llm = tiny_llama(tiny_chat)
    with pytest.raises(ValueError, match=r"Requested tokens \(\d+\) exceed context window of 256"):
        llm.create_completion([65] * 300, max_tokens=1)


# --- embeddings


def test_embeddings_through_llama_as_llama_cpp_python_gives_them(tiny_chat: Path) -> None:
    llm = tiny_llama(tiny_chat, embedding=True, pooling_type=1)  # mean
    one = llm.embed("hello world")
    assert isinstance(one, list) and len(one) == llm.n_embd() and all(isinstance(x, float) for x in one)
    reply = llm.create_embedding(["hello world", "goodbye"], model="mine")
    assert [entry["index"] for entry in reply["data"]] == [0, 1] and reply["model"] == "mine"
    assert reply["data"][0]["embedding"] == one and reply["usage"]["prompt_tokens"] > 0
    with pytest.raises(RuntimeError, match="embedding=True"):
        tiny_llama(tiny_chat).embed("x")
    with pytest.raises(UnsupportedParameterError, match="pooling_type"):
        tiny_llama(tiny_chat, embedding=True, pooling_type=4)


def test_llama_cpp_pythons_pooling_constants_choose_the_pooling(tiny_chat: Path) -> None:
    import specstate.llama as llama_cpp  # where ported code finds llama_cpp's module-level names

    numbers = {
        "UNSPECIFIED": llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED,
        "NONE": llama_cpp.LLAMA_POOLING_TYPE_NONE,
        "MEAN": llama_cpp.LLAMA_POOLING_TYPE_MEAN,
        "CLS": llama_cpp.LLAMA_POOLING_TYPE_CLS,
        "LAST": llama_cpp.LLAMA_POOLING_TYPE_LAST,
        "RANK": llama_cpp.LLAMA_POOLING_TYPE_RANK,
    }
    assert numbers == {"UNSPECIFIED": -1, "NONE": 0, "MEAN": 1, "CLS": 2, "LAST": 3, "RANK": 4}  # llama.cpp's
    model = Model(tiny_chat)
    for name in EMBEDDING_POOLINGS:
        llm = tiny_llama(tiny_chat, embedding=True, pooling_type=numbers[name.upper()])
        assert llm.embed("hello world") == Embedder(model, n_ctx=N_CTX, pooling=name, n_threads=1).embed("hello world")
    with pytest.raises(UnsupportedParameterError, match="LLAMA_POOLING_TYPE"):
        tiny_llama(tiny_chat, embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_RANK)


def test_a_conversation_continued_from_its_cache_equals_the_same_turns_decoded_fresh(smollm2_file: Path) -> None:
    """By default prompts are decoded in exact chunks, so a reply is a function of the request alone: the third
    turn of a chat continued on the `Llama` that holds the first two equals the same turns sent whole to a fresh
    one. On SmolLM2 requantized to Q4_0, whose batches of more than 17 rows take ggml's repacked gemm, whose bits
    depend on how a prompt is chunked."""
    from gguf import GGMLQuantizationType

    from specstate.smollm2 import cache_dir
    from specstate_testkit.requantize import cached_copy

    path = cached_copy(smollm2_file, GGMLQuantizationType.Q4_0, cache_dir() / "requantized")
    questions = ["Name three rivers of Europe.", "Which one is the longest?", "Write two sentences about it."]
    held = Llama(str(path), n_ctx=1024, n_threads=2, verbose=False)
    history: list[dict[str, str]] = []
    for question in questions:
        history.append({"role": "user", "content": question})
        reply = held.create_chat_completion(history, max_tokens=24, temperature=0)
        history.append({"role": "assistant", "content": reply["choices"][0]["message"]["content"] or ""})
    fresh = Llama(str(path), n_ctx=1024, n_threads=2, verbose=False)
    again = fresh.create_chat_completion(history[:-1], max_tokens=24, temperature=0)
    assert again["choices"][0]["message"]["content"] == history[-1]["content"]
