"""llama-cpp-python's constructor parameters that specstate accepts for ported code: those without effect
here (and why), and those accepted only at the value that leaves the model as it is. One table each; the
:class:`~specstate.Llama` constructor takes them as keyword arguments and refuses any other name."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypedDict

from specstate.llama.options import UnsupportedParameterError

__all__ = [
    "ACCEPTED_AT",
    "LLAMA_POOLING_TYPE_CLS",
    "LLAMA_POOLING_TYPE_LAST",
    "LLAMA_POOLING_TYPE_MEAN",
    "LLAMA_POOLING_TYPE_NONE",
    "LLAMA_POOLING_TYPE_RANK",
    "LLAMA_POOLING_TYPE_UNSPECIFIED",
    "WITHOUT_EFFECT",
    "LlamaCppOptions",
    "check_llama_cpp_options",
    "keyword_signature",
]

# llama.cpp's pooling types by number, as llama-cpp-python exports them (``llama_cpp.LLAMA_POOLING_TYPE_*``), for
# ``Llama(pooling_type=...)``.
#: The model's own pooling.
LLAMA_POOLING_TYPE_UNSPECIFIED = -1
#: No pooling: one vector per token.
LLAMA_POOLING_TYPE_NONE = 0
#: The mean of the tokens' vectors.
LLAMA_POOLING_TYPE_MEAN = 1
#: The first token's vector.
LLAMA_POOLING_TYPE_CLS = 2
#: The last token's vector.
LLAMA_POOLING_TYPE_LAST = 3
#: A reranker's score (not supported: ``Llama`` refuses it).
LLAMA_POOLING_TYPE_RANK = 4

#: Accepted with any value, and without effect, with the reason.
WITHOUT_EFFECT: dict[str, str] = {
    "n_ubatch": "specstate decodes in batches of n_batch rows",
    "n_threads_batch": "one thread count (n_threads) decodes prompts and tokens alike",
    "logits_all": "log-probabilities are computed when a call asks for them",
    "flash_attn": "specstate always uses llama.cpp's flash attention: its exactness patch is written for it",
    "use_mlock": "the weights are read into memory (use_mmap=False) unless mapped",
    "offload_kqv": "CPU first: a GPU build offloads as llama.cpp does by default",
    "op_offload": "CPU first: a GPU build offloads as llama.cpp does by default",
    "no_perf": "specstate keeps no llama.cpp performance counters",
    "numa": "llama.cpp's NUMA placement is not set up by specstate",
    "split_mode": "one device: a multi-GPU split is not offered",
    "main_gpu": "one device: a multi-GPU split is not offered",
}
#: Accepted only at these values (llama-cpp-python's defaults, which leave the model as it is); any other value
#: raises UnsupportedParameterError: honouring it would change what the model computes, and ignoring it would
#: change the output without a word.
ACCEPTED_AT: dict[str, tuple[object, ...]] = {
    "vocab_only": (False,),
    "tensor_split": (None,),
    "kv_overrides": (None,),
    "rope_scaling_type": (None, -1),
    "attention_type": (-1,),
    "rope_freq_base": (0.0,),
    "rope_freq_scale": (0.0,),
    "yarn_ext_factor": (-1.0,),
    "yarn_attn_factor": (1.0,),
    "yarn_beta_fast": (32.0,),
    "yarn_beta_slow": (1.0,),
    "yarn_orig_ctx": (0,),
    "swa_full": (None,),
    "lora_base": (None,),
    "lora_scale": (1.0,),
    "lora_path": (None,),
    "chat_handler": (None,),
    "draft_model": (None,),
    "tokenizer": (None,),
    "type_k": (None,),
    "type_v": (None,),
    "spm_infill": (False,),
}


class LlamaCppOptions(TypedDict, total=False):
    """llama-cpp-python constructor parameters accepted for ported code (:data:`WITHOUT_EFFECT`,
    :data:`ACCEPTED_AT`)."""

    n_ubatch: int
    n_threads_batch: int | None
    logits_all: bool
    flash_attn: bool
    use_mlock: bool
    offload_kqv: bool
    op_offload: bool | None
    no_perf: bool
    numa: bool | int
    split_mode: int
    main_gpu: int
    vocab_only: bool
    tensor_split: list[float] | None
    kv_overrides: dict[str, bool | int | float | str] | None
    rope_scaling_type: int | None
    attention_type: int
    rope_freq_base: float
    rope_freq_scale: float
    yarn_ext_factor: float
    yarn_attn_factor: float
    yarn_beta_fast: float
    yarn_beta_slow: float
    yarn_orig_ctx: int
    swa_full: bool | None
    lora_base: str | None
    lora_scale: float
    lora_path: str | None
    chat_handler: object
    draft_model: object
    tokenizer: object
    type_k: int | None
    type_v: int | None
    spm_infill: bool


#: The value each compatibility parameter has when it is not given (llama-cpp-python's defaults).
LLAMA_CPP_DEFAULTS: dict[str, object] = {
    "n_ubatch": 512,
    "n_threads_batch": None,
    "logits_all": False,
    "flash_attn": False,
    "use_mlock": False,
    "offload_kqv": True,
    "op_offload": None,
    "no_perf": False,
    "numa": False,
    "split_mode": 1,
    "main_gpu": 0,
    **{name: values[0] for name, values in ACCEPTED_AT.items()},
}


def _same(value: object, accepted: object) -> bool:
    if isinstance(value, float) and isinstance(accepted, float) and math.isnan(value):
        return False
    return isinstance(value, bool) == isinstance(accepted, bool) and value == accepted


def check_llama_cpp_options(options: Mapping[str, object]) -> None:
    """Refuse an unknown keyword (TypeError naming it) and a parameter of :data:`ACCEPTED_AT` at another value
    (:class:`UnsupportedParameterError`)."""
    for name, value in options.items():
        if name in WITHOUT_EFFECT:
            continue
        accepted = ACCEPTED_AT.get(name)
        if accepted is None:
            raise TypeError(f"Llama() got an unexpected keyword argument {name!r}")
        if not any(_same(value, choice) for choice in accepted):
            hint = " (specstate's own: mode='draft' with draft_model_path, or mode='ngram')" * (name == "draft_model")
            raise UnsupportedParameterError(
                f"{name}={value!r} is not supported: specstate accepts only {name}="
                + " or ".join(repr(choice) for choice in accepted)
                + hint
            )


def keyword_signature(
    function: Callable[..., Any], options: type, defaults: Mapping[str, object], last: Collection[str] = ()
) -> inspect.Signature:
    """``function``'s signature with its ``**options`` spelled out as keyword parameters (``options``, a
    TypedDict, gives their names and types; ``defaults`` their defaults; ``last``: names put at the end): what
    ``help()`` and ``inspect`` show."""
    signature = inspect.signature(function)
    fixed = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    names = {p.name for p in fixed}
    hints = {name: getattr(hint, "__forward_arg__", hint) for name, hint in options.__annotations__.items()}
    annotations = {  # the parameters that do something first, as the source text of their types
        **{name: hint for name, hint in hints.items() if name not in last},
        **{name: hint for name, hint in hints.items() if name in last},
    }
    extra = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=defaults.get(name), annotation=hint)
        for name, hint in annotations.items()
        if name not in names
    ]
    return signature.replace(parameters=[*fixed, *extra])
