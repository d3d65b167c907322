"""One owner per session: Redis leases with growing fencing tokens, and the snapshot store refusing stale owners."""

from __future__ import annotations

import pytest
import torch

from coordination import redis_url  # noqa: F401  (pytest fixture)
from memt_core.checkpoint import read_checkpoint
from memt_core.errors import OwnershipConflict
from memt_core.memory.durable import DirectorySnapshotStore
from memt_core.memory.ownership import Owned, RedisOwnership
from memt_core.memory.state import MemoryState


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_one_owner_at_a_time_and_tokens_only_grow(redis_url):
    a = RedisOwnership(redis_url, owner="node-a", ttl=30)
    b = RedisOwnership(redis_url, owner="node-b", ttl=30)
    first = a.acquire("s")
    with pytest.raises(OwnershipConflict, match="owned by another server \\(node-a\\)"):
        b.acquire("s")
    again = a.acquire("s")  # re-acquiring its own session gives a newer token
    assert again > first and a.renew("s", again) and not a.renew("s", first)
    a.release("s", first)  # a stale token releases nothing
    with pytest.raises(OwnershipConflict):
        b.acquire("s")
    a.release("s", again)
    taken = b.acquire("s")
    assert taken > again and not a.renew("s", again)
    assert b.acquire("other") == 1  # tokens are per session


def test_an_expired_lease_can_be_taken_and_the_old_owner_cannot_renew(redis_url):
    a = RedisOwnership(redis_url, owner="node-a", ttl=0.2)
    b = RedisOwnership(redis_url, owner="node-b", ttl=30)
    token = a.acquire("s")
    a.client.pexpire("memt:owner:s", 1)  # the lease lapses (a paused or partitioned owner)
    while a.client.exists("memt:owner:s"):
        pass
    assert b.acquire("s") > token
    assert a.renew("s", token) is False


def test_owned_renews_at_half_time_and_reports_losses(redis_url):
    clock = Clock()
    owned = Owned(RedisOwnership(redis_url, owner="node-a", ttl=10), clock=clock)
    token = owned.acquire("s")
    clock.now = 4
    assert owned.renew_due() == [] and owned.tokens["s"] == (token, 0.0)  # not due yet
    clock.now = 6
    assert owned.renew_due() == [] and owned.tokens["s"] == (token, 6)
    RedisOwnership(redis_url, owner="x").client.delete("memt:owner:s")
    clock.now = 12
    assert owned.renew_due() == ["s"]
    owned.release("s")
    assert owned.token("s") is None


def test_a_fenced_out_owner_cannot_overwrite_the_store(redis_url, nano_checkpoint, tmp_path):
    checkpoint = read_checkpoint(nano_checkpoint)
    memory = checkpoint.memory
    store = DirectorySnapshotStore(tmp_path, identity=checkpoint.identity(), layers=memory.memory_layers, shape=memory.state_shape())
    mine = MemoryState({layer: torch.ones(memory.state_shape()) for layer in memory.memory_layers})
    a = RedisOwnership(redis_url, owner="node-a", ttl=30)
    b = RedisOwnership(redis_url, owner="node-b", ttl=30)
    old = a.acquire("s")
    store.save("s", 1, mine, fence=old)
    a.client.delete("memt:owner:s")  # node-a's lease is gone; node-b takes over
    new = b.acquire("s")
    store.save("s", 2, MemoryState(), fence=new)
    with pytest.raises(OwnershipConflict, match="newer owner \\(fencing token 2\\).*stale"):
        store.save("s", 3, mine, fence=old)
    with pytest.raises(OwnershipConflict):
        store.forget("s", fence=old)
    latest = store.latest("s")
    assert latest.version == 2 and latest.fence == new and store.load(latest).is_empty
