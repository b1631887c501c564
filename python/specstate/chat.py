"""Chat templates: a conversation rendered as llama.cpp renders it.

The template is the model's own (``tokenizer.chat_template`` in the GGUF),
or one given in its place, rendered by llama.cpp's Jinja engine
(``common_chat_templates_apply``). Template text is tokenized with special
tokens parsed; message text is read literally, so a message that contains
``<|im_start|>`` cannot forge a role.

A conversation is a generation that pauses for the user:
:meth:`specstate.Generator.chat` starts one and takes each next turn, and a
generation restored from a checkpoint takes its next turn decoding only the
new turn's tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Union

from specstate import _native
from specstate._native import Model
from specstate._typing import Message
from specstate.errors import ChatTemplateError

__all__ = ["Message", "Messages", "chat_template", "render_chat"]

Messages = Union[str, Sequence[Union[Message, Mapping[str, str]]]]
"""Messages as ``[{"role": ..., "content": ...}, ...]``; a string is one user message."""


def as_pairs(messages: Messages) -> list[tuple[str, str]]:
    """``(role, content)`` pairs of ``messages``, each checked."""
    if isinstance(messages, str):
        return [("user", messages)]
    pairs = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or set(message) != {"role", "content"}:
            raise ValueError(f"message {index}: expected a mapping with exactly 'role' and 'content'")
        role, content = message["role"], message["content"]
        if not isinstance(role, str) or not isinstance(content, str):
            raise ValueError(f"message {index}: 'role' and 'content' must be strings")
        pairs.append((role, content))
    if not pairs:
        raise ValueError("no messages")
    return pairs


def as_messages(pairs: Sequence[tuple[str, str]]) -> list[Message]:
    """``pairs`` as message dictionaries."""
    return [{"role": role, "content": content} for role, content in pairs]


def chat_template(model: Model, template: str | None = None) -> _native.ChatTemplate:
    """The chat template to use with ``model``: ``template`` (Jinja source, or
    ``"chatml"`` for llama.cpp's ChatML) or else the model's own.

    Raises :class:`~specstate.errors.ChatTemplateError` when the model has no
    template and none is given, or when the template does not parse.
    """
    if template is None and model.chat_template is None:
        raise ChatTemplateError(
            'the model has no chat template (tokenizer.chat_template); pass template=... ("chatml" for ChatML)'
        )
    return _native.ChatTemplate(model, template)


def template_sha256(template: _native.ChatTemplate) -> str:
    """The fingerprint of a template's source, recorded with a conversation."""
    return hashlib.sha256(template.source.encode()).hexdigest()


def render_chat(
    model: Model, messages: Messages, *, add_generation_prompt: bool = True, template: str | None = None
) -> str:
    """The text ``messages`` render to with the chat template (see :func:`chat_template`);
    ``add_generation_prompt`` opens the assistant's turn."""
    return chat_template(model, template).render(as_pairs(messages), add_generation_prompt=add_generation_prompt)
