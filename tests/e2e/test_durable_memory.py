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


def test_a_full_server_with_a_store_unloads_the_longest_idle_session_to_make_room(nano_checkpoint, memt_servers, tmp_path):
    """Sessions left behind (their clients gone, e.g. a proxy restarted without its records) no longer hold the
    server's slots for ever: a create that finds them all taken unloads the one given up longest ago, whose
    memory stays in the store and comes back under its name."""
    server = memt_servers(nano_checkpoint, "--snapshot-store", str(tmp_path / "store"), "--max-sessions-per-rank", "2")
    with server.client() as http:
        wire = Wire(http)
        empty = answer(wire, (scratch := wire.open("scratch")))
        wire.ctl("release", scratch)
        old = wire.open("left-behind")
        wire.write(old, [11, 12, 13])
        remembered = answer(wire, old)
        assert remembered != empty
        wire.ctl("release", old)
        held = wire.open("held")  # a third session: "scratch" (released first) made room
        assert wire.control("inspect", "scratch", expect=409)["error"]["code"] == "unknown_session"
        newcomer = wire.open("newcomer")  # "left-behind" makes room now; "held" keeps its lease
        assert wire.ctl("inspect", held)["session"] == "held"
        wire.ctl("release", newcomer)
        assert wire.control("create", "left-behind")["restored_version"] == 1
        back = Handle("left-behind", wire.control("acquire", "left-behind")["lease"])
        assert answer(wire, back) == remembered
    plain = memt_servers(nano_checkpoint, "--max-sessions-per-rank", "1")  # no store: unloading a memory would lose it
    with plain.client() as http:
        wire = Wire(http)
        wire.ctl("release", wire.open("empty"))  # never written to: it goes, nothing is lost (issue 48)
        only = wire.open("only")
        assert wire.control("inspect", "empty", expect=409)["error"]["code"] == "unknown_session"
        wire.write(only, [11, 12])
        wire.ctl("release", only)
        assert wire.control("create", "second", expect=429)["error"]["code"] == "capacity_exceeded"
