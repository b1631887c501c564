"""llama-cpp-python's ``Llama`` API over specstate: change the import and the constructor, keep the calls.

::

    from specstate import Llama  # was: from llama_cpp import Llama

    llm = Llama("model.gguf", n_ctx=4096, mode="ngram")  # mode, draft_model_path, n_draft: specstate's own
    out = llm("Q: Name the planets. A:", max_tokens=32, stop=["Q:"])
    print(out["choices"][0]["text"])
    reply = llm.create_chat_completion(messages=[{"role": "user", "content": "Hi"}])
    print(reply["choices"][0]["message"]["content"])

:meth:`Llama.create_completion` (and calling the object), and
:meth:`Llama.create_chat_completion` take llama-cpp-python's arguments and
return the OpenAI-shaped dictionaries it returns (:class:`Completion`,
:class:`ChatCompletion`, and with ``stream=True`` iterators of
:class:`CompletionChunk` or :class:`ChatCompletionChunk`). Every call runs on
a :class:`~specstate.Generator`, in the speculative mode chosen at
construction, so its output follows the exactness contract of
:mod:`specstate.generator`.

The package, a module a concern: :mod:`~specstate.llama.types` (the results' shapes, llama-cpp-python's
``llama_types``), :mod:`~specstate.llama.options` (the calls' keyword arguments, defaults and checks),
:mod:`~specstate.llama.results` (runs, chunks, streams, stop strings) and :mod:`~specstate.llama.api`
(:class:`Llama`).
"""

from __future__ import annotations

from specstate.llama.api import (
    Llama,
    LlamaTokenizer,
)
from specstate.llama.compat import (
    ACCEPTED_AT,
    LLAMA_POOLING_TYPE_CLS,
    LLAMA_POOLING_TYPE_LAST,
    LLAMA_POOLING_TYPE_MEAN,
    LLAMA_POOLING_TYPE_NONE,
    LLAMA_POOLING_TYPE_RANK,
    LLAMA_POOLING_TYPE_UNSPECIFIED,
    WITHOUT_EFFECT,
)
from specstate.llama.options import (
    CHAT_TEMPERATURE,
    COMPLETION_MAX_TOKENS,
    COMPLETION_TEMPERATURE,
    LAST_N_TOKENS_SIZE,
    LLAMA_DEFAULT_SEED,
    MIN_P,
    N_BATCH,
    N_CTX,
    N_DRAFT,
    NEUTRAL,
    TOP_K,
    TOP_P,
    CallSettings,
    ChatCompletionOptions,
    ChatInput,
    CompletionOptions,
    LlamaGrammar,
    UnsupportedParameterError,
    call_settings,
    chat_pairs,
    read_chat,
)
from specstate.llama.results import (
    ChatStream,
    CompletionStream,
    ParkedChat,
    joined_completion,
)
from specstate.llama.state import (
    BaseLlamaCache,
    LlamaCache,
    LlamaDiskCache,
    LlamaRAMCache,
    LlamaState,
)
from specstate.llama.types import (
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChatCompletionChunkChoice,
    ChatCompletionDelta,
    ChatCompletionLogprobs,
    ChatCompletionMessage,
    ChatCompletionTokenLogprob,
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionUsage,
    FinishReason,
    TopLogprob,
)

__all__ = [
    "ACCEPTED_AT",
    "CHAT_TEMPERATURE",
    "COMPLETION_MAX_TOKENS",
    "COMPLETION_TEMPERATURE",
    "LAST_N_TOKENS_SIZE",
    "LLAMA_DEFAULT_SEED",
    "LLAMA_POOLING_TYPE_CLS",
    "LLAMA_POOLING_TYPE_LAST",
    "LLAMA_POOLING_TYPE_MEAN",
    "LLAMA_POOLING_TYPE_NONE",
    "LLAMA_POOLING_TYPE_RANK",
    "LLAMA_POOLING_TYPE_UNSPECIFIED",
    "MIN_P",
    "NEUTRAL",
    "N_BATCH",
    "N_CTX",
    "N_DRAFT",
    "TOP_K",
    "TOP_P",
    "WITHOUT_EFFECT",
    "BaseLlamaCache",
    "CallSettings",
    "ChatCompletion",
    "ChatCompletionChoice",
    "ChatCompletionChunk",
    "ChatCompletionChunkChoice",
    "ChatCompletionDelta",
    "ChatCompletionLogprobs",
    "ChatCompletionMessage",
    "ChatCompletionOptions",
    "ChatCompletionTokenLogprob",
    "ChatInput",
    "ChatStream",
    "Completion",
    "CompletionChoice",
    "CompletionChunk",
    "CompletionLogprobs",
    "CompletionOptions",
    "CompletionStream",
    "CompletionUsage",
    "FinishReason",
    "Llama",
    "LlamaCache",
    "LlamaDiskCache",
    "LlamaGrammar",
    "LlamaRAMCache",
    "LlamaState",
    "LlamaTokenizer",
    "ParkedChat",
    "TopLogprob",
    "UnsupportedParameterError",
    "call_settings",
    "chat_pairs",
    "joined_completion",
    "read_chat",
]
