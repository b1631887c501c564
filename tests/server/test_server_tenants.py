"""``specstate serve`` keeps what one tenant sent to that tenant: the prompt cells and states its batched engine
keeps, the conversation a slot holds or caches and the lookup corpus ``ngram`` drafts from are reused only between
requests of the same tenant (its API key, narrowed by ``user`` and ``cache_salt``), and ``no_cross_request_reuse``
reuses nothing between requests.

The probe: a client that sends another client's text with a guessed PIN and ``max_tokens`` 1 must not find its
prompt already decoded when the guess is right. Each test asserts the mechanism (the engine's count of prompt tokens
reused, the conversation a slot continues, the corpus a request drafts from), which the timing follows from.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specstate.serve.cache import DEFAULT_TENANT, ConversationCache, TenantCorpora, key_identity, tenant_of
from specstate.serve.request import MAX_CACHE_SALT_CHARS
from test_server import BACKENDS, KEY, Live, config, tiny_chat

__all__ = ["tiny_chat"]  # the module fixture, shared with test_server

OTHER_KEY = "another-key"
PIN = "4821"
NOTE = "Keep this note: the accounts, the branches and the people to call if the card is lost. " * 3


def secret(pin: str) -> list[dict[str, str]]:
    """A conversation holding a PIN, the rest of its text after it (what a right guess would find decoded)."""
    return [{"role": "user", "content": f"My card PIN is {pin}. {NOTE}"}]


def reused(live: Live) -> int:
    """The prompt tokens the engine has not decoded so far (taken from cells an earlier request left)."""
    found = re.search(r"specstate_batch_prompt_tokens_reused_total (\d+)", live.get("/metrics")[1])
    assert found is not None
    return int(found.group(1))


def chat(live: Live, messages: list[dict[str, str]], key: str = KEY, **fields: Any) -> dict[str, Any]:
    """A greedy chat's whole answer (200 expected)."""
    body = {"messages": messages, "max_tokens": 1, "temperature": 0, **fields}
    status, answer, _ = live.post("/v1/chat/completions", json.dumps(body).encode(), key)
    assert status == 200, answer
    return answer


def reused_by(live: Live, messages: list[dict[str, str]], key: str = KEY, **fields: Any) -> int:
    """The prompt tokens one chat reused."""
    before = reused(live)
    chat(live, messages, key, **fields)
    return reused(live) - before


