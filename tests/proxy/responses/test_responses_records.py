"""Response and thread records: tenant-scoped lookups, persistence across a new store on the same
directory (as after a restart), atomic files, and the bounded snapshot slots of a chain."""

from __future__ import annotations

from memt_proxy.responses.records import ResponseRecord, ResponseRecords, Thread, session_name


def response(tenant: str = "alpha", id: str = "resp_1") -> ResponseRecord:
    return ResponseRecord(id=id, tenant=tenant, body={"id": id}, input_items=[{"id": "msg_1"}], thread="chain_1", version=2, snapshot_of=id)


def test_a_record_is_found_only_under_its_own_tenant(tmp_path):
    for directory in (None, tmp_path):
        records = ResponseRecords(directory)
        records.save(response())
        assert records.response("alpha", "resp_1") == response()
        assert records.response("beta", "resp_1") is None
        assert records.thread("alpha", "resp_1") is None  # a response id is not a thread id
        assert records.response("alpha", "../resp_1") is None  # not an id: never a path


def test_records_survive_a_new_store_on_the_same_directory(tmp_path):
    thread = Thread(id="conv_9", tenant="alpha", session=session_name("conv_9"), items=[{"id": "m"}], uncommitted=[{"role": "user", "content": "hi"}])
    ResponseRecords(tmp_path).save(thread)
    ResponseRecords(tmp_path).save(response())
    reopened = ResponseRecords(tmp_path)
    assert reopened.thread("alpha", "conv_9") == thread and reopened.thread("alpha", "conv_9").conversation
    assert reopened.response("alpha", "resp_1") == response()
    assert not list(tmp_path.glob(".*.tmp"))  # written by rename: no partial files left
    reopened.delete(thread)
    assert ResponseRecords(tmp_path).thread("alpha", "conv_9") is None


def test_without_a_directory_only_the_most_recent_records_are_kept():
    records = ResponseRecords(None, in_memory=2)
    for n in range(3):
        records.save(response(id=f"resp_{n}"))
    assert records.response("alpha", "resp_0") is None
    assert records.response("alpha", "resp_2") is not None


def test_a_chain_keeps_its_last_snapshots_in_rotating_files():
    chain = Thread(id="chain_1", tenant="alpha", session=session_name("chain_1"))
    files = []
    for n in range(5):
        file = chain.next_snapshot(2)
        chain.keep_snapshot(f"resp_{n}", file, 2)
        files.append(file)
    assert list(chain.snapshots) == ["resp_3", "resp_4"] and chain.snapshot_of == "resp_4"
    assert chain.snapshot("resp_2") is None and chain.snapshot("resp_4") == files[4] and chain.snapshot(None) is None
    assert len(set(files)) == 2 and files[0] == files[2] == files[4]  # at most two files upstream
    assert files[0].startswith("r") and files[0].endswith(".safetensors")  # apart from tenants' own names ('t…')
    other = Thread(id="chain_1", tenant="beta", session="x")
    assert other.next_snapshot(2) != chain.next_snapshot(2)  # tenant-scoped


def test_a_thread_session_is_never_a_chat_session_name():
    from memt_core.names import NAME

    assert not NAME.fullmatch(session_name("conv_1"))  # X-MemT-Session cannot name it


def test_shared_records_see_what_another_node_wrote_and_deleted(tmp_path):
    """Two proxies on one --records-directory: a record read (and cached) by one is refreshed in place when the
    other rewrites it, and gone when the other deletes it; an unshared store keeps trusting its cache."""
    here, there = ResponseRecords(tmp_path, shared=True), ResponseRecords(tmp_path, shared=True)
    thread = Thread(id="chain_1", tenant="alpha", session=session_name("chain_1"), version=1, head="resp_1")
    here.save(thread)
    held = here.thread("alpha", "chain_1")
    moved = there.thread("alpha", "chain_1")
    assert moved == held and moved is not held
    moved.version, moved.head = 2, "resp_2"
    there.save(moved)
    assert here.thread("alpha", "chain_1") is held and (held.version, held.head) == (2, "resp_2")
    unshared = ResponseRecords(tmp_path)
    stale = unshared.thread("alpha", "chain_1")
    moved.version = 3
    there.save(moved)
    assert unshared.thread("alpha", "chain_1").version == 2 and stale.version == 2
    there.delete(moved)
    assert here.thread("alpha", "chain_1") is None


SAID = [{"role": "user", "content": "I live in Lisbon."}, {"role": "assistant", "content": "Noted."}]


def test_a_missed_commit_goes_in_with_the_next_turn_and_an_emptied_memory_takes_every_item_again():
    """``Thread``'s transitions: the turn committed behind the answer that did not land joins the uncommitted messages
    (before them) at the version memory holds; a memory found empty upstream takes all the items as context."""
    chain = Thread(id="chain_1", tenant="t", session="s", version=3, behind=SAID, uncommitted=[{"role": "user", "content": "next"}], snapshot_of="resp_2")
    chain.missed_commit(2)
    assert (chain.version, chain.behind, chain.uncommitted, chain.snapshot_of) == (2, [], SAID + [{"role": "user", "content": "next"}], None)
    conversation = Thread(id="conv_1", tenant="t", session="s", version=5, snapshot_of="resp_4")
    conversation.rebuilt(SAID)
    assert (conversation.version, conversation.uncommitted, conversation.snapshot_of) == (0, SAID, None)
    conversation.behind = SAID
    conversation.confirmed()
    assert conversation.behind == []
    conversation.remember_answer("d", None, "resp_6", {"id": "resp_6"})
    assert conversation.answered == {"digest": "d", "key": None, "id": "resp_6", "body": {"id": "resp_6"}}
