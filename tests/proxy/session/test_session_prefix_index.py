"""The prefix index (``memt_proxy.session.prefix_index``) and header-less planning (``memt_proxy.session.headerless``), without I/O."""

from __future__ import annotations

from memt_proxy.session.headerless import plan_headerless
from memt_proxy.session.prefix_index import PrefixIndex, chain, extend, root
from memt_proxy.protocol import Message
from memt_proxy.session.store import SessionRecordStore
from memt_proxy.session.transcript import message_hash


def messages(*pairs: tuple[str, str]) -> list[Message]:
    return [Message(role=role, content=content) for role, content in pairs]


def test_the_chain_depends_on_every_message_in_order_and_on_the_tenant():
    a, b = chain("t", ["x", "y"]), chain("t", ["y", "x"])
    assert len(a) == 2 and a[0] != b[0] and a[1] != b[1]
    assert chain("t", ["x"]) == a[:1]
    assert chain("u", ["x", "y"])[1] != a[1]
    assert extend(root("t"), "x") == a[0] and extend(a[0], "y") == a[1]


def test_find_returns_the_deepest_head_and_a_moved_head_is_no_longer_found():
    index = PrefixIndex()
    links = chain("t", ["m1", "m2", "m3", "m4"])
    assert index.find(links) is None
    index.move("b1", links[1])
    index.move("b2", links[3])
    found = index.find(links)
    assert (found.depth, found.name) == (4, "b2")
    index.move("b2", chain("t", ["m1", "m2", "m3", "other"])[3])  # b2 moved elsewhere: its old head is gone
    assert (index.find(links).depth, index.find(links).name) == (2, "b1")
    index.drop("b1")
    assert index.find(links) is None and len(index) == 1
    index.move("b3", links[3])
    index.move("b4", links[3])  # one state, two kept states holding it: the newer one is found, the older forgotten
    assert index.find(links).name == "b4" and index.head("b3") is None


def test_answered_transcripts_are_bounded_and_make_a_history_worth_keeping():
    index = PrefixIndex(seen_limit=2)
    links = chain("t", ["u1", "a1"])
    assert not index.worth_keeping(links, 1)  # a one-exchange history nobody saw answered: a few-shot prompt
    assert index.worth_keeping(links, 2)  # more than one exchange: a conversation new to this proxy
    index.answered(links[1])
    assert index.worth_keeping(links, 1)
    index.answered("x")
    index.answered("y")  # the oldest is forgotten past the limit
    assert not index.worth_keeping(links, 1)


def test_plan_resumes_from_the_earlier_messages_only_and_skips_instructions():
    index = PrefixIndex()
    conversation = messages(("system", "Be brief."), ("user", "u1"), ("assistant", "a1"), ("user", "u2"))
    hashes = [message_hash(m) for m in conversation[1:]]
    links = chain("t", hashes)
    index.move("b", links[1])
    plan = plan_headerless(conversation, "t", index)
    assert plan.found.depth == 2 and plan.found.name == "b" and plan.hashes == hashes[:2]
    assert plan.links == tuple(links[:2]) and plan.link == links[2] and plan.conversation == tuple(hashes)
    assert plan_headerless(conversation, "other", index).found is None  # another tenant's chain
    # the turn itself is never part of what is found: the same history with a new question finds the same state
    assert plan_headerless(conversation[:-1] + messages(("user", "u2'")), "t", index).found.depth == 2
    # no session turn: nothing found, nothing kept
    ending = plan_headerless(conversation[:-1], "t", index)
    assert ending.found is None and not ending.worth_keeping


def test_a_state_is_made_once_per_transcript():
    """``reserve`` claims the making of a state: refused while one is being made or kept for the same chain."""
    index = PrefixIndex()
    assert index.reserve("c1") and not index.reserve("c1")
    index.made("c1")
    assert index.reserve("c1")
    index.move("b", "c1")
    index.made("c1")
    assert not index.reserve("c1")  # kept
    index.drop("b")
    assert index.reserve("c1")


def test_kept_state_records_survive_a_new_store_and_go_with_the_session(tmp_path):
    store = SessionRecordStore(tmp_path)
    store.save_kept("p-1", "alpha", "~n1", "h1")
    store.save_kept("p-2", "beta", "~n2", None, "p-named")
    (tmp_path / "branches" / "p-3.json").write_text("{not json")
    assert SessionRecordStore(tmp_path).kept_states() == [
        {"tenant": "alpha", "name": "~n1", "head": "h1", "origin": None}, {"tenant": "beta", "name": "~n2", "head": None, "origin": "p-named"},
    ]
    store.delete("p-1")
    assert [b["name"] for b in store.kept_states()] == ["~n2"]
    assert SessionRecordStore(None).kept_states() == []
