"""Durable published memory (--snapshot-store): a session survives losing its server, on another server.

Two servers share one snapshot store, each with its own state directory (different machines in a
deployment). Every published version (and a reset) is written before it takes effect; a session
created under a name the store knows starts from its latest version, identity-checked.
"""

from __future__ import annotations

import json

from e2e.wire import Handle, Wire

PROMPT = [5, 6, 7, 8]


def answer(wire: Wire, handle) -> list[int]:
    return wire.query(handle, PROMPT, 6)["output_ids"]


def test_a_session_continues_on_another_server_after_a_kill(nano_checkpoint, memt_servers, tmp_path):
    store = tmp_path / "store"
    first = memt_servers(nano_checkpoint, "--snapshot-store", str(store))
    with first.client() as http:
        wire = Wire(http)
        assert wire.capabilities["durable_memory"] is True
        empty = answer(wire, (probe := wire.open("probe")))
        h = wire.open("alice")
        wire.write(h, [11, 12, 13])
        wire.write(h, [14, 15])
        remembered = answer(wire, h)
        assert remembered != empty
        manifest = json.loads((store / "sessions" / "alice.json").read_text())
        assert manifest["version"] == 2 and (store / "blobs" / manifest["file"]).is_file()
        wire.ctl("close", probe)
    first.kill()  # SIGKILL: nothing is flushed on the way out

    second = memt_servers(nano_checkpoint, "--snapshot-store", str(store))
    with second.client() as http:
        wire = Wire(http)
        created = wire.control("create", "alice")
        assert created["restored_version"] == 2
        lease = wire.control("acquire", "alice")["lease"]
        h = Handle("alice", lease)
        assert wire.ctl("inspect", h)["published_version"] == 2
        assert answer(wire, h) == remembered  # the same memory, read on another server
        wire.ctl("reset", h)  # a reset is durable too
        assert answer(wire, h) == empty
        assert wire.ctl("inspect", h)["published_version"] == 3
        fresh = wire.open("bob")
        assert answer(wire, fresh) == empty and "restored_version" not in wire.control("create", "carol")
        wire.ctl("close", fresh)  # closing forgets the stored memory
        assert not (store / "sessions" / "bob.json").exists()
    second.kill()

    third = memt_servers(nano_checkpoint, "--snapshot-store", str(store))
    with third.client() as http:
        wire = Wire(http)
        assert wire.control("create", "alice")["restored_version"] == 3
        lease = wire.control("acquire", "alice")["lease"]
        assert answer(wire, Handle("alice", lease)) == empty  # the reset came back, not the older memory
        assert "restored_version" not in wire.control("create", "bob")
