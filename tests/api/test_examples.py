"""The examples run as a user runs them (a RAG example and a tools example), on SmolLM2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(name: str, *args: str) -> list[str]:
    command = [sys.executable, str(EXAMPLES / name), *args, "--threads", "2"]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=True).stdout.splitlines()


def test_the_rag_example_retrieves_the_right_note_and_answers_from_it() -> None:
    lines = run_example("rag.py", "--ask", "Where do the otters sleep?")
    assert lines[0] == "context: The otters of the river sleep in the hollow willow by the mill."
    assert lines[1].startswith("answer:") and "willow" in lines[1]


def test_the_tools_example_calls_the_function_and_answers() -> None:
    lines = run_example("tools.py")
    assert lines[0] == "finish_reason: tool_calls"
    assert lines[1] == 'call: get_weather {"city": "Paris"}'
    assert lines[2].startswith("answer:")
