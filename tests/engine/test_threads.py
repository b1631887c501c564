"""The default thread count (docs/threads.md): one rule over the machine's cores, quota and slots, used by every
context, embedder and restore given no count (the server's slots and the Ray workers:
tests/server/test_server_threads.py); and the count each graph runs with while other processes want the CPUs
(threads_now), with the numerics that make it change no token."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specstate import Context, Generator, Model, default_threads, inspect_checkpoint
from specstate._native import MAX_THREADS, machine_cpus, threads_for, threads_now
from specstate.bench import CODE_PROMPT, STORY_PROMPT

U32 = st.integers(min_value=0, max_value=2**32 - 1)
SLOTS = st.integers(min_value=1, max_value=2**32 - 1)


@given(usable=U32, physical=U32, slots=SLOTS)
def test_the_rule_never_asks_for_more_than_the_machine_has(usable: int, physical: int, slots: int) -> None:
    threads = threads_for(usable, physical, slots)
    cores = min(physical, usable) if physical else usable  # the cores the process may use
    assert 1 <= threads <= MAX_THREADS
    assert threads <= max(usable, 1)  # never past the affinity mask or the quota
    assert threads <= max(physical, 1) or physical == 0  # never past the physical cores
    assert threads == 1 or threads * slots <= cores  # the slots together fit in the cores
    if 1 <= cores // slots <= MAX_THREADS:
        assert (threads + 1) * slots > cores  # and take all of them that fit


@given(usable=U32, physical=U32, slots=SLOTS)
def test_more_slots_never_get_more_threads_each_and_more_cores_never_fewer(
    usable: int, physical: int, slots: int
) -> None:
    threads = threads_for(usable, physical, slots)
    assert threads_for(usable, physical, min(slots + 1, 2**32 - 1)) <= threads
    assert threads_for(min(usable + 1, 2**32 - 1), physical, slots) >= threads
    if physical:
        assert threads_for(usable, min(physical + 1, 2**32 - 1), slots) >= threads


def test_the_rule_on_machines_of_every_kind() -> None:
    assert threads_for(2, 2) == 2  # this workplace's 2-core VM
    assert threads_for(16, 8) == 8  # 8 cores with hyper-threads: one thread a core
    assert threads_for(3, 16) == 3  # a CPU quota of 3 on a 16-core machine
    assert threads_for(4, 0) == 4  # no topology (not Linux): the usable CPUs
    assert threads_for(16, 8, slots=2) == 4  # two server slots share the cores
    assert threads_for(2, 2, slots=4) == 1  # more slots than cores: one each
    assert threads_for(1 << 20, 1 << 20) == MAX_THREADS


def test_the_default_reads_this_machine() -> None:
    cpus = machine_cpus()
    assert set(cpus) == {"usable", "physical_cores"}
    allowed = len(os.sched_getaffinity(0))
    assert 1 <= cpus["usable"] <= allowed
    assert cpus["physical_cores"] <= allowed
    for slots in (1, 2, 3, 64):
        assert default_threads(slots) == threads_for(cpus["usable"], cpus["physical_cores"], slots)
    assert default_threads() == default_threads(1)


def test_the_affinity_mask_is_read_at_each_call() -> None:
    allowed = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(allowed)})
        assert machine_cpus()["usable"] == 1 and default_threads() == 1
    finally:
        os.sched_setaffinity(0, allowed)
    assert machine_cpus()["usable"] == min(len(allowed), machine_cpus()["usable"])


@pytest.mark.parametrize("slots", [0, -1, 2**32, True])
def test_a_number_of_slots_is_checked(slots: int) -> None:
    with pytest.raises(TypeError if isinstance(slots, bool) else ValueError, match=r"slots|bool"):
        default_threads(slots)
    with pytest.raises(TypeError if isinstance(slots, bool) else ValueError, match=r"slots|bool"):
        threads_for(2, 2, slots)
    with pytest.raises(ValueError, match="usable must be between 0 and 4294967295, not -1"):
        threads_for(-1, 2)


def test_generators_given_no_count_take_the_default(llama_model: Model) -> None:
    model = llama_model
    generator = Generator(model, n_ctx=64)
    assert generator._native.n_threads == default_threads()
    generator.generate([1, 2, 3], max_tokens=2)
    recorded = Generator(model, n_ctx=64, n_threads=MAX_THREADS)
    recorded.generate([1, 2, 3], max_tokens=2)
    # A restore keeps a checkpoint's count, at most the default.
    assert Generator.restore(recorded.checkpoint(), model)._native.n_threads == default_threads()
    assert Generator.restore(generator.checkpoint(), model, n_threads=1)._native.n_threads == 1


def test_a_prompt_gives_the_same_bits_at_every_thread_count(smollm2: Model) -> None:
    """What lets a graph run with fewer threads than configured while the machine is busy (threads_now):
    a 500-token prompt's logits and sequence state are the same bytes at 1 to 4 threads (patch 0001 covers the
    batches of verification and single decodes: tests/engine/test_exact.py)."""
    prompt = smollm2.tokenize((CODE_PROMPT + STORY_PROMPT) * 2, add_special=False, parse_special=True)[:500]
    seen = set()
    for threads in (1, 2, 3, 4):
        context = Context(smollm2, n_ctx=1024, n_threads=threads)
        context.decode(prompt, 0, all_logits=True)
        rows = [context.logits(row) for row in (0, 250, 499)]
        seen.add(hashlib.sha256(repr(rows).encode() + context.seq_state(0)).hexdigest())
    assert len(seen) == 1


@contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """`count` other CPU-bound processes running for the block."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def settles(configured: int, wanted: Callable[[int], bool], seconds: float = 10.0) -> bool:
    """Whether threads_now(configured), asked again and again (as decodes ask), comes to a count `wanted` accepts."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if wanted(threads_now(configured)):
            return True
        time.sleep(0.005)
    return False


def others_running() -> int:
    """The machine's runnable tasks now, less this thread (the fourth field of /proc/loadavg)."""
    return int(Path("/proc/loadavg").read_text().split()[3].split("/")[0]) - 1


