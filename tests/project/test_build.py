"""The build applies specstate's own llama.cpp patches (llama-cpp-sys-4/), and rebuilds when they change."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATCHES = ROOT / "llama-cpp-sys-4" / "patches"


def patches_digest() -> str:
    """The digest llama-cpp-sys-4/specstate.cmake computes: SHA-256 of the patches' SHA-256s, in name order."""
    sums = "".join(hashlib.sha256(path.read_bytes()).hexdigest() for path in sorted(PATCHES.glob("*.patch")))
    return hashlib.sha256(sums.encode()).hexdigest()


def test_the_patch_digest_in_the_cargo_configuration_is_the_patches_own() -> None:
    config = (ROOT / ".cargo" / "config.toml").read_text()
    recorded = re.search(r'^LLAMA_SPECSTATE_PATCHES = "([0-9a-f]{64})"$', config, re.MULTILINE)
    assert recorded is not None, "LLAMA_SPECSTATE_PATCHES is missing from .cargo/config.toml"
    assert recorded.group(1) == patches_digest(), "update LLAMA_SPECSTATE_PATCHES to the patches' digest"
    assert 'CMAKE_TOOLCHAIN_FILE = { value = "llama-cpp-sys-4/specstate.cmake", relative = true }' in config


def test_every_patch_touches_llama_cpp_only_and_says_what_it_is_for() -> None:
    patches = sorted(PATCHES.glob("*.patch"))
    assert patches
    for path in patches:
        text = path.read_text()
        targets = re.findall(r"^\+\+\+ b/(\S+)", text, re.MULTILINE)
        assert targets and all(target.startswith(("ggml/", "src/", "include/", "common/")) for target in targets)
    readme = (ROOT / "llama-cpp-sys-4" / "README.md").read_text()
    for path in patches:
        assert path.name in readme, f"llama-cpp-sys-4/README.md does not describe {path.name}"


def test_the_cuda_toolchain_applies_the_same_patches() -> None:
    assert (
        'include("${CMAKE_CURRENT_LIST_DIR}/../llama-cpp-sys-4/specstate.cmake")'
        in (ROOT / "cmake" / "cuda.cmake").read_text()
    )
