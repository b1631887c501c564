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
    Llama as Llama,
)
from specstate.llama.options import (
    CHAT_TEMPERATURE as CHAT_TEMPERATURE,
)
from specstate.llama.options import (
    COMPLETION_MAX_TOKENS as COMPLETION_MAX_TOKENS,
)
from specstate.llama.options import (
    COMPLETION_TEMPERATURE as COMPLETION_TEMPERATURE,
)
from specstate.llama.options import (
    LAST_N_TOKENS_SIZE as LAST_N_TOKENS_SIZE,
)
from specstate.llama.options import (
    LLAMA_DEFAULT_SEED as LLAMA_DEFAULT_SEED,
)
from specstate.llama.options import (
    MIN_P as MIN_P,
)
from specstate.llama.options import (
    N_BATCH as N_BATCH,
)
from specstate.llama.options import (
    N_CTX as N_CTX,
)
from specstate.llama.options import (
    N_DRAFT as N_DRAFT,
)
from specstate.llama.options import (
    NEUTRAL as NEUTRAL,
)
from specstate.llama.options import (
    TOP_K as TOP_K,
)
from specstate.llama.options import (
    TOP_P as TOP_P,
)
from specstate.llama.options import (
    CallSettings as CallSettings,
)
from specstate.llama.options import (
    ChatCompletionOptions as ChatCompletionOptions,
)
from specstate.llama.options import (
    CompletionOptions as CompletionOptions,
)
from specstate.llama.options import (
    LlamaGrammar as LlamaGrammar,
)
from specstate.llama.options import (
    UnsupportedParameterError as UnsupportedParameterError,
)
from specstate.llama.options import (
    call_settings as call_settings,
)
from specstate.llama.options import (
    chat_pairs as chat_pairs,
)
from specstate.llama.results import (
    ChatStream as ChatStream,
)
from specstate.llama.results import (
    CompletionStream as CompletionStream,
)
from specstate.llama.results import (
    ParkedChat as ParkedChat,
)
from specstate.llama.results import (
    joined_completion as joined_completion,
)
from specstate.llama.types import (
    ChatCompletion as ChatCompletion,
)
from specstate.llama.types import (
    ChatCompletionChoice as ChatCompletionChoice,
)
from specstate.llama.types import (
    ChatCompletionChunk as ChatCompletionChunk,
)
from specstate.llama.types import (
    ChatCompletionChunkChoice as ChatCompletionChunkChoice,
)
from specstate.llama.types import (
    ChatCompletionDelta as ChatCompletionDelta,
)
from specstate.llama.types import (
    ChatCompletionLogprobs as ChatCompletionLogprobs,
)
from specstate.llama.types import (
    ChatCompletionMessage as ChatCompletionMessage,
)
from specstate.llama.types import (
    ChatCompletionTokenLogprob as ChatCompletionTokenLogprob,
)
from specstate.llama.types import (
    Completion as Completion,
)
from specstate.llama.types import (
    CompletionChoice as CompletionChoice,
)
from specstate.llama.types import (
    CompletionChunk as CompletionChunk,
)
from specstate.llama.types import (
    CompletionLogprobs as CompletionLogprobs,
)
from specstate.llama.types import (
    CompletionUsage as CompletionUsage,
)
from specstate.llama.types import (
    FinishReason as FinishReason,
)
from specstate.llama.types import (
    TopLogprob as TopLogprob,
)

__all__ = [
    "CHAT_TEMPERATURE",
    "COMPLETION_MAX_TOKENS",
    "COMPLETION_TEMPERATURE",
    "LAST_N_TOKENS_SIZE",
    "LLAMA_DEFAULT_SEED",
    "MIN_P",
    "NEUTRAL",
    "N_BATCH",
    "N_CTX",
    "N_DRAFT",
    "TOP_K",
    "TOP_P",
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
    "LlamaGrammar",
    "ParkedChat",
    "TopLogprob",
    "UnsupportedParameterError",
    "call_settings",
    "chat_pairs",
    "joined_completion",
]