def test_graphs_give_up_the_threads_other_processes_take_and_take_them_back() -> None:
    online = os.cpu_count() or 1
    assert settles(online, lambda threads: 1 <= threads <= online)
    with busy_processes(online):
        # Every CPU has a task of its own: one thread, whatever was configured.
        assert settles(online, lambda threads: threads == 1)
        assert settles(MAX_THREADS, lambda threads: threads == 1)
    # Given back when the machine has a CPU free again (a loaded test machine may have none: then one thread).
    assert settles(online, lambda threads: threads > 1 or online == 1 or others_running() >= online - 1)
    assert threads_now(1) == 1
    with pytest.raises(ValueError, match="n_threads must be between 0"):
        threads_now(MAX_THREADS + 1)


def test_a_busy_machine_changes_no_token_and_no_checkpoint(smollm2: Model) -> None:
    """Graphs that run with fewer threads than configured while other processes are busy give the same tokens, and
    the checkpoint records the configured count."""

    def run() -> tuple[list[int], bytes]:
        generator = Generator(smollm2, mode="ngram", n_ctx=1024, n_threads=2)
        generator.generate(CODE_PROMPT, max_tokens=24)
        return generator.tokens, generator.checkpoint()

    alone = run()
    with busy_processes(os.cpu_count() or 1):
        assert settles(2, lambda threads: threads == 1)
        busy = run()
    assert busy[0] == alone[0] and len(alone[0]) == 24
    assert inspect_checkpoint(busy[1])["n_threads"] == 2
    assert busy[1] == alone[1]


def test_fixed_threads_keep_the_configured_count() -> None:
    script = "from specstate._native import threads_now; print(threads_now(7))"
    env = {**os.environ, "SPECSTATE_FIXED_THREADS": "1"}
    fixed = subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True, text=True)
    assert fixed.stdout.strip() == "7"


def _threads_of_this_process() -> set[str]:
    return set(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process's threads from Linux's /proc")
def test_a_context_keeps_its_graph_threads_between_decodes(llama_model: Model) -> None:
    """ggml's workers are created with the context, sleep between its graphs and go with it (src/native/pool.rs),
    rather than created and joined for every decode."""
    before = _threads_of_this_process()
    context = Context(llama_model, n_ctx=64, n_threads=3)
    workers = _threads_of_this_process() - before
    assert len(workers) == 2  # the caller is the third
    for position in range(8):
        context.decode([1 + position], position)
        assert _threads_of_this_process() - before == workers  # the same threads, none new, none gone
    single = Context(llama_model, n_ctx=64, n_threads=1)
    single.decode([1], 0)
    assert _threads_of_this_process() - before == workers  # one thread needs no worker
    del context, single
    assert _threads_of_this_process() - before == set()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks the process")
def test_a_context_decodes_in_a_process_forked_after_its_threads_were_made(llama_model: Model) -> None:
    """A fork copies only the calling thread: the child replaces the context's graph threads (the parent's are not
    there to wait for) and decodes the same logits as the parent."""
    context = Context(llama_model, n_ctx=64, n_threads=2)
    context.decode([1, 2, 3], 0)
    state = context.seq_state()
    context.decode([4], 3)
    expected = list(context.logits(-1))
    context.set_seq_state(0, state)
    child = os.fork()
    if child == 0:  # the child: exit 0 when it decodes the parent's logits
        try:
            context.decode([4], 3)
            os._exit(0 if list(context.logits(-1)) == expected else 1)
        except BaseException:
            os._exit(2)
    deadline = time.monotonic() + 60
    while (waited := os.waitpid(child, os.WNOHANG)) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    if waited == (0, 0):
        os.kill(child, 9)
        os.waitpid(child, 0)
        pytest.fail("the forked child's decode did not end (it waited for the parent's graph threads)")
    assert os.waitstatus_to_exitcode(waited[1]) == 0
