"""The speculative-session contract as Python sees it: bounds, validators, errors, build info.

Validators are tested differentially against ``contract_model``, an independent
pure-Python model of the speculative-session contract (``src/speculative.rs``; given as
``../shared/seed/speculative.rs``, outside this repository), over
hypothesis-generated inputs, plus explicit boundaries.
"""

from __future__ import annotations

import contextlib
import math
import pickle
import platform
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import contract_model as model
import specstate
from specstate import (
    CapacityError,
    ConfigError,
    ContextCapacity,
    ExcessiveStateError,
    SpeculativeStateError,
    _native,
)
from specstate import errors as errors_module
from specstate import strategies as sst

ROOT = Path(__file__).resolve().parents[2]

# Integers concentrated on the interesting edges, but reaching far beyond 64 bits.
EDGES = [
    0,
    1,
    -1,
    2,
    3,
    4095,
    4096,
    4097,
    2**31 - 1,
    2**31,
    -(2**31),
    -(2**31) - 1,
    2**32 - 1,
    2**32,
    2**40,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63) - 1,
    2**70,
    -(2**70),
    2**200,
]
wide_ints = st.one_of(st.sampled_from(EDGES), st.integers(-5, 5000), st.integers())
F32_ONE_NEXT = float(np.nextafter(np.float32(1.0), np.float32(2.0)))
FLOAT_EDGES = [
    0.0,
    -0.0,
    1.0,
    math.nan,
    math.inf,
    -math.inf,
    -1e-50,
    -1e-30,
    5e-324,
    -5e-324,
    1.0 + 2**-25,
    1.0 + 2**-24,
    1.0 + 2**-24 + 2**-50,
    F32_ONE_NEXT,
    1.0 - 2**-26,
    3.5e38,
    3.4028235e38,
    -3.5e38,
    1e308,
    0.5,
]
probabilities = st.one_of(st.sampled_from(FLOAT_EDGES), st.floats(), wide_ints)


def config_message(*args: Any) -> str | None:
    try:
        specstate.validate_config(*args)
    except ConfigError as error:
        return str(error)
    return None


# --- constants --------------------------------------------------------------------------------------


def test_constants_have_the_seed_values() -> None:
    assert specstate.MAX_SPECULATIVE_STATE_BYTES == model.MAX_STATE_BYTES == 64 * 1024 * 1024
    assert specstate.MAX_SPECULATIVE_SEQUENCES == model.MAX_SEQUENCES
    assert specstate.MAX_SPECULATIVE_DRAFT_TOKENS == model.MAX_DRAFT_TOKENS
    assert specstate.MAX_SPECULATIVE_PROMPT_TOKENS == model.MAX_PROMPT_TOKENS
    assert specstate.MAX_SPECULATIVE_PROMPT_TOKENS * 4 < specstate.MAX_SPECULATIVE_STATE_BYTES


# --- validate_config --------------------------------------------------------------------------------


@given(wide_ints, wide_ints, wide_ints, probabilities)
def test_validate_config_matches_the_model(n_seq: int, n_draft_max: int, n_min: int, p_min: float) -> None:
    assert config_message(n_seq, n_draft_max, n_min, p_min) == model.config_error(n_seq, n_draft_max, n_min, p_min)


