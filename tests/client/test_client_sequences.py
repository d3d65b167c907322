"""Each ``MemTSession`` call issues exactly the HTTP sequence of the spec's tables (live server, both
families, the real ``NativeClient`` over ``httpx.HTTPTransport`` wrapped in a recorder).

The servers run scripted tiny checkpoints (see ``scripted.py``): the two plain questions of the
script get complete replies, so the "reply completes" rows are exercised with real generation.
"""

from __future__ import annotations

import pytest
from client.scripted import ANSWERS, PLAIN_FIRST, PLAIN_SECOND
from client.support import API_KEY, Live, RecordingTransport

from memt_core.client import MemTClientError, MemTSession, NativeClient, load_chat_format, load_tokenizer

pytestmark = pytest.mark.timeout(300)

SHORT = 4  # max_new_tokens of unscripted chats: they are cut off (truncated), which is fine here


def _check_rids(recorder: RecordingTransport, session_id: str, epoch: str) -> None:
    """Every generation request carries a well-formed RID with a fresh nonce and the epoch."""
    nonces = []
    for record in recorder.records:
        if record.path == "/generate":
            prefix, session, operation, nonce = record.body["rid"].split("|")
            assert prefix == "memt" and session == session_id
            if operation.startswith("commit:"):
                assert int(operation.split(":")[1]) == len(record.body["input_ids"])
                assert record.body["sampling_params"] == {"max_new_tokens": 0}
                assert record.body["memt_transaction"]
            else:
                assert operation == "query"
            assert record.body["memt_epoch"] == epoch
            nonces.append(nonce)
        elif record.path == "/memt/control":
            assert record.body["epoch"] == epoch
    assert len(nonces) == len(set(nonces))


