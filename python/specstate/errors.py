"""Typed exceptions of specstate.

Each class of the :class:`SpeculativeStateError` family mirrors one variant of
the contract's ``SpeculativeStateError`` enum: its fields are attributes, it can be
built from them as keyword arguments, its ``str()`` is the contract's ``Display``
text (the message template written once, in Rust, read from
``specstate._native.SPECULATIVE_STATE_MESSAGES``), and it pickles.
:class:`ModelLoadError`, :class:`ModelChangedError` and :class:`DecodeError`
format their messages the same way, from ``specstate._native.NATIVE_MESSAGES``.
:class:`ConfigError` and :class:`CapacityError` carry the contract validators'
messages and are :class:`ValueError` subclasses.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "AllocationLimitError",
    "BadSequenceError",
    "BufferTooSmallError",
    "CapacityError",
    "ChatTemplateError",
    "CheckpointError",
    "CheckpointTooLargeError",
    "ChecksumMismatchError",
    "ConfigError",
    "ConfigMismatchError",
    "ContextError",
    "CorruptCheckpointError",
    "DecodeError",
    "ExcessiveStateError",
    "GenerationError",
    "InvalidStateError",
    "ModelChangedError",
    "ModelLoadError",
    "ModelMismatchError",
    "NativeExceptionError",
    "NotACheckpointError",
    "NotARegularFileError",
    "NotQuiescentError",
    "NullStateError",
    "SectionTooLargeError",
    "SequenceStateError",
    "SessionError",
    "SpeculativeStateError",
    "StateOverflowError",
    "StateSizeChangedError",
    "StateUnavailableError",
    "ThreadAffinityError",
    "TruncatedCheckpointError",
    "UnknownStatusError",
    "UnsupportedVersionError",
]


class ConfigError(ValueError):
    """A speculative configuration failed the contract's ``validate_config``.

    ``str()`` is the contract's message for the first failing check.
    """


class CapacityError(ValueError):
    """Target or draft context capacities cannot hold a speculative batch.

    ``str()`` is the contract's ``validate_context_capacities`` message.
    """


def _message(variant: str, *, native: bool = False) -> str:
    """The message template (``{field}`` placeholders) of the contract enum's ``variant``, or with ``native`` of the
    native error's, as the native core writes it."""
    from specstate import _native  # imported here: the native module's initialisation imports this one

    return (_native.NATIVE_MESSAGES if native else _native.SPECULATIVE_STATE_MESSAGES)[variant]


class ModelLoadError(OSError):
    """A model file is missing, unreadable, not GGUF, or refused by llama.cpp.

    Attributes:
        path: the path as given.
        reason: why it could not be loaded.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason

    def __str__(self) -> str:
        return _message("ModelLoad", native=True).format(path=self.path, reason=self.reason)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.reason))


class ModelChangedError(OSError):
    """The file of a model loaded with ``use_mmap=True`` was written after it was loaded.

    llama.cpp computes from the mapping, so the model's weights may no longer
    be the bytes its fingerprint names: no checkpoint is written (or restored)
    with it. Load the model again.

    Attributes:
        path: the path the model was loaded from.
        change: what changed (size, modification or status-change time).
    """

    def __init__(self, path: str, change: str) -> None:
        super().__init__(path, change)
        self.path = path
        self.change = change

    def __str__(self) -> str:
        return _message("ModelChanged", native=True).format(path=self.path, change=self.change)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.change))


class NotARegularFileError(OSError):
    """A checkpoint path that exists but is not a regular file (after symbolic links).

    Raised, naming the path, by :meth:`~specstate.Generator.save` for a
    destination that is a FIFO, a device (``/dev/null``, ``/dev/full``) or a
    socket, which is never replaced, and by reading a checkpoint from such a
    path, which never blocks on it. A directory is an :class:`IsADirectoryError`.

    Attributes:
        path: the path as named (for a save, with symbolic links resolved).
        kind: what it is instead: ``"a FIFO"``, ``"a character device"``,
            ``"a block device"``, ``"a socket"``.
    """

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(path, kind)
        self.path = path
        self.kind = kind

    def __str__(self) -> str:
        return f"{self.path} is {self.kind}, not a regular file"

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.kind))


class ContextError(RuntimeError):
    """llama.cpp refused to create a context, or contexts do not fit together."""


class DecodeError(RuntimeError):
    """``llama_decode`` failed.

    Attributes:
        status: llama.cpp's return code (1: no memory slot for the batch,
            2: aborted, negative: error).
    """

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status

    def __str__(self) -> str:
        return _message("Decode", native=True).format(status=self.status)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.status,))


class SequenceStateError(ValueError):
    """A context's sequence state could not be read or restored."""


class SessionError(RuntimeError):
    """A speculative session call out of order (e.g. draft while a proposal is pending)."""


class ThreadAffinityError(RuntimeError):
    """A native object was used from a thread other than the one that created it."""


class GenerationError(RuntimeError):
    """A generator call that does not fit its state (e.g. stepping before a prompt)."""


class ChatTemplateError(ValueError):
    """A chat template is missing, does not parse or render, or cannot continue a conversation."""


class CheckpointError(ValueError):
    """A checkpoint was refused. Nothing was restored and nothing was changed.

    Subclasses name the reason; their extra fields are attributes (and pickle).
    """

    def __init__(self, message: str, **fields: object) -> None:
        super().__init__(message)
        for name, value in fields.items():
            setattr(self, name, value)


