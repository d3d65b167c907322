"""``memt_proxy.session.state``: a session's state and the bounded table, without I/O."""

from __future__ import annotations

import pytest

from memt_proxy.errors import RateLimited
from memt_proxy.session.state import SessionTable


def test_a_state_in_use_is_given_back_when_its_block_raises():
    table = SessionTable(capacity=1)
    state = table.entry("t", "a")
    try:
        with state.in_use():
            assert state.users == 1 and table.room() == 0
            raise RuntimeError("the block failed")
    except RuntimeError:
        pass
    assert state.users == 0 and table.room() == 1



def test_a_state_in_use_is_never_dropped_and_a_full_table_of_them_refuses_a_new_one():
    table = SessionTable(capacity=1)
    first = table.take("t", "a")
    with pytest.raises(RateLimited):
        table.entry("t", "b")
    table.hold(first)  # its commit behind the answer
    table.give_back(first)
    assert table.room() == 0 and table.get("t", "a") is first
    table.give_back(first)
    second = table.entry("t", "b")  # the idle one is dropped to make room
    assert table.get("t", "a") is None and table.get("t", "b") is second and table.dropped == 1