@given(st.integers(1, 4096), st.integers(1, 4096), st.data())
def test_validate_config_accepts_every_valid_corner(n_seq: int, n_draft_max: int, data: st.DataObject) -> None:
    n_min = data.draw(st.integers(0, n_draft_max))
    p_min = data.draw(st.floats(0.0, 1.0))
    specstate.validate_config(n_seq, n_draft_max, n_min, p_min)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((1, 1, 0, 0.0), None),
        ((4096, 4096, 4096, 1.0), None),
        ((1, 1, 0, -0.0), None),
        ((1, 1, 0, 1), None),
        ((1, 1, 0, 0), None),
        ((1, 1, 0, -1e-50), None),  # rounds to -0.0 in f32
        ((1, 1, 0, 1.0 + 2**-25), None),  # below the half-way point: rounds to 1.0
        ((1, 1, 0, 1.0 + 2**-24), None),  # a tie: rounds to even, 1.0
        ((1, 1, 0, 1.0 + 2**-24 + 2**-50), "p_min must be finite and between zero and one"),
        ((1, 1, 0, F32_ONE_NEXT), "p_min must be finite and between zero and one"),
        ((1, 1, 0, -1e-30), "p_min must be finite and between zero and one"),
        ((1, 1, 0, math.nan), "p_min must be finite and between zero and one"),
        ((1, 1, 0, math.inf), "p_min must be finite and between zero and one"),
        ((1, 1, 0, -math.inf), "p_min must be finite and between zero and one"),
        ((1, 1, 0, 2), "p_min must be finite and between zero and one"),
        ((1, 1, 0, 10**400), "p_min must be finite and between zero and one"),
        ((1, 1, 0, -(10**400)), "p_min must be finite and between zero and one"),
        ((0, 1, 0, 0.0), "n_seq is outside the supported bound"),
        ((-1, 1, 0, 0.0), "n_seq is outside the supported bound"),
        ((2**40, 1, 0, 0.0), "n_seq is outside the supported bound"),
        ((4097, 1, 0, 0.0), "n_seq is outside the supported bound"),
        ((2**32, 1, 0, 0.0), "n_seq is outside the supported bound"),
        ((2**32 + 1, 1, 0, 0.0), "n_seq is outside the supported bound"),
        ((1, 0, 0, 0.0), "n_draft_max is outside the supported bound"),
        ((1, 4097, 0, 0.0), "n_draft_max is outside the supported bound"),
        ((1, 2**31, 0, 0.0), "n_draft_max is outside the supported bound"),
        ((1, -(2**31) - 1, 0, 0.0), "n_draft_max is outside the supported bound"),
        ((1, 2**32 + 1, 0, 0.0), "n_draft_max is outside the supported bound"),
        ((1, 4, 5, 0.0), "n_min must be between zero and n_draft_max"),
        ((1, 4, -1, 0.0), "n_min must be between zero and n_draft_max"),
        ((1, 4, 2**32, 0.0), "n_min must be between zero and n_draft_max"),
        ((1, 4, -(2**32), 0.0), "n_min must be between zero and n_draft_max"),
        ((0, 0, -1, math.nan), "n_seq is outside the supported bound"),
        ((1, 0, -1, math.nan), "n_draft_max is outside the supported bound"),
        ((1, 1, -1, math.nan), "n_min must be between zero and n_draft_max"),
    ],
)
def test_validate_config_boundaries(args: tuple[Any, ...], message: str | None) -> None:
    assert config_message(*args) == message
    assert model.config_error(*args) == message


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"^n_seq is outside the supported bound$"):
        specstate.validate_config(-1, 1, 0, 0.0)