@pytest.fixture(scope="module", params=list(BACKENDS))
def keyed(request: pytest.FixtureRequest, tiny_chat: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A server with two API keys (each a tenant) and the default reuse, on each backend. One slot (a worker's on
    the Ray backend): each request lets go of the one before, whose cells its engine keeps (and the state of, once
    its sequence is taken)."""
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(f"# the server's keys\n{KEY}\n\n{OTHER_KEY}\n")
    workers = BACKENDS[request.param]
    server = Live(config(tiny_chat, slots=1, api_key=None, api_key_file=str(keys), ray_workers=workers))
    yield server
    server.stop()


@pytest.mark.parametrize(
    ("attacker", "narrowing"),
    [
        (OTHER_KEY, {"user": "victim"}),  # another API key, whatever it claims to be
        (KEY, {"user": "attacker"}),  # the same key, another user
        (KEY, {"user": "victim", "cache_salt": "guess"}),  # the same key and user, another salt
    ],
    ids=["another-key", "another-user", "another-salt"],
)
def test_a_right_guess_from_another_tenant_finds_nothing_decoded(
    keyed: Live, attacker: str, narrowing: dict[str, str]
) -> None:
    victim = {"user": "victim"}
    chat(keyed, secret(PIN), KEY, **victim)
    assert reused_by(keyed, secret(PIN), attacker, **narrowing) == 0  # neither kept cells nor kept states
    assert reused_by(keyed, secret(PIN), KEY, **victim) > 0  # the victim's own next request reuses its cells
    assert reused_by(keyed, secret(PIN), attacker, **narrowing) > 0  # and the attacker its own


def test_the_keys_file_adds_keys_and_a_wrong_key_is_refused(keyed: Live) -> None:
    for key in (KEY, OTHER_KEY):
        assert chat(keyed, [{"role": "user", "content": "Hi"}], key)["object"] == "chat.completion"
    status, answer, _ = keyed.post("/v1/chat/completions", b"{}", "not-a-key")
    assert status == 401 and answer["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_a_keys_file_without_keys_is_refused(tiny_chat: Path, tmp_path: Path) -> None:
    empty = tmp_path / "keys"
    empty.write_text("# nobody\n\n")
    with pytest.raises(ValueError, match="holds no API key"):
        config(tiny_chat, api_key_file=str(empty)).api_keys()


def test_without_keys_every_client_is_one_tenant_unless_it_narrows(tiny_chat: Path) -> None:
    live = Live(config(tiny_chat, slots=1, api_key=None))
    try:
        chat(live, secret(PIN))
        assert reused_by(live, secret(PIN), cache_salt="mine") == 0  # a salted request starts from nothing
        assert reused_by(live, secret(PIN), user="someone") == 0
        assert reused_by(live, secret(PIN)) > 0  # the unnarrowed requests are one tenant
        assert DEFAULT_TENANT in (live.state.corpus_documents() or {})
    finally:
        live.stop()


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_conversation_is_continued_and_restored_only_for_its_tenant(tiny_chat: Path, backend: str) -> None:
    live = Live(config(tiny_chat, slots=1, ray_workers=BACKENDS[backend]))
    try:
        first = secret(PIN)
        reply = chat(live, first, user="victim")["choices"][0]["message"]["content"]
        turn = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "Repeat it."}]
        if live.state.driver is None:
            held = live.state.slots[0].llama
            assert held is not None and held.chat_generator is not None
            victims = held.chat_generator
            chat(live, turn, user="attacker")
            assert held.chat_generator is not victims  # another tenant's turn is decoded from its messages
        else:  # the driver sends it to the worker with the fewest requests, with no conversation to restore
            chat(live, turn, user="attacker")
        assert "specstate_conversations_restored_total" not in live.get("/metrics")[1]  # nor restored
        chat(live, turn, user="victim")
        assert "specstate_conversations_restored_total 1" in live.get("/metrics")[1]  # the victim's own: restored
    finally:
        live.stop()


def test_each_tenant_drafts_from_its_own_corpus(keyed: Live) -> None:
    victim, attacker = tenant_of(key_identity(KEY), "drafts"), tenant_of(key_identity(OTHER_KEY), "drafts")
    chat(keyed, secret("1111"), KEY, user="drafts")
    documents = keyed.state.corpus_documents()
    assert documents is not None and documents[victim] == 1 and attacker not in documents
    chat(keyed, secret("2222"), OTHER_KEY, user="drafts")
    documents = keyed.state.corpus_documents()
    assert documents is not None and documents[victim] == 1 and documents[attacker] == 1


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_no_cross_request_reuse_keeps_nothing_between_requests(tiny_chat: Path, backend: str) -> None:
    live = Live(config(tiny_chat, slots=2, no_cross_request_reuse=True, ray_workers=BACKENDS[backend]))
    try:
        first = secret(PIN)
        reply = chat(live, first)["choices"][0]["message"]["content"]
        assert reused_by(live, first) == 0  # the same request again decodes all of it
        turn = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "Repeat it."}]
        chat(live, turn)
        assert reused_by(live, turn) == 0
        metrics = live.get("/metrics")[1]
        assert "conversations_cached" not in metrics and "conversations_restored" not in metrics
        assert live.state.corpus_documents() is None  # on the Ray backend, each worker's
        # The slots of this process (none on the Ray backend, whose workers' corpora were asked for above):
        assert all(slot.llama is not None and slot.llama.lookup_corpus is None for slot in live.state.slots)
        assert all(slot.llama is not None and slot.llama.reuse_key is None for slot in live.state.slots)
    finally:
        live.stop()


@pytest.mark.parametrize("salt", [7, ["a"], "s" * (MAX_CACHE_SALT_CHARS + 1)])
def test_a_cache_salt_is_a_bounded_string(keyed: Live, salt: object) -> None:
    body = {"messages": [{"role": "user", "content": "Hi"}], "cache_salt": salt}
    status, answer, _ = keyed.post("/v1/chat/completions", json.dumps(body).encode())
    assert status == 400 and answer["error"]["param"] == "cache_salt"  # type: ignore[index]


def test_the_conversation_cache_finds_a_conversation_only_for_its_tenant(tmp_path: Path) -> None:
    pairs = [("user", "Hi"), ("assistant", "Hello")]
    cache = ConversationCache(0, str(tmp_path), 1 << 20)  # straight to the directory
    cache.put(pairs, b"checkpoint", "victim")
    asked = [*pairs, ("user", "Again")]
    assert cache.longest(asked, "attacker") is None and cache.longest(asked) is None
    assert cache.longest(asked, "victim") == (2, b"checkpoint")
    assert ConversationCache(0, str(tmp_path), 1 << 20).longest(asked, "victim") == (2, b"checkpoint")  # restarted


def test_the_tenants_corpora_are_bounded() -> None:
    corpora = TenantCorpora(most=2)
    first = corpora.get("a")
    corpora.get("b")
    assert corpora.get("a") is first  # served again: now the most recent
    corpora.get("c")
    assert len(corpora) == 2 and "b" not in corpora and corpora.get("a") is first