def test_table_sequences(live: Live):
    client, rec = live.client()
    fmt = live.chat_format

    # MemTSession(...) → GET /memt/capabilities → create with memory_read: true
    session = MemTSession(client, fmt, live.parser)
    assert rec.since(0) == ["GET /memt/capabilities", "create"]
    assert rec.records[1].body["memory_read"] is True

    # set_memory_read(enabled) → acquire → memory_read → release
    mark = rec.mark()
    session.set_memory_read(False)
    assert rec.since(mark) == ["acquire", "memory_read", "release"]
    assert rec.records[mark + 1].body["enabled"] is False
    assert rec.records[mark].body["ttl"] == 3600  # the client's operation lease
    session.set_memory_read(True)

    # chat(question) → acquire → query → release
    mark = rec.mark()
    first = session.chat(PLAIN_FIRST, max_new_tokens=32, return_dict=True)
    assert rec.since(mark) == ["acquire", "query", "release"]
    assert first["answer"] == ANSWERS["first"]  # the scripted reply: the prompt was exactly right
    assert first["generation_completed"] and first["turn_completed"] and not first["memory_updated"]
    assert first["output_ids"][-1] == live.eos  # EOS is kept for replay
    assert len(session.messages) == 2

    # chat(question, enable_memory=True), reply completes → acquire → query → begin →
    # one commit per unsaved turn including the current one → publish → release
    mark = rec.mark()
    second = session.chat(PLAIN_SECOND, enable_memory=True, max_new_tokens=32, return_dict=True)
    assert rec.since(mark) == ["acquire", "query", "begin", "commit", "commit", "publish", "release"]
    assert second["answer"] == ANSWERS["second"]
    assert second["memory_updated"] is True and second["committed_turns"] == [1, 2]
    commits = rec.records_since(mark, "commit")
    turn1 = fmt.user_ids(PLAIN_FIRST) + first["output_ids"]
    turn2 = fmt.user_ids(PLAIN_SECOND) + second["output_ids"]
    assert [c.body["input_ids"] for c in commits] == [turn1, turn2]  # exact tokens, in order
    query = rec.records_since(mark, "query")[0]
    assert query.body["input_ids"] == fmt.prompt_ids(system_prompt=None, tools=None, turns=[turn1], tail=fmt.user_ids(PLAIN_SECOND))
    transaction = rec.records_since(mark, "begin")[0].body["transaction"]
    assert {c.body["memt_transaction"] for c in commits} == {transaction}
    assert rec.records_since(mark, "publish")[0].body["transaction"] == transaction
    assert session.messages == []  # committed turns leave the conversation context

    # commit_history() with no history → no requests
    mark = rec.mark()
    assert session.commit_history() == {"committed_turns": [], "memory_updated": False}
    assert rec.since(mark) == []

    # commit_history() → acquire → begin → one commit per retained turn → publish → release
    session.chat("An unscripted question.", max_new_tokens=SHORT)
    session.chat("Another one.", max_new_tokens=SHORT)
    mark = rec.mark()
    result = session.commit_history()
    assert rec.since(mark) == ["acquire", "begin", "commit", "commit", "publish", "release"]
    assert result == {"committed_turns": [3, 4], "memory_updated": True}

    # save_state(path) → acquire → begin → replay pending turns → export candidate → publish → release
    session.chat("A pending turn.", max_new_tokens=SHORT)
    name = f"sequences-{live.family}.safetensors"
    mark = rec.mark()
    snapshot = session.save_state(name)
    assert rec.since(mark) == ["acquire", "begin", "commit", "export", "publish", "release"]
    export = rec.records_since(mark, "export")[0].body
    assert export["file"] == name and export["encoding"] == fmt.native_encoding
    assert export["transaction"] == rec.records_since(mark, "begin")[0].body["transaction"]
    assert snapshot["path"] == name and snapshot["committed_turns"] == [5]
    assert (live.server.state_directory / name).is_file()
    with pytest.raises(MemTClientError):  # an existing file is not replaced without overwrite=True
        session.save_state(name)
    mark = rec.mark()
    session.save_state(name, overwrite=True)  # nothing pending: no commits
    assert rec.since(mark) == ["acquire", "begin", "export", "publish", "release"]
    assert rec.records_since(mark, "export")[0].body["overwrite"] is True
    mark = rec.mark()
    unnamed = session.save_state()  # a new ID, never an existing file
    assert rec.since(mark) == ["acquire", "begin", "export", "publish", "release"]
    assert unnamed["path"] != name and unnamed["path"].endswith(".safetensors")
    with pytest.raises(MemTClientError):
        session.save_state("../escape.safetensors")

    # ingest(document) → pending turns first, then chunk_tokens pieces, in one transaction
    session.chat("Before the document.", max_new_tokens=SHORT)
    document = "The document describes a library of books, a river, a mountain, and a small town by the sea. " * 3
    pieces = []
    mark = rec.mark()
    result = session.ingest(document, progress=lambda done, total: pieces.append((done, total)))
    document_ids = fmt.document_ids(document)
    chunks = -(-len(document_ids) // session.chunk_tokens)
    assert chunks >= 2
    assert rec.since(mark) == ["acquire", "begin", "commit"] + ["commit"] * chunks + ["publish", "release"]
    bodies = [c.body["input_ids"] for c in rec.records_since(mark, "commit")]
    assert sum(bodies[1:], []) == document_ids
    assert [len(b) for b in bodies[1:-1]] == [session.chunk_tokens] * (chunks - 1)
    assert result["chunks"] == chunks and result["tokens"] == len(document_ids) and result["committed_turns"] == [6]
    assert pieces[0] == (0, chunks) and pieces[-1] == (chunks, chunks)
    assert session.messages == []  # successful ingestion clears local history

    # status() (not in the table): acquire → status → release, with local state added
    mark = rec.mark()
    status = session.status()
    assert rec.since(mark) == ["acquire", "status", "release"]
    assert status["uncertain"] is False and status["uncommitted_turns"] == 0 and status["pending_tool_calls"] == 0

    # reset() → acquire → reset → release
    session.chat("One more.", max_new_tokens=SHORT)
    mark = rec.mark()
    session.reset()
    assert rec.since(mark) == ["acquire", "reset", "release"]
    assert session.messages == []

    # close() → acquire → close
    mark = rec.mark()
    session.close()
    assert rec.since(mark) == ["acquire", "close"]
    session.close()  # closing twice sends nothing
    assert rec.since(mark) == ["acquire", "close"]
    _check_rids(rec, session.session_id, client.epoch)

    # MemTSession(..., state=path) and load_state(path) → acquire → begin → import → publish
    # (memory_read: true) → release; the transcript is not restored
    mark = rec.mark()
    with MemTSession(client, fmt, live.parser, state=name) as restored:
        assert rec.since(mark) == ["GET /memt/capabilities", "create", "acquire", "begin", "import", "publish", "release"]
        publish = rec.records_since(mark, "publish")[0].body
        assert publish["memory_read"] is True
        assert rec.records_since(mark, "import")[0].body["file"] == name
        assert len(restored.messages) == 0
        restored.set_memory_read(False)
        restored.chat("Something to forget.", max_new_tokens=SHORT)
        mark = rec.mark()
        restored.load_state(unnamed["path"])
        assert rec.since(mark) == ["acquire", "begin", "import", "publish", "release"]
        assert restored.memory_read is True and restored.messages == []
        mark = rec.mark()
    assert rec.since(mark) == ["acquire", "close"]  # leaving the with block closes the session


def test_bearer_key_and_session_ids(keyed_server, long_chunk_checkpoint):
    """NativeClient sends ``Authorization: Bearer``; a wrong key is a clear 401; a session ID can be chosen."""
    tokenizer = load_tokenizer(long_chunk_checkpoint)
    chat_format, parser = load_chat_format(long_chunk_checkpoint, tokenizer=tokenizer)
    with NativeClient(keyed_server.url, api_key="wrong") as bad:
        with pytest.raises(MemTClientError) as info:
            MemTSession(bad, chat_format, parser)
        assert info.value.status == 401 and not info.value.uncertain
    recorder = RecordingTransport()
    with NativeClient(keyed_server.url, api_key=API_KEY, transport=recorder) as client:
        with MemTSession(client, chat_format, parser, session="chosen-id.1") as session:
            assert session.session_id == "chosen-id.1"
            session.set_memory_read(False)
    assert recorder.since(0) == ["GET /memt/capabilities", "create", "acquire", "memory_read", "release", "acquire", "close"]
    assert {r.authorization for r in recorder.records} == {f"Bearer {API_KEY}"}


def test_identity_mismatch_is_refused_before_create(live_nano, nano_checkpoint, flash_checkpoint):
    """A chat format from another checkpoint (other seed, other vocabulary) is refused before create."""
    for checkpoint in (nano_checkpoint, flash_checkpoint):
        tokenizer = load_tokenizer(checkpoint)
        chat_format, parser = load_chat_format(checkpoint, tokenizer=tokenizer)
        assert chat_format.identity != live_nano.chat_format.identity
        client, rec = live_nano.client()
        with pytest.raises(MemTClientError) as info:
            MemTSession(client, chat_format, parser)
        assert info.value.stage == "create" and not info.value.uncertain
        assert "identity" in str(info.value)
        assert rec.since(0) == ["GET /memt/capabilities"]  # no session was created


def test_failed_restore_does_not_leak_the_session(live_nano: Live):
    """``MemTSession(..., state=missing)`` raises, and the session it created is closed again."""
    client, rec = live_nano.client()
    with pytest.raises(MemTClientError) as info:
        MemTSession(client, live_nano.chat_format, live_nano.parser, state="missing.safetensors")
    assert info.value.stage == "import" and not info.value.uncertain
    assert rec.since(0) == ["GET /memt/capabilities", "create", "acquire", "begin", "import", "release", "acquire", "close"]
    session_id = rec.records[2].body["session"]
    with pytest.raises(MemTClientError, match="does not exist"):
        client.control("inspect", session_id)
