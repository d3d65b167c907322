"""Split brain cannot lose a version: two servers on one snapshot store, session ownership in Redis.

Server A owns a session; B is refused it. A is frozen (SIGSTOP, as a partition or a long pause would),
its lease lapses, B takes the session over from the store and publishes. A wakes up not knowing it lost
the session and publishes too: the store refuses A's stale write, and B's version stays.
"""

from __future__ import annotations

import json
import signal
import time

import redis

from coordination import redis_url  # noqa: F401  (pytest fixture)
from e2e.wire import Handle, Wire, assert_error


def server(memt_servers, checkpoint, store, url, name):
    return memt_servers(checkpoint, "--snapshot-store", str(store), "--ownership", url, "--ownership-ttl", "1.5", "--node-id", name)


def test_a_stale_owner_cannot_overwrite_its_successor(nano_checkpoint, memt_servers, redis_url, tmp_path):
    store = tmp_path / "store"
    a = server(memt_servers, nano_checkpoint, store, redis_url, "node-a")
    b = server(memt_servers, nano_checkpoint, store, redis_url, "node-b")
    with a.client() as http_a, b.client() as http_b:
        wire_a, wire_b = Wire(http_a), Wire(http_b)
        assert wire_a.capabilities["ownership"] is True
        h = wire_a.open("shared")
        wire_a.write(h, [1, 2, 3])
        response = wire_b.post_control({"action": "create", "session": "shared", "epoch": wire_b.epoch})
        assert_error(response, 409, match="owned by another server \\(node-a\\)")

        a.process.send_signal(signal.SIGSTOP)  # frozen: it cannot renew its lease
        try:
            coordination = redis.Redis.from_url(redis_url)
            deadline = time.monotonic() + 60
            while coordination.exists("memt:owner:shared"):
                assert time.monotonic() < deadline, "node-a's lease never lapsed"
                time.sleep(0.1)
            assert wire_b.control("create", "shared")["restored_version"] == 1
            taken = Handle("shared", wire_b.control("acquire", "shared")["lease"])
            wire_b.write(taken, [7, 8])
        finally:
            a.process.send_signal(signal.SIGCONT)

        wire_a.ctl("begin", h, transaction="late")
        wire_a.commit(h, "late", [4, 5, 6])
        refused = wire_a.post_control({"action": "publish", "session": "shared", "lease": h.lease, "epoch": wire_a.epoch,
                                       "transaction": "late"})
        assert_error(refused, 409, match="newer owner.*stale")
        manifest = json.loads((store / "sessions" / "shared.json").read_text())
        assert manifest["version"] == 2  # node-b's publish, untouched
        assert wire_b.ctl("inspect", taken)["published_version"] == 2


def test_an_unloaded_session_is_taken_over_at_once_by_another_server(nano_checkpoint, memt_servers, redis_url, tmp_path):
    """unload (explicit, as a drain does; or after --unload-idle without a lease) frees the session and its
    ownership while its memory stays in the store: the next server restores it, no waiting for a lapse."""
    store = tmp_path / "store"
    a = memt_servers(nano_checkpoint, "--snapshot-store", str(store), "--ownership", redis_url, "--node-id", "node-a", "--unload-idle", "1")
    b = memt_servers(nano_checkpoint, "--snapshot-store", str(store), "--ownership", redis_url, "--node-id", "node-b")
    with a.client() as http_a, b.client() as http_b:
        wire_a, wire_b = Wire(http_a), Wire(http_b)
        h = wire_a.open("moving")
        wire_a.write(h, [1, 2, 3])
        assert_error(wire_b.post_control({"action": "create", "session": "moving", "epoch": wire_b.epoch}), 409, match="owned by another server")
        assert wire_a.ctl("unload", h) == {"session": "moving", "unloaded": True, "published_version": 1}
        assert wire_b.control("create", "moving")["restored_version"] == 1  # at once: ownership was given up
        taken = Handle("moving", wire_b.control("acquire", "moving")["lease"])
        wire_b.write(taken, [4, 5])
        wire_b.ctl("release", taken)

        # idle: node-a takes it back once node-b frees it; node-a unloads it by itself a second after its release
        wire_b.ctl("unload", Handle("moving", wire_b.control("acquire", "moving")["lease"]))
        assert wire_a.control("create", "moving")["restored_version"] == 2
        deadline = time.monotonic() + 60
        while wire_a.post_control({"action": "inspect", "session": "moving", "epoch": wire_a.epoch}).status_code == 200:
            assert time.monotonic() < deadline, "node-a never unloaded the idle session"
            time.sleep(0.2)
        assert wire_b.control("create", "moving")["restored_version"] == 2