class NotACheckpointError(CheckpointError):
    """The data does not start with the checkpoint magic."""


class UnsupportedVersionError(CheckpointError):
    """Written in a format version this build cannot read (fields ``found``, ``supported``)."""


class TruncatedCheckpointError(CheckpointError):
    """Fewer bytes than the header declares (fields ``expected``, ``actual``)."""


class ChecksumMismatchError(CheckpointError):
    """The CRC-32 trailer does not match the content (fields ``stored``, ``computed``)."""


class CorruptCheckpointError(CheckpointError):
    """The structure or content is inconsistent though the checksum matched."""


class SectionTooLargeError(CheckpointError):
    """A section exceeds its bound (fields ``section``, ``size``, ``maximum``)."""


class CheckpointTooLargeError(CheckpointError):
    """A checkpoint file longer than any checkpoint can be (fields ``path``, ``size``, ``maximum``).

    ``maximum`` is ``specstate._native.MAX_CHECKPOINT_BYTES``: every section at
    its bound. Reading a file stops one byte past it, so a huge or endless
    file is refused instead of exhausting memory.
    """


class ModelMismatchError(CheckpointError):
    """Taken with a different model file (fields ``role``, ``expected``, ``actual``)."""


class ConfigMismatchError(CheckpointError):
    """Another mode or configuration than the generator's (fields ``field``, ``checkpoint``, ``generator``)."""

    field: str
    checkpoint: str
    generator: str


class AllocationLimitError(ConfigMismatchError):
    """The checkpoint's configuration would make a restore allocate beyond its limits.

    ``field`` ``"n_batch"``: more rows per compute pass (llama.cpp sizes the
    contexts' compute buffers by them) than ``max_n_batch`` allows, 512 by
    default. ``field`` ``"n_draft"``: on a recurrent or hybrid model, one
    rollback snapshot of the recurrent state per drafted token, taking more
    memory than the model's weights (not checked when ``max_n_batch`` is
    given). Checked before any context is created. Fields ``requested`` and
    ``maximum`` (rows, or bytes of snapshots), and, as a
    ``ConfigMismatchError``, ``field``, ``checkpoint`` and ``generator``.
    Pass ``max_n_batch`` (at least the checkpoint's ``n_batch``) to restore it.
    """

    requested: int
    maximum: int


class SpeculativeStateError(Exception):
    """Base of the failures of capturing or restoring speculative state.

    Subclasses mirror the contract enum's variants one to one. The base class
    itself accepts an arbitrary message like any exception.
    """

    _fields: ClassVar[tuple[str, ...]] = ()
    #: The contract enum's variant the class mirrors (its message template is the native core's).
    _variant: ClassVar[str] = ""

    def __str__(self) -> str:
        if not self._variant:
            return super().__str__()
        return _message(self._variant).format(**{name: getattr(self, name) for name in self._fields})

    def __reduce__(self) -> tuple[Any, ...]:
        if not self._variant:
            return (type(self), self.args, self.__dict__ or None)
        return (type(self), tuple(getattr(self, name) for name in self._fields))


class _FieldlessStateError(SpeculativeStateError):
    """A variant without fields: constructed with no arguments."""

    def __init__(self) -> None:
        super().__init__(_message(self._variant))


class NullStateError(_FieldlessStateError):
    """A required native session or output pointer was null."""

    _variant = "Null"


class BadSequenceError(_FieldlessStateError):
    """The sequence id is outside the configured session range."""

    _variant = "BadSequence"


class NotQuiescentError(_FieldlessStateError):
    """A draft proposal has not yet been completed with ``accept``."""

    _variant = "NotQuiescent"


class BufferTooSmallError(_FieldlessStateError):
    """Native reported that the supplied buffer was too small without a size."""

    _variant = "BufferTooSmall"


class StateUnavailableError(_FieldlessStateError):
    """The active native implementation did not expose complete state."""

    _variant = "Unavailable"


class InvalidStateError(_FieldlessStateError):
    """The supplied state failed its exact version/configuration checks."""

    _variant = "Invalid"


class StateOverflowError(_FieldlessStateError):
    """Native state size arithmetic overflowed."""

    _variant = "Overflow"


class NativeExceptionError(_FieldlessStateError):
    """A C++ exception was contained by the speculative-state shim."""

    _variant = "Exception"


class StateSizeChangedError(SpeculativeStateError):
    """Native state changed size between the size and copy calls.

    Attributes:
        expected: size returned by the initial query, in bytes.
        actual: size required or written by the copy call, in bytes.
    """

    _fields = ("expected", "actual")
    _variant = "SizeChanged"

    def __init__(self, expected: int, actual: int) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(expected, actual)


class ExcessiveStateError(SpeculativeStateError):
    """State exceeded the safe allocation/input bound.

    Attributes:
        size: requested or supplied byte count.
        maximum: inclusive safe bound, in bytes.
    """

    _fields = ("size", "maximum")
    _variant = "Excessive"

    def __init__(self, size: int, maximum: int) -> None:
        self.size = size
        self.maximum = maximum
        super().__init__(size, maximum)


class UnknownStatusError(SpeculativeStateError):
    """Native returned a status unknown to this binding revision.

    Attributes:
        status: the raw status value.
    """

    _fields = ("status",)
    _variant = "Unknown"

    def __init__(self, status: int) -> None:
        self.status = status
        super().__init__(status)