class Index:
    """An object that only supports ``__index__``."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def test_integer_arguments_take_anything_operator_index_accepts() -> None:
    specstate.validate_config(Index(1), np.int64(3), np.uint8(1), np.float64(0.5))
    specstate.validate_config(1, 3, 1, Index(1))
    assert config_message(Index(2**40), 1, 0, 0.0) == "n_seq is outside the supported bound"


@pytest.mark.parametrize("position", range(4))
@pytest.mark.parametrize("bad", [True, False, "1", None, 1.0, [1], b"1", 1j])
def test_wrong_types_are_type_errors(position: int, bad: object) -> None:
    args: list[Any] = [1, 1, 0, 0.0]
    if position == 3 and isinstance(bad, float):
        return  # a float is a valid p_min
    args[position] = bad
    with pytest.raises(TypeError):
        specstate.validate_config(*args)


@given(
    st.lists(
        st.one_of(st.integers(), st.floats(), st.booleans(), st.text(max_size=2), st.none()), min_size=4, max_size=4
    )
)
def test_validate_config_raises_only_config_or_type_errors(args: list[Any]) -> None:
    try:
        specstate.validate_config(*args)
    except (ConfigError, TypeError) as error:
        assert not isinstance(error, OverflowError)


# --- ContextCapacity --------------------------------------------------------------------------------


def test_context_capacity_is_an_immutable_value() -> None:
    capacity = ContextCapacity(4, 2, 3, True)
    assert (capacity.batch, capacity.micro_batch, capacity.recurrent_slots, capacity.recurrent_or_hybrid) == (
        4,
        2,
        3,
        True,
    )
    assert capacity == ContextCapacity(batch=4, micro_batch=2, recurrent_slots=3, recurrent_or_hybrid=True)
    assert capacity != ContextCapacity(4, 2, 3, False)
    assert hash(capacity) == hash(ContextCapacity(4, 2, 3, True))
    assert repr(capacity) == "ContextCapacity(batch=4, micro_batch=2, recurrent_slots=3, recurrent_or_hybrid=True)"
    assert pickle.loads(pickle.dumps(capacity)) == capacity
    with pytest.raises(AttributeError):
        capacity.batch = 5  # type: ignore[misc]


@pytest.mark.parametrize("field", ["batch", "micro_batch", "recurrent_slots"])
@pytest.mark.parametrize("value", [-1, 2**32, 2**64, -(2**70)])
def test_context_capacity_fields_are_u32(field: str, value: int) -> None:
    fields: dict[str, Any] = {"batch": 1, "micro_batch": 1, "recurrent_slots": 1, "recurrent_or_hybrid": False}
    fields[field] = value
    with pytest.raises(ValueError, match=field):
        ContextCapacity(**fields)


def test_context_capacity_field_limits_are_inclusive() -> None:
    assert ContextCapacity(0, 0, 0, False).batch == 0
    assert ContextCapacity(2**32 - 1, 2**32 - 1, 2**32 - 1, True).recurrent_slots == 2**32 - 1


@pytest.mark.parametrize("flag", [1, 0, None, "True", np.bool_(True)])
def test_recurrent_or_hybrid_must_be_a_bool(flag: object) -> None:
    with pytest.raises(TypeError, match="recurrent_or_hybrid"):
        ContextCapacity(1, 1, 1, flag)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [True, 1.0, "1", None])
def test_context_capacity_integer_fields_refuse_non_integers(bad: object) -> None:
    with pytest.raises(TypeError):
        ContextCapacity(bad, 1, 1, False)  # type: ignore[arg-type]


# --- validate_context_capacities --------------------------------------------------------------------

u32s = st.one_of(st.sampled_from([0, 1, 2, 3, 4, 2**32 - 2, 2**32 - 1]), st.integers(0, 64), st.integers(0, 2**32 - 1))


@st.composite
def capacities(draw: st.DrawFn) -> tuple[ContextCapacity, model.Capacity]:
    fields = (draw(u32s), draw(u32s), draw(u32s), draw(st.booleans()))
    return ContextCapacity(*fields), model.Capacity(*fields)


@given(capacities(), capacities(), st.one_of(u32s, st.integers(min_value=0)))
def test_validate_context_capacities_matches_the_model(
    target: tuple[ContextCapacity, model.Capacity], draft: tuple[ContextCapacity, model.Capacity], maximum: int
) -> None:
    try:
        specstate.validate_context_capacities(target[0], draft[0], maximum)
        message = None
    except CapacityError as error:
        message = str(error)
    assert message == model.capacity_error(target[1], draft[1], maximum)


@pytest.mark.parametrize("maximum", [2**32 - 1, 2**32, 2**64, 2**100])
def test_maximum_draft_tokens_beyond_u32_cannot_add_one(maximum: int) -> None:
    big = ContextCapacity(2**32 - 1, 2**32 - 1, 2**32 - 1, False)
    with pytest.raises(CapacityError, match=r"^n_draft_max plus one exceeds u32$"):
        specstate.validate_context_capacities(big, big, maximum)


def test_negative_maximum_draft_tokens_is_a_value_error() -> None:
    capacity = ContextCapacity(4, 4, 4, False)
    with pytest.raises(ValueError, match="maximum_draft_tokens") as caught:
        specstate.validate_context_capacities(capacity, capacity, -1)
    assert not isinstance(caught.value, CapacityError)


def test_capacity_arguments_must_be_context_capacities() -> None:
    capacity = ContextCapacity(4, 4, 4, False)
    with pytest.raises(TypeError):
        specstate.validate_context_capacities((4, 4, 4, False), capacity, 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        specstate.validate_context_capacities(capacity, capacity, True)


def test_capacity_error_is_a_value_error() -> None:
    small = ContextCapacity(3, 3, 3, False)
    with pytest.raises(ValueError, match=r"^target or draft batch capacity is smaller than n_draft_max plus one$"):
        specstate.validate_context_capacities(small, small, 3)


# --- validate_state_size ----------------------------------------------------------------------------


@given(st.one_of(st.sampled_from([*EDGES, model.MAX_STATE_BYTES, model.MAX_STATE_BYTES + 1]), st.integers(min_value=0)))
def test_validate_state_size_matches_the_model(size: int) -> None:
    if size < 0:
        return
    if model.state_size_excessive(size):
        with pytest.raises(ExcessiveStateError) as caught:
            specstate.validate_state_size(size)
        assert (caught.value.size, caught.value.maximum) == (size, model.MAX_STATE_BYTES)
        assert str(caught.value) == model.DISPLAY["Excessive"].format(size, model.MAX_STATE_BYTES)
    else:
        specstate.validate_state_size(size)


def test_state_size_boundaries() -> None:
    specstate.validate_state_size(0)
    specstate.validate_state_size(model.MAX_STATE_BYTES)
    with pytest.raises(ExcessiveStateError):
        specstate.validate_state_size(model.MAX_STATE_BYTES + 1)
    with pytest.raises(ExcessiveStateError) as caught:
        specstate.validate_state_size(2**70)
    assert caught.value.size == 2**70
    assert str(caught.value) == f"speculative state is {2**70} bytes, exceeding the 67108864-byte bound"


@pytest.mark.parametrize("size", [-1, -(2**70)])
def test_negative_state_size_is_a_value_error(size: int) -> None:
    with pytest.raises(ValueError, match="size") as caught:
        specstate.validate_state_size(size)
    assert not isinstance(caught.value, SpeculativeStateError)


@pytest.mark.parametrize("bad", [True, 1.0, "1", None])
def test_state_size_refuses_non_integers(bad: object) -> None:
    with pytest.raises(TypeError):
        specstate.validate_state_size(bad)  # type: ignore[arg-type]


# --- exceptions -------------------------------------------------------------------------------------

VARIANT_CLASSES: dict[str, tuple[type[SpeculativeStateError], tuple[str, ...]]] = {
    "Null": (specstate.NullStateError, ()),
    "BadSequence": (specstate.BadSequenceError, ()),
    "NotQuiescent": (specstate.NotQuiescentError, ()),
    "SizeChanged": (specstate.StateSizeChangedError, ("expected", "actual")),
    "BufferTooSmall": (specstate.BufferTooSmallError, ()),
    "Unavailable": (specstate.StateUnavailableError, ()),
    "Invalid": (specstate.InvalidStateError, ()),
    "Overflow": (specstate.StateOverflowError, ()),
    "Exception": (specstate.NativeExceptionError, ()),
    "Excessive": (specstate.ExcessiveStateError, ("size", "maximum")),
    "Unknown": (specstate.UnknownStatusError, ("status",)),
}


@pytest.mark.parametrize("variant", sorted(VARIANT_CLASSES))
@given(values=st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)))
def test_exceptions_mirror_the_seed_variants(variant: str, values: tuple[int, int]) -> None:
    cls, fields = VARIANT_CLASSES[variant]
    kwargs = dict(zip(fields, values))
    error = cls(**kwargs)
    assert isinstance(error, SpeculativeStateError)
    assert isinstance(error, Exception)
    for name, value in kwargs.items():
        assert getattr(error, name) == value
    expected = model.DISPLAY[variant].format(*values[: len(fields)])
    assert str(error) == expected
    assert str(error) == _native._seed_error_display(variant, *values[: len(fields)])
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is cls
    assert str(clone) == str(error)
    assert {name: getattr(clone, name) for name in fields} == kwargs


def test_every_variant_has_a_public_class() -> None:
    public = {name for name in errors_module.__all__ if issubclass(getattr(errors_module, name), SpeculativeStateError)}
    classes = {cls.__name__ for cls, _ in VARIANT_CLASSES.values()}
    assert classes | {"SpeculativeStateError"} == public
    for name in errors_module.__all__:
        assert getattr(specstate, name) is getattr(errors_module, name)


@pytest.mark.parametrize("status", sorted(model.STATUS_VARIANTS))
def test_native_statuses_raise_their_variant(status: int) -> None:
    cls, _ = VARIANT_CLASSES[model.STATUS_VARIANTS[status]]
    with pytest.raises(cls) as caught:
        _native._raise_for_status(status)
    assert type(caught.value) is cls
    assert str(caught.value) == model.DISPLAY[model.STATUS_VARIANTS[status]]


def test_status_ok_raises_nothing() -> None:
    _native._raise_for_status(0)


@given(st.integers(9, 2**32 - 1))
def test_unknown_statuses_carry_the_status(status: int) -> None:
    with pytest.raises(specstate.UnknownStatusError) as caught:
        _native._raise_for_status(status)
    assert caught.value.status == status
    assert str(caught.value) == f"unknown speculative state status {status}"


def test_value_errors_pickle_with_their_message() -> None:
    for error in (ConfigError("n_seq is outside the supported bound"), CapacityError("x")):
        clone = pickle.loads(pickle.dumps(error))
        assert type(clone) is type(error) and str(clone) == str(error)


def test_raised_excessive_error_pickles_with_a_huge_size() -> None:
    with pytest.raises(ExcessiveStateError) as caught:
        specstate.validate_state_size(2**100)
    clone = pickle.loads(pickle.dumps(caught.value))
    assert (clone.size, clone.maximum) == (2**100, model.MAX_STATE_BYTES)


# --- native_info and the CPU baseline ---------------------------------------------------------------


def test_native_info_describes_the_pinned_build() -> None:
    info = specstate.native_info()
    pin = re.search(r'llama-cpp-sys-4 = "=([0-9.]+)"', (ROOT / "Cargo.toml").read_text())
    assert pin is not None
    assert info["llama_cpp_sys_version"] == pin.group(1)
    lock = (ROOT / "Cargo.lock").read_text()
    assert f'name = "llama-cpp-sys-4"\nversion = "{pin.group(1)}"' in lock
    assert re.fullmatch(r"b\d+(\+\d+)?", info["llama_cpp_build"])
    assert re.fullmatch(r"[0-9a-f]{7,40}", info["llama_cpp_commit"])
    assert "cpu" in info["backends"]
    assert set(info["backends"]) <= {"cpu", "cuda", "metal"}
    assert "CPU" in info["system_info"]
    assert info["specstate_version"] == specstate.__version__


def test_native_info_reports_the_x86_64_v3_kernels() -> None:
    info = specstate.native_info()
    if info["cpu_baseline"] != "x86-64-v3":
        pytest.fail(f"the default build must use the x86-64-v3 baseline, got {info['cpu_baseline']}")
    assert {"avx", "avx2", "fma", "f16c", "bmi2"} <= set(info["simd_features"])
    assert "avx512" not in info["simd_features"]
    # The pre-import check names the same baseline (in /proc/cpuinfo's spelling).
    assert info["cpu_baseline"] == specstate._cpu.BASELINE
    assert {"avx", "avx2", "fma", "f16c", "bmi2"} <= set(specstate._cpu.BASELINE_FLAGS)
    for flag in ("AVX2 = 1", "FMA = 1", "F16C = 1"):
        assert flag in info["system_info"]


def test_cpu_check_names_missing_instructions(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse sse2 sse4_1 sse4_2 avx f16c\n")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.fail("this suite expects an x86-64 machine")
    with pytest.raises(ImportError, match="x86-64-v3 and this CPU lacks avx2, fma, bmi1, bmi2, abm, movbe"):
        specstate._cpu.check_cpu(str(cpuinfo))
    full = tmp_path / "full"
    full.write_text("flags\t: " + " ".join(specstate._cpu.BASELINE_FLAGS) + "\n")
    specstate._cpu.check_cpu(str(full))
    specstate._cpu.check_cpu("/proc/cpuinfo")


# --- strategies -------------------------------------------------------------------------------------


@given(sst.valid_configs())
def test_valid_configs_pass(config: sst.Config) -> None:
    specstate.validate_config(*config)


@given(sst.invalid_configs())
def test_invalid_configs_fail(config: sst.Config) -> None:
    with pytest.raises(ConfigError):
        specstate.validate_config(*config)


@given(sst.sufficient_capacities())
def test_sufficient_capacities_pass(args: tuple[ContextCapacity, ContextCapacity, int]) -> None:
    specstate.validate_context_capacities(*args)


@given(sst.context_capacities(), sst.context_capacities(), st.integers(0, 2**32))
def test_any_capacities_give_a_verdict(target: ContextCapacity, draft: ContextCapacity, maximum: int) -> None:
    with contextlib.suppress(CapacityError):
        specstate.validate_context_capacities(target, draft, maximum)


@given(sst.valid_state_sizes())
def test_valid_state_sizes_pass(size: int) -> None:
    specstate.validate_state_size(size)


@given(sst.excessive_state_sizes())
def test_excessive_state_sizes_fail(size: int) -> None:
    with pytest.raises(ExcessiveStateError):
        specstate.validate_state_size(size)


def test_native_error_messages_are_written_once_in_rust(tmp_path: Path) -> None:
    """ModelLoadError, DecodeError and ModelChangedError format the core's templates (_native.NATIVE_MESSAGES)."""
    from specstate import _native

    assert sorted(_native.NATIVE_MESSAGES) == ["Decode", "ModelChanged", "ModelLoad"]
    missing = tmp_path / "{reason}.gguf"
    with pytest.raises(errors_module.ModelLoadError) as raised:
        specstate.Model(str(missing))
    assert str(raised.value) == _native.NATIVE_MESSAGES["ModelLoad"].format(path=missing, reason=raised.value.reason)
    assert str(raised.value).startswith(f"cannot load model {missing}: ")
    assert str(errors_module.DecodeError(2)) == "llama_decode failed with status 2"
    changed = errors_module.ModelChangedError("m.gguf", "size")
    assert str(pickle.loads(pickle.dumps(changed))) == _native.NATIVE_MESSAGES["ModelChanged"].format(
        path="m.gguf", change="size"
    )
