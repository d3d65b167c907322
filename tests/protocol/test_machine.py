"""MemTProtocol transition by transition: bare events in, plans/tickets/typed errors out.

Time is a plain float that the test advances; lease tokens come from a counter. ``Driver.run`` plays
the engine: it answers each effect of a plan with a fake result and calls ``complete``.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memt_core.errors import (
    CapacityExceeded,
    EpochMismatch,
    InvalidRequest,
    LeaseConflict,
    MemTError,
    NonceReused,
    SessionBusy,
    SessionExists,
    TransactionConflict,
    UncertainSession,
    UnknownSession,
)
from memt_core.protocol import APPLIED, FAILED, UNKNOWN, Limits, MemTProtocol, Plan, parse_control, parse_generate
from memt_core.protocol import effects as fx
from memt_core.protocol.events import CONTROL_ACTIONS

EPOCH = "E1"
T0 = 1000.0
ENCODING = Limits().native_encoding


def counter_tokens():
    n = 0

    def new_token() -> str:
        nonlocal n
        n += 1
        return f"tok{n}"

    return new_token


def snapshot(proto: MemTProtocol, now: float) -> dict:
    """Everything observable about the protocol's state, for "a refusal changes nothing"."""
    sessions = {}
    for name, s in proto.sessions.items():
        sessions[name] = {
            "describe": proto.describe(s, now),
            "lease": (s.lease.token, s.lease.expires_at) if s.lease else None,
            "history": [(k, t.to_wire()) for k, t in s.history.items()],
            "nonces": sorted(s.nonces),
            "in_flight": dict(s.in_flight),
        }
    return {"sessions": sessions, "creating": sorted(proto._creating), "inflight_commits": proto.inflight_commits}


class Driver:
    """One protocol, a fake clock and a fake engine that answers effects."""

    def __init__(self, **limits):
        self.now = T0
        self.proto = MemTProtocol(epoch=EPOCH, limits=Limits(**limits), new_token=counter_tokens())
        self.effects: list[fx.Effect] = []  # every effect the fake engine carried out
        self.landed: list[str] = []  # what ReconcileCommits answers
        self.cancelled = True  # what CancelRequest answers
        self.files = 0

    def advance(self, seconds: float) -> None:
        self.now += seconds

    # -- control
    def plan(self, action: str, **fields) -> Plan:
        return self.proto.control(parse_control({"action": action, **fields}), self.now)

    def result(self, effect: fx.Effect):
        if isinstance(effect, fx.ExportSnapshot):
            if effect.file is not None:
                return effect.file
            self.files += 1
            return f"export-{self.files}.safetensors"
        if isinstance(effect, fx.ReconcileCommits):
            return list(self.landed)
        if isinstance(effect, fx.CancelRequest):
            return self.cancelled
        return None

    def run(self, plan: Plan) -> dict:
        results = [self.result(effect) for effect in plan.effects]
        self.effects.extend(plan.effects)
        return self.proto.complete(plan, results, self.now)

    def do(self, action: str, **fields) -> dict:
        return self.run(self.plan(action, **fields))

    def effects_of(self, action: str, **fields) -> tuple[fx.Effect, ...]:
        plan = self.plan(action, **fields)
        self.run(plan)
        return plan.effects

    def refuse(self, error: type[MemTError], status: int, call, *args, match: str = "", **kwargs) -> MemTError:
        """``call`` must raise ``error`` with ``status`` and change nothing."""
        before = snapshot(self.proto, self.now)
        with pytest.raises(error) as info:
            call(*args, **kwargs)
        assert info.value.status == status
        assert match in info.value.message, info.value.message
        assert snapshot(self.proto, self.now) == before
        return info.value

    def refuse_control(self, error, status, action: str, match: str = "", **fields) -> MemTError:
        return self.refuse(error, status, self.plan, action, match=match, **fields)

    # -- sessions in a known state
    def session(self, name: str = "s1", **create) -> str:
        """Create ``name`` and acquire it; returns the lease token."""
        self.do("create", session=name, **create)
        return self.do("acquire", session=name)["lease"]

    def txn(self, name: str = "s1", transaction: str = "t1", **create) -> str:
        lease = self.session(name, **create)
        self.do("begin", session=name, lease=lease, transaction=transaction)
        return lease

    # -- generation
    def query_event(self, session: str, lease: str, nonce: str, **extra):
        body = {"rid": f"memt|{session}|query|{nonce}", "input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4},
                "memt_lease": lease, "memt_epoch": EPOCH, **extra}
        return parse_generate(body, vocab_size=100, max_prefill_tokens=64)

    def commit_event(self, session: str, lease: str, transaction: str, nonce: str, n: int = 3, **extra):
        body = {"rid": f"memt|{session}|commit:{n}|{nonce}", "input_ids": list(range(n)), "sampling_params": {"max_new_tokens": 0},
                "memt_lease": lease, "memt_transaction": transaction, "memt_epoch": EPOCH, **extra}
        return parse_generate(body, vocab_size=100, max_prefill_tokens=64)

    def query(self, session, lease, nonce, **extra):
        return self.proto.start_query(self.query_event(session, lease, nonce, **extra), self.now)

    def commit(self, session, lease, transaction, nonce, n=3, **extra):
        return self.proto.start_commit(self.commit_event(session, lease, transaction, nonce, n, **extra), self.now)

    def committed(self, session, lease, transaction, nonce, outcome=APPLIED, n=3):
        ticket = self.commit(session, lease, transaction, nonce, n)
        self.proto.finish_commit(ticket, outcome, self.now)
        return ticket

    def receipts(self, session: str, lease: str) -> dict:
        return self.do("status", session=session, lease=lease)["receipts"]

    def inspect(self, session: str = "s1") -> dict:
        return self.do("inspect", session=session)


@pytest.fixture
def d() -> Driver:
    return Driver(max_sessions=4, max_inflight_commits=2)


# --------------------------------------------------------------------------- plans


def test_abandon_leaves_state_unchanged(d):
    lease = d.txn()
    d.committed("s1", lease, "t1", "n1")
    for action, fields in [
        ("publish", {"transaction": "t1"}), ("abort", {"transaction": "t1"}), ("reset", {}), ("close", {}),
        ("release", {}), ("memory_read", {"enabled": False}), ("renew", {"ttl": 5}), ("recover", {}),
        ("export", {"encoding": ENCODING}),
    ]:
        before = snapshot(d.proto, d.now)
        plan = d.plan(action, session="s1", lease=lease, **fields)
        assert d.inspect()["busy"] == action
        d.proto.abandon(plan)
        assert snapshot(d.proto, d.now) == before, action
    # an abandoned create frees its name and its capacity slot
    d2 = Driver(max_sessions=1)
    plan = d2.plan("create", session="a")
    d2.refuse_control(SessionExists, 409, "create", session="a")
    d2.refuse_control(CapacityExceeded, 429, "create", session="b")
    d2.proto.abandon(plan)
    assert snapshot(d2.proto, d2.now) == snapshot(Driver(max_sessions=1).proto, d2.now)
    d2.do("create", session="b")


def test_reserved_session_is_busy_for_control_and_generation(d):
    lease = d.txn()
    plan = d.plan("publish", session="s1", lease=lease, transaction="t1")
    d.refuse_control(SessionBusy, 409, "abort", session="s1", lease=lease, transaction="t1", match="busy with a 'publish' action")
    d.refuse_control(SessionBusy, 409, "status", session="s1", lease=lease)
    d.refuse(SessionBusy, 409, d.commit, "s1", lease, "t1", "n1")
    d.refuse(SessionBusy, 409, d.query, "s1", lease, "n2")
    assert d.inspect()["busy"] == "publish"  # inspect never needs the session to itself
    d.run(plan)
    assert d.inspect()["busy"] is None
    d.query("s1", lease, "n2")  # the refused nonces were not consumed


# --------------------------------------------------------------------------- create


def test_create_defaults(d):
    body = d.do("create", session="s1")
    assert body == {"session": "s1", "memory_read": True, "retain_kv": False, "source": None}
    assert d.effects == [fx.NewMemory("s1")]
    view = d.inspect()
    assert (view["memory_read"], view["leased"], view["transaction"], view["published_version"]) == (True, False, None, 0)


def test_create_options(d):
    assert d.do("create", session="s1", memory_read=False)["memory_read"] is False
    assert d.inspect()["memory_read"] is False


def test_create_generates_an_id_when_none_given(d):
    name = d.do("create")["session"]
    assert name == "s-tok1"
    assert d.effects == [fx.NewMemory(name)]
    assert d.inspect(name)["session"] == name


def test_create_duplicate_is_409(d):
    d.do("create", session="s1")
    d.refuse_control(SessionExists, 409, "create", session="s1", match="'s1' already exists")
    pending = d.plan("create", session="s2")  # a create still in progress holds its name too
    d.refuse_control(SessionExists, 409, "create", session="s2")
    d.run(pending)


def test_create_capacity_is_429():
    d = Driver(max_sessions=2)
    d.do("create", session="a")
    pending = d.plan("create", session="b")
    d.refuse_control(CapacityExceeded, 429, "create", session="c", match="session capacity reached (2 sessions per rank)")
    d.run(pending)
    d.refuse_control(CapacityExceeded, 429, "create", session="c")
    lease = d.do("acquire", session="a")["lease"]
    d.do("close", session="a", lease=lease)
    d.do("create", session="c")


def test_retain_kv_needs_the_server_flag():
    d = Driver(max_sessions=2)
    d.refuse_control(InvalidRequest, 400, "create", session="s1", retain_kv=True, match="--enable-streaming-session")
    d = Driver(max_sessions=2, retain_kv_enabled=True)
    assert d.do("create", session="s1", retain_kv=True)["retain_kv"] is True
    assert d.inspect()["retain_kv"] is True


def test_create_copy_needs_the_sources_valid_lease(d):
    lease = d.session("src")
    d.refuse_control(LeaseConflict, 409, "create", session="dst", source="src", match="needs its valid lease in 'source_lease'")
    d.refuse_control(LeaseConflict, 409, "create", session="dst", source="src", source_lease="tok999")
    d.refuse_control(LeaseConflict, 409, "create", session="dst", source="src", source_lease="tök")  # non-ASCII: refused, not a crash
    d.refuse_control(UnknownSession, 409, "create", session="dst", source="nope", source_lease=lease)
    d.refuse_control(InvalidRequest, 400, "create", session="dst", source_lease=lease, match="only meaningful with 'source'")
    plan = d.plan("create", session="dst", source="src", source_lease=lease)
    assert plan.effects == (fx.CopyMemory("dst", source="src"),)
    assert d.run(plan)["source"] == "src"
    assert d.inspect("dst")["leased"] is False  # the copy is a new session without a lease
    d.advance(300)
    d.refuse_control(LeaseConflict, 409, "create", session="dst2", source="src", source_lease=lease)


def test_create_epoch(d):
    d.refuse_control(EpochMismatch, 409, "create", session="s1", epoch="E0", match="the server restarted")
    d.do("create", session="s1", epoch=EPOCH)


# --------------------------------------------------------------------------- leases


def test_acquire_renew_release(d):
    d.do("create", session="s1")
    body = d.do("acquire", session="s1")
    assert body == {"session": "s1", "lease": "tok1", "ttl": 300, "abandoned_transaction": None}
    assert d.inspect()["leased"] is True and d.inspect()["lease_expires_in"] == 300
    d.refuse_control(LeaseConflict, 409, "acquire", session="s1", match="leased by another client")
    d.advance(200)
    assert d.do("renew", session="s1", lease="tok1", ttl=300) == {"session": "s1", "lease": "tok1", "ttl": 300}
    d.advance(250)  # 450 s after acquire, 250 s after renew
    assert d.inspect()["leased"] is True
    assert d.do("release", session="s1", lease="tok1") == {"session": "s1", "released": True, "abandoned_transaction": None,
                                                                 "cancelled_requests": [], "pending_commits": [], "reconciled": False}
    assert d.inspect()["leased"] is False
    d.refuse_control(LeaseConflict, 409, "renew", session="s1", lease="tok1", match="missing, wrong, or released")
    assert d.do("acquire", session="s1", ttl=10)["lease"] == "tok2"


def test_lease_expires_at_ttl(d):
    d.do("create", session="s1")
    lease = d.do("acquire", session="s1", ttl=60)["lease"]
    d.advance(59.999)
    d.do("renew", session="s1", lease=lease, ttl=60)
    d.advance(60)
    assert d.inspect()["leased"] is False
    d.refuse_control(LeaseConflict, 409, "renew", session="s1", lease=lease, match="expired")
    d.refuse_control(LeaseConflict, 409, "begin", session="s1", lease=lease, transaction="t1", match="expired")
    d.refuse(LeaseConflict, 409, d.query, "s1", lease, "n1", match="expired")
    assert d.do("acquire", session="s1")["lease"] != lease


def test_wrong_lease_cannot_act(d):
    lease = d.txn()
    for wrong in ("tok999", "", "tök1", lease + "x"):
        d.refuse_control(LeaseConflict, 409, "begin", session="s1", lease=wrong, transaction="t2")
        d.refuse_control(LeaseConflict, 409, "status", session="s1", lease=wrong)
        d.refuse_control(LeaseConflict, 409, "release", session="s1", lease=wrong)
        d.refuse_control(LeaseConflict, 409, "close", session="s1", lease=wrong)
        if wrong:
            d.refuse(LeaseConflict, 409, d.query, "s1", wrong, "n1")
            d.refuse(LeaseConflict, 409, d.commit, "s1", wrong, "t1", "n1")


def test_takeover_after_expiry_abandons_the_open_transaction(d):
    lease_a = d.txn()
    d.committed("s1", lease_a, "t1", "n1")
    d.advance(300)
    plan = d.plan("acquire", session="s1")
    assert plan.effects == (fx.DropCandidate("s1", transaction="t1"),)
    body = d.run(plan)
    lease_b = body["lease"]
    assert body["abandoned_transaction"] == "t1" and lease_b != lease_a
    receipts = d.receipts("s1", lease_b)
    assert receipts["t1"]["state"] == "abandoned"
    assert receipts["t1"]["commits"] == [{"nonce": "n1", "tokens": 3, "status": APPLIED}]
    assert d.inspect()["published_version"] == 0  # nothing of t1 was published
    # the old holder is locked out, even for actions that accept an expired lease
    d.refuse_control(LeaseConflict, 409, "begin", session="s1", lease=lease_a, transaction="t2")
    d.refuse_control(LeaseConflict, 409, "status", session="s1", lease=lease_a)
    d.refuse_control(LeaseConflict, 409, "recover", session="s1", lease=lease_a)
    d.refuse_control(LeaseConflict, 409, "release", session="s1", lease=lease_a)
    d.refuse(LeaseConflict, 409, d.commit, "s1", lease_a, "t1", "n2")


def test_release_abandons_open_transaction_and_works_after_expiry(d):
    lease = d.txn()
    d.advance(301)
    plan = d.plan("release", session="s1", lease=lease)
    assert plan.effects == (fx.DropCandidate("s1", transaction="t1"),)
    assert d.run(plan)["abandoned_transaction"] == "t1"
    lease2 = d.do("acquire", session="s1")["lease"]
    assert d.receipts("s1", lease2)["t1"]["state"] == "abandoned"


def test_acquire_waits_for_requests_in_flight_and_release_cancels_them(d):
    lease = d.session()
    ticket = d.query("s1", lease, "n1")
    d.advance(301)
    d.refuse_control(SessionBusy, 409, "acquire", session="s1", match="request in flight")
    plan = d.proto.control(parse_control({"action": "release", "session": "s1", "lease": lease}), d.now)
    assert plan.effects == (fx.CancelRequest("s1", rid=ticket.rid),)
    assert d.run(plan)["cancelled_requests"] == [ticket.rid]
    d.refuse_control(SessionBusy, 409, "acquire", session="s1", match="request in flight")  # until the query ends
    d.proto.finish_query(ticket, d.now)
    d.do("acquire", session="s1")


# --------------------------------------------------------------------------- transactions


def test_begin_publish(d):
    lease = d.session()
    plan = d.plan("begin", session="s1", lease=lease, transaction="t1")
    assert plan.effects == (fx.ForkCandidate("s1", transaction="t1"),)
    assert d.run(plan) == {"session": "s1", "transaction": "t1", "state": "open"}
    d.refuse_control(TransactionConflict, 409, "begin", session="s1", lease=lease, transaction="t2", match="already has open transaction 't1'")
    d.committed("s1", lease, "t1", "n1")
    d.committed("s1", lease, "t1", "n2", FAILED)
    d.refuse_control(TransactionConflict, 409, "publish", session="s1", lease=lease, transaction="t2", match="open transaction 't1', not 't2'")
    plan = d.plan("publish", session="s1", lease=lease, transaction="t1")
    assert plan.effects == (fx.PublishCandidate("s1", transaction="t1"),)
    assert d.run(plan) == {"session": "s1", "transaction": "t1", "state": "published", "memory_read": True, "commits": 1}
    view = d.inspect()
    assert (view["transaction"], view["published_version"]) == (None, 1)
    receipts = d.receipts("s1", lease)["t1"]
    assert receipts["state"] == "published"
    assert [c["status"] for c in receipts["commits"]] == [APPLIED, FAILED]
    d.refuse_control(TransactionConflict, 409, "publish", session="s1", lease=lease, transaction="t1", match="no open transaction")
    d.refuse_control(TransactionConflict, 409, "begin", session="s1", lease=lease, transaction="t1", match="already used")


def test_publish_sets_memory_read_when_given(d):
    lease = d.txn()
    assert d.do("publish", session="s1", lease=lease, transaction="t1", memory_read=False)["memory_read"] is False
    assert d.inspect()["memory_read"] is False
    d.do("begin", session="s1", lease=lease, transaction="t2")
    assert d.do("publish", session="s1", lease=lease, transaction="t2")["memory_read"] is False  # omitted: unchanged
    d.do("begin", session="s1", lease=lease, transaction="t3")
    assert d.do("publish", session="s1", lease=lease, transaction="t3", memory_read=True)["memory_read"] is True


def test_abort(d):
    lease = d.txn()
    d.committed("s1", lease, "t1", "n1")
    d.refuse_control(TransactionConflict, 409, "abort", session="s1", lease=lease, transaction="t9")
    plan = d.plan("abort", session="s1", lease=lease, transaction="t1")
    assert plan.effects == (fx.DropCandidate("s1", transaction="t1"),)
    assert d.run(plan) == {"session": "s1", "transaction": "t1", "state": "aborted"}
    assert d.inspect()["published_version"] == 0
    assert d.receipts("s1", lease)["t1"]["state"] == "aborted"
    d.refuse_control(TransactionConflict, 409, "abort", session="s1", lease=lease, transaction="t1", match="no open transaction")
    d.refuse_control(TransactionConflict, 409, "begin", session="s1", lease=lease, transaction="t1", match="already used")
    d.do("begin", session="s1", lease=lease, transaction="t2")


def test_commits_must_name_the_open_transaction(d):
    lease = d.session()
    d.refuse(TransactionConflict, 409, d.commit, "s1", lease, "t1", "n1", match="no open transaction")
    d.do("begin", session="s1", lease=lease, transaction="t1")
    d.refuse(TransactionConflict, 409, d.commit, "s1", lease, "t2", "n1", match="not 't2'")
    ticket = d.commit("s1", lease, "t1", "n1")
    assert (ticket.kind, ticket.transaction, ticket.nonce, ticket.rid) == ("commit", "t1", "n1", "memt|s1|commit:3|n1")


def test_publish_abort_reset_close_wait_for_a_commit_but_release_does_not(d):
    lease = d.txn()
    ticket = d.commit("s1", lease, "t1", "n1")
    for action, fields in [("publish", {"transaction": "t1"}), ("abort", {"transaction": "t1"}), ("reset", {}),
                           ("close", {}), ("memory_read", {"enabled": False}), ("recover", {}),
                           ("export", {"encoding": ENCODING}), ("import", {"transaction": "t1", "file": "m.safetensors", "encoding": ENCODING})]:
        d.refuse_control(SessionBusy, 409, action, session="s1", lease=lease, match="request in flight", **fields)
    assert d.receipts("s1", lease)["t1"]["commits"][0]["status"] == "pending"
    d.proto.finish_commit(ticket, APPLIED, d.now)
    assert d.do("publish", session="s1", lease=lease, transaction="t1")["commits"] == 1


def test_read_history_says_which_version_each_query_read():
    d = Driver(max_sessions=4, max_inflight_commits=2, reads_kept=3, read_histories=2)
    lease = d.txn()
    d.proto.finish_query(d.query("s1", lease, "q0"), d.now, read={"completion_tokens": 4})
    d.committed("s1", lease, "t1", "c1")
    d.do("publish", session="s1", lease=lease, transaction="t1")
    d.proto.finish_query(d.query("s1", lease, "q1"), d.now, read={"completion_tokens": 2, "at": 123.0})
    reads = d.inspect()["reads"]
    assert reads == [
        {"request_id": "memt|s1|query|q0", "memory_read": True, "memory_version": 0, "completion_tokens": 4},
        {"request_id": "memt|s1|query|q1", "memory_read": True, "memory_version": 1, "completion_tokens": 2, "at": 123.0},
    ]
    assert d.do("status", session="s1", lease=lease)["reads"] == reads
    d.do("memory_read", session="s1", lease=lease, enabled=False)
    for n in range(2, 5):
        d.proto.finish_query(d.query("s1", lease, f"q{n}"), d.now)
    reads = d.inspect()["reads"]
    assert [r["request_id"][-2:] for r in reads] == ["q2", "q3", "q4"]  # bounded, oldest first
    assert all(r["memory_read"] is False and r["memory_version"] is None for r in reads)
    for name in ("s2", "s3"):  # LRU across sessions: s1 is the least recently read
        other = d.session(name)
        d.proto.finish_query(d.query(name, other, "q"), d.now)
    assert d.inspect("s1")["reads"] == [] and len(d.inspect("s3")["reads"]) == 1
    d.do("close", session="s3", lease=d.proto.sessions["s3"].lease.token)
    assert "s3" not in d.proto.reads


# --------------------------------------------------------------------------- other actions


def test_memory_read(d):
    lease = d.session()
    assert d.do("memory_read", session="s1", lease=lease, enabled=False) == {"session": "s1", "memory_read": False}
    assert d.query("s1", lease, "n1").memory_read is False
    d.refuse_control(SessionBusy, 409, "memory_read", session="s1", lease=lease, enabled=True)


def test_export(d):
    lease = d.txn()
    d.refuse_control(InvalidRequest, 400, "export", session="s1", lease=lease, encoding="raw", match="does not match this server's native encoding")
    plan = d.plan("export", session="s1", lease=lease, encoding=ENCODING)
    assert plan.effects == (fx.ExportSnapshot("s1", transaction=None, file=None, overwrite=False),)
    assert d.run(plan) == {"session": "s1", "file": "export-1.safetensors", "transaction": None, "encoding": ENCODING}
    plan = d.plan("export", session="s1", lease=lease, encoding=ENCODING, transaction="t1", file="c.safetensors", overwrite=True)
    assert plan.effects == (fx.ExportSnapshot("s1", transaction="t1", file="c.safetensors", overwrite=True),)
    assert d.run(plan)["file"] == "c.safetensors"
    d.refuse_control(TransactionConflict, 409, "export", session="s1", lease=lease, encoding=ENCODING, transaction="t2")
    for bad in ("../x.safetensors", "x.bin", ".x.safetensors"):
        d.refuse_control(InvalidRequest, 400, "export", session="s1", lease=lease, encoding=ENCODING, file=bad, match="snapshot name")
    d.refuse_control(LeaseConflict, 409, "export", session="s1", lease="tok999", encoding=ENCODING)


def test_export_while_uncertain(d):
    lease = d.txn()
    d.committed("s1", lease, "t1", "n1", UNKNOWN)
    d.refuse_control(UncertainSession, 409, "export", session="s1", lease=lease, encoding=ENCODING, transaction="t1")
    d.do("export", session="s1", lease=lease, encoding=ENCODING)  # published memory is never uncertain


def test_import(d):
    lease = d.session()
    d.refuse_control(TransactionConflict, 409, "import", session="s1", lease=lease, transaction="t1", file="m.safetensors", encoding=ENCODING)
    d.do("begin", session="s1", lease=lease, transaction="t1")
    d.refuse_control(InvalidRequest, 400, "import", session="s1", lease=lease, transaction="t1", file="m.safetensors", encoding="x",
                     match="native encoding")
    d.refuse_control(InvalidRequest, 400, "import", session="s1", lease=lease, transaction="t1", file="/etc/m.safetensors",
                     encoding=ENCODING, match="simple file name")
    plan = d.plan("import", session="s1", lease=lease, transaction="t1", file="m.safetensors", encoding=ENCODING)
    assert plan.effects == (fx.ImportSnapshot("s1", transaction="t1", file="m.safetensors"),)
    assert d.run(plan) == {"session": "s1", "transaction": "t1", "file": "m.safetensors", "state": "open"}
    assert d.receipts("s1", lease)["t1"]["imported"] == "m.safetensors"
    d.do("publish", session="s1", lease=lease, transaction="t1")
    assert d.inspect()["published_version"] == 1


def test_inspect_needs_no_lease_and_hides_the_token(d):
    lease = d.txn()
    d.query("s1", lease, "n1")
    plan = d.plan("inspect", session="s1")
    assert plan.effects == () and not plan.reserved
    body = d.run(plan)
    assert lease not in repr(body)
    assert body == {
        "session": "s1", "memory_read": True, "retain_kv": False, "leased": True, "lease_expires_in": 300.0,
        "transaction": "t1", "published_version": 0, "uncertain": False, "in_flight": ["memt|s1|query|n1"], "busy": None, "reads": [],
    }
    d.refuse_control(UnknownSession, 409, "inspect", session="nope", match="'nope' does not exist")
    d.refuse_control(EpochMismatch, 409, "inspect", session="s1", epoch="E0")


def test_status_lists_receipts(d):
    lease = d.txn()
    d.committed("s1", lease, "t1", "n1")
    d.committed("s1", lease, "t1", "n2", FAILED, n=5)
    d.commit("s1", lease, "t1", "n3", n=2)
    body = d.do("status", session="s1", lease=lease)
    assert body["transaction"] == "t1" and body["uncertain"] is False
    assert body["in_flight"] == ["memt|s1|commit:2|n3"]
    assert body["receipts"] == {"t1": {"transaction": "t1", "state": "open", "imported": None, "commits": [
        {"nonce": "n1", "tokens": 3, "status": APPLIED},
        {"nonce": "n2", "tokens": 5, "status": FAILED},
        {"nonce": "n3", "tokens": 2, "status": "pending"},
    ]}}
    d.advance(400)
    assert d.do("status", session="s1", lease=lease)["receipts"]["t1"]["state"] == "open"  # the holder may look after expiry


def test_receipts_kept_bounds_history():
    d = Driver(receipts_kept=2)
    lease = d.session()
    for t in ("t1", "t2", "t3"):
        d.do("begin", session="s1", lease=lease, transaction=t)
        d.do("abort", session="s1", lease=lease, transaction=t)
    assert list(d.receipts("s1", lease)) == ["t2", "t3"]


def test_recover_resolves_uncertain_commits(d):
    lease = d.txn()
    d.committed("s1", lease, "t1", "n1")
    d.committed("s1", lease, "t1", "n2", UNKNOWN)
    assert d.inspect()["uncertain"] is True
    d.refuse(UncertainSession, 409, d.commit, "s1", lease, "t1", "n3", match="call status and recover")
    d.refuse_control(UncertainSession, 409, "publish", session="s1", lease=lease, transaction="t1")
    d.refuse_control(UncertainSession, 409, "import", session="s1", lease=lease, transaction="t1", file="m.safetensors", encoding=ENCODING)
    assert d.receipts("s1", lease)["t1"]["commits"][1]["status"] == UNKNOWN
    d.advance(299)
    d.landed = ["n1", "n2"]
    plan = d.plan("recover", session="s1", lease=lease, ttl=600)
    assert plan.effects == (fx.ReconcileCommits("s1", transaction="t1"),)
    body = d.run(plan)
    assert body["recovered"] is True and body["lease"] == lease and body["ttl"] == 600
    assert [c["status"] for c in body["transaction"]["commits"]] == [APPLIED, APPLIED]
    assert d.inspect()["uncertain"] is False
    assert d.inspect()["lease_expires_in"] == 600  # renewed
    assert d.do("publish", session="s1", lease=lease, transaction="t1")["commits"] == 2


def test_recover_marks_commits_that_did_not_land_failed(d):
    lease = d.txn()
    d.committed("s1", lease, "t1", "n1", UNKNOWN)
    d.landed = []
    body = d.do("recover", session="s1", lease=lease)
    assert body["transaction"]["commits"] == [{"nonce": "n1", "tokens": 3, "status": FAILED}]
    d.committed("s1", lease, "t1", "n2")  # writes are allowed again
    assert d.do("publish", session="s1", lease=lease, transaction="t1")["commits"] == 1


def test_recover_after_the_uncertain_transaction_ended(d):
    lease = d.txn()
    d.committed("s1", lease, "t1", "n1", UNKNOWN)
    d.do("abort", session="s1", lease=lease, transaction="t1")  # abort needs no certainty
    d.refuse_control(UncertainSession, 409, "begin", session="s1", lease=lease, transaction="t2")
    plan = d.plan("recover", session="s1", lease=lease)
    assert plan.effects == ()
    d.run(plan)
    assert d.receipts("s1", lease)["t1"]["commits"][0]["status"] == FAILED
    d.do("begin", session="s1", lease=lease, transaction="t2")


def test_release_reconciles_uncertain_commits(d):
    lease = d.txn()
    d.committed("s1", lease, "t1", "n1", UNKNOWN)
    d.landed = []
    plan = d.plan("release", session="s1", lease=lease)
    assert plan.effects == (fx.ReconcileCommits("s1", transaction="t1"), fx.DropCandidate("s1", transaction="t1"))
    body = d.run(plan)
    assert body["released"] is True and body["reconciled"] is True and body["abandoned_transaction"] == "t1"
    assert d.inspect()["uncertain"] is False and d.inspect()["leased"] is False
    lease2 = d.do("acquire", session="s1")["lease"]
    receipt = d.receipts("s1", lease2)["t1"]
    assert receipt["state"] == "abandoned"
    assert [c["status"] for c in receipt["commits"]] == [FAILED]


def test_release_during_a_commit_records_its_outcome_in_the_abandoned_transaction(d):
    lease = d.txn()
    ticket = d.commit("s1", lease, "t1", "n1")
    body = d.do("release", session="s1", lease=lease)
    assert body["pending_commits"] == [ticket.rid] and body["abandoned_transaction"] == "t1"
    d.refuse_control(SessionBusy, 409, "acquire", session="s1", match="request in flight")
    d.proto.finish_commit(ticket, FAILED, d.now)  # the engine found its candidate gone
    lease2 = d.do("acquire", session="s1")["lease"]
    assert d.receipts("s1", lease2)["t1"]["commits"] == [{"nonce": "n1", "tokens": 3, "status": FAILED}]
    assert d.proto.inflight_commits == 0


def test_recover_renews_an_expired_lease_and_needs_no_uncertainty(d):
    lease = d.session()
    d.advance(1000)
    plan = d.plan("recover", session="s1", lease=lease, ttl=30)
    assert plan.effects == ()
    assert d.run(plan)["transaction"] is None
    assert d.inspect()["leased"] is True and d.inspect()["lease_expires_in"] == 30


def test_queries_are_allowed_while_uncertain(d):
    lease = d.txn()
    d.committed("s1", lease, "t1", "n1", UNKNOWN)
    d.proto.finish_query(d.query("s1", lease, "n2"), d.now)  # they read published memory, which is certain


def test_cancel(d):
    lease = d.session()
    ticket = d.query("s1", lease, "n1")
    plan = d.plan("cancel", session="s1", lease=lease, request_id=ticket.rid)
    assert plan.effects == (fx.CancelRequest("s1", rid="memt|s1|query|n1"),) and not plan.reserved
    assert d.run(plan) == {"session": "s1", "request_id": ticket.rid, "cancelled": True}
    d.cancelled = False  # the query finished before the engine could stop it
    assert d.do("cancel", session="s1", lease=lease, request_id=ticket.rid)["cancelled"] is False
    d.proto.finish_query(ticket, d.now)
    plan = d.plan("cancel", session="s1", lease=lease, request_id=ticket.rid)
    assert plan.effects == ()
    assert d.run(plan)["cancelled"] is False
    assert d.do("cancel", session="s1", lease=lease, request_id="memt|s1|query|nope")["cancelled"] is False
    d.refuse_control(LeaseConflict, 409, "cancel", session="s1", lease="tok999", request_id=ticket.rid)


def test_commits_cannot_be_cancelled(d):
    lease = d.txn()
    ticket = d.commit("s1", lease, "t1", "n1")
    d.refuse_control(InvalidRequest, 400, "cancel", session="s1", lease=lease, request_id=ticket.rid, match="only queries can be cancelled")


def test_kv_reset_needs_retain_kv():
    d = Driver(max_sessions=2, retain_kv_enabled=True)
    lease = d.session("plain")
    d.refuse_control(InvalidRequest, 400, "kv_reset", session="plain", lease=lease, match="was not created with retain_kv")
    lease = d.session("kv", retain_kv=True)
    plan = d.plan("kv_reset", session="kv", lease=lease)
    assert plan.effects == (fx.DropRetainedKV("kv"),)
    assert d.run(plan) == {"session": "kv", "kv_reset": True}


def test_session_params_need_retain_kv():
    d = Driver(max_sessions=2, retain_kv_enabled=True)
    lease = d.session("plain")
    d.refuse(InvalidRequest, 400, d.query, "plain", lease, "n1", session_params={"id": "plain"}, match="retain_kv")
    lease = d.session("kv", retain_kv=True)
    ticket = d.query("kv", lease, "n1", session_params={"id": "kv"})
    assert ticket.retain_kv is True


def test_reset(d):
    lease = d.txn()
    d.committed("s1", lease, "t1", "n1")
    plan = d.plan("reset", session="s1", lease=lease)
    assert plan.effects == (fx.DropCandidate("s1", transaction="t1"), fx.ClearMemory("s1"))
    assert d.run(plan) == {"session": "s1", "reset": True, "aborted_transaction": "t1"}
    assert d.receipts("s1", lease)["t1"]["state"] == "aborted"
    view = d.inspect()
    assert (view["transaction"], view["published_version"]) == (None, 1)
    plan = d.plan("reset", session="s1", lease=lease)
    assert plan.effects == (fx.ClearMemory("s1"),)
    assert d.run(plan)["aborted_transaction"] is None


def test_close(d):
    lease = d.txn()
    d.committed("s1", lease, "t1", "n1")
    plan = d.plan("close", session="s1", lease=lease)
    assert plan.effects == (fx.DropSession("s1"),)
    assert d.run(plan) == {"session": "s1", "closed": True}
    for action, fields in [("acquire", {}), ("inspect", {}), ("status", {"lease": lease}), ("begin", {"lease": lease, "transaction": "t2"}),
                           ("close", {"lease": lease})]:
        d.refuse_control(UnknownSession, 409, action, session="s1", match="'s1' does not exist", **fields)
    d.refuse(UnknownSession, 409, d.query, "s1", lease, "n2")
    # the name is free again, with a fresh nonce space
    lease2 = d.txn()
    d.committed("s1", lease2, "t1", "n1")


# --------------------------------------------------------------------------- generation requests


def test_query_ticket(d):
    lease = d.session()
    ticket = d.query("s1", lease, "n1")
    assert (ticket.session, ticket.rid, ticket.kind, ticket.memory_read, ticket.nonce) == ("s1", "memt|s1|query|n1", "query", True, "n1")
    assert d.inspect()["in_flight"] == ["memt|s1|query|n1"]
    d.proto.finish_query(ticket, d.now)
    assert d.inspect()["in_flight"] == []
    d.proto.finish_query(ticket, d.now)  # finishing twice is harmless


def test_one_request_in_flight_per_session(d):
    lease = d.txn()
    ticket = d.query("s1", lease, "n1")
    d.refuse(SessionBusy, 409, d.query, "s1", lease, "n2", match="request in flight")
    d.refuse(SessionBusy, 409, d.commit, "s1", lease, "t1", "n2")
    d.proto.finish_query(ticket, d.now)
    ticket = d.commit("s1", lease, "t1", "n2")
    d.refuse(SessionBusy, 409, d.query, "s1", lease, "n3")
    d.proto.finish_commit(ticket, APPLIED, d.now)
    d.query("s1", lease, "n3")


def test_unknown_session_on_generation(d):
    d.refuse(UnknownSession, 409, d.query, "nope", "tok1", "n1")


def test_epoch_mismatch_on_control_and_generation(d):
    lease = d.txn()
    for action, fields in [("renew", {}), ("begin", {"transaction": "t2"}), ("status", {}), ("close", {}), ("acquire", {})]:
        d.refuse_control(EpochMismatch, 409, action, session="s1", lease=lease, epoch="E0", match="not this server's epoch", **fields)
    d.refuse(EpochMismatch, 409, d.query, "s1", lease, "n1", memt_epoch="E0")
    d.refuse(EpochMismatch, 409, d.commit, "s1", lease, "t1", "n1", memt_epoch="E0")
    d.do("renew", session="s1", lease=lease, epoch=EPOCH)
    d.committed("s1", lease, "t1", "n1")  # the refused nonce was not consumed


def test_nonce_reuse_is_refused_and_never_applied_twice(d):
    lease = d.txn()
    d.proto.finish_query(d.query("s1", lease, "n1"), d.now)
    d.refuse(NonceReused, 409, d.query, "s1", lease, "n1", match="nonce 'n1' was already used")
    d.refuse(NonceReused, 409, d.commit, "s1", lease, "t1", "n1")
    d.committed("s1", lease, "t1", "n2")
    d.refuse(NonceReused, 409, d.commit, "s1", lease, "t1", "n2")
    d.committed("s1", lease, "t1", "n3", FAILED)
    d.refuse(NonceReused, 409, d.commit, "s1", lease, "t1", "n3")  # a failed write is not replayed under its nonce either
    d.do("publish", session="s1", lease=lease, transaction="t1")
    d.do("begin", session="s1", lease=lease, transaction="t2")
    d.refuse(NonceReused, 409, d.commit, "s1", lease, "t2", "n2")  # nonces outlive transactions
    d.do("release", session="s1", lease=lease)
    lease = d.do("acquire", session="s1")["lease"]
    d.refuse(NonceReused, 409, d.query, "s1", lease, "n1")  # ... and leases
    receipts = d.receipts("s1", lease)
    assert [c["nonce"] for c in receipts["t1"]["commits"]] == ["n2", "n3"]
    # another session has its own nonces
    lease_b = d.session("s2")
    d.proto.finish_query(d.query("s2", lease_b, "n1"), d.now)


def test_inflight_commit_capacity_is_429_and_keeps_the_nonce():
    d = Driver(max_sessions=3, max_inflight_commits=1)
    lease_a = d.txn("a")
    lease_b = d.txn("b")
    ticket = d.commit("a", lease_a, "t1", "n1")
    assert d.proto.inflight_commits == 1
    d.refuse(CapacityExceeded, 429, d.commit, "b", lease_b, "t1", "n1", match="in-flight commit capacity reached (1 per rank)")
    d.proto.finish_query(d.query("b", lease_b, "q1"), d.now)  # queries do not count
    d.proto.finish_commit(ticket, APPLIED, d.now)
    assert d.proto.inflight_commits == 0
    ticket = d.commit("b", lease_b, "t1", "n1")  # the refused nonce is still free
    d.proto.finish_commit(ticket, FAILED, d.now)
    assert d.proto.counts(d.now)["inflight_commits"] == 0


def test_finish_commit_twice_counts_once(d):
    lease = d.txn()
    ticket = d.commit("s1", lease, "t1", "n1")
    d.proto.finish_commit(ticket, APPLIED, d.now)
    before = snapshot(d.proto, d.now)
    d.proto.finish_commit(ticket, UNKNOWN, d.now)
    assert snapshot(d.proto, d.now) == before
    assert d.proto.inflight_commits == 0
    with pytest.raises(ValueError):
        d.proto.finish_commit(ticket, "landed", d.now)


def test_finish_commit_unknown_makes_the_session_uncertain(d):
    lease = d.txn()
    d.committed("s1", lease, "t1", "n1", UNKNOWN)
    view = d.inspect()
    assert view["uncertain"] is True and view["in_flight"] == []
    assert d.proto.counts(d.now)["uncertain_sessions"] == 1
    d.refuse(UncertainSession, 409, d.commit, "s1", lease, "t1", "n2")
    d.refuse_control(UncertainSession, 409, "publish", session="s1", lease=lease, transaction="t1")
    d.do("abort", session="s1", lease=lease, transaction="t1")
    d.refuse_control(UncertainSession, 409, "begin", session="s1", lease=lease, transaction="t2")
    d.do("recover", session="s1", lease=lease)
    d.do("begin", session="s1", lease=lease, transaction="t2")


def test_reap_abandons_expired_transactions(d):
    lease = d.txn()
    d.committed("s1", lease, "t1", "n1")
    lease2 = d.txn("s2")
    d.session("s3")  # no transaction: nothing to reap
    assert d.proto.reap(d.now + 299) == []
    d.advance(300)
    assert d.proto.reap(d.now) == [fx.DropCandidate("s1", transaction="t1"), fx.DropCandidate("s2", transaction="t1")]
    assert d.proto.reap(d.now) == []
    assert d.inspect()["transaction"] is None and d.inspect()["leased"] is False
    # the holder is told its lease expired, as before the reaper ran, and still sees what became of its work
    d.refuse_control(LeaseConflict, 409, "renew", session="s1", lease=lease, match="expired")
    assert d.receipts("s1", lease)["t1"]["state"] == "abandoned"
    taken = d.do("acquire", session="s1")
    assert taken["abandoned_transaction"] == "t1"  # as if the reaper had not run: the taker learns what it ends
    assert d.receipts("s1", taken["lease"])["t1"]["state"] == "abandoned"
    assert d.do("release", session="s2", lease=lease2)["abandoned_transaction"] == "t1"
    # told once: the next holder of either session inherits nothing
    assert d.do("acquire", session="s2")["abandoned_transaction"] is None
    d.do("release", session="s1", lease=taken["lease"])
    assert d.do("acquire", session="s1")["abandoned_transaction"] is None
    assert d.inspect("s3")["lease_expires_in"] == 0.0


def test_reap_spares_busy_and_uncertain_sessions(d):
    lease = d.txn("busy")
    ticket = d.commit("busy", lease, "t1", "n1")
    lease_u = d.txn("unsure")
    d.committed("unsure", lease_u, "t1", "n1", UNKNOWN)
    lease_r = d.txn("reserved")
    plan = d.plan("memory_read", session="reserved", lease=lease_r, enabled=False)
    d.advance(301)
    assert d.proto.reap(d.now) == []
    d.proto.finish_commit(ticket, APPLIED, d.now)
    d.proto.abandon(plan)
    assert d.proto.reap(d.now) == [fx.DropCandidate("busy", transaction="t1"), fx.DropCandidate("reserved", transaction="t1")]
    # the uncertain session waits for its holder to recover
    d.landed = ["n1"]
    assert d.do("recover", session="unsure", lease=lease_u)["transaction"]["commits"][0]["status"] == APPLIED


def test_a_finished_cancel_does_not_free_a_pending_create():
    """complete()/abandon() of a plan for a closed session must not release a create of the same name."""
    d = Driver(max_sessions=2)
    lease = d.session("s1")
    ticket = d.query("s1", lease, "n1")
    cancel = d.plan("cancel", session="s1", lease=lease, request_id=ticket.rid)
    d.proto.finish_query(ticket, d.now)
    d.do("close", session="s1", lease=lease)
    create = d.plan("create", session="s1")
    d.run(cancel)  # the engine answers the cancel late
    d.refuse_control(SessionExists, 409, "create", session="s1")
    d.run(create)


# --------------------------------------------------------------------------- odd client strings never crash the machine

STRING_FIELDS = ["lease", "epoch", "encoding", "file", "request_id", "source", "source_lease", "transaction", "session"]
odd_strings = st.text(max_size=8) | st.sampled_from(["tok1", "tok2", "t1", "s1", "s2", EPOCH, ENCODING, "m.safetensors", "memt|s1|query|q1"])


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(action=st.sampled_from(sorted(CONTROL_ACTIONS)), values=st.dictionaries(st.sampled_from(STRING_FIELDS), odd_strings, max_size=4),
       in_flight=st.sampled_from(["query", "commit", None]))
def test_any_string_reaches_a_typed_answer(action, values, in_flight):
    d = Driver(max_sessions=3, max_inflight_commits=1)
    lease = d.txn()  # s1, lease tok1, open transaction t1
    d.session("s2")
    if in_flight == "query":
        d.query("s1", lease, "q1")
    elif in_flight == "commit":
        d.commit("s1", lease, "t1", "c1")
    body = {"action": action, "session": "s1", "lease": lease, **values}
    try:
        plan = d.proto.control(parse_control(body), d.now)
    except MemTError as error:
        assert error.status in (400, 409, 429)
    else:
        d.run(plan)


# --------------------------------------------------------------------------- unload (hand-off between servers)


def test_unload_frees_the_session_and_keeps_nothing_here():
    d = Driver(max_sessions=2, durable=True)
    lease = d.session("s1")
    assert d.do("unload", session="s1", lease=lease) == {"session": "s1", "unloaded": True, "published_version": 0}
    assert d.effects[-1] == fx.UnloadSession("s1")  # the engine keeps its durable memory, gives up ownership
    d.refuse_control(UnknownSession, 409, "inspect", session="s1")
    d.do("create", session="s1")  # the name is free again (a server with the store restores it)


def test_unload_is_refused_when_it_would_lose_memory_or_work():
    plain = Driver(max_sessions=2)
    lease = plain.session("s1")
    plain.refuse_control(InvalidRequest, 400, "unload", session="s1", lease=lease, match="snapshot store")
    d = Driver(max_sessions=2, durable=True)
    lease = d.txn("s1")
    d.refuse_control(TransactionConflict, 409, "unload", session="s1", lease=lease, match="publish or abort")
    d.refuse_control(LeaseConflict, 409, "unload", session="s1", lease="wrong")
    d.do("abort", session="s1", lease=lease, transaction="t1")
    d.query("s1", lease, "n1")
    d.refuse_control(SessionBusy, 409, "unload", session="s1", lease=lease)


def test_sessions_without_a_lease_are_unloaded_after_the_idle_time():
    d = Driver(max_sessions=4, durable=True, unload_idle=10.0)
    held = d.session("held")
    d.session("free")
    d.do("release", session="free", lease=d.proto.sessions["free"].lease.token)
    assert d.proto.idle_unloads(d.now) == []  # first seen free now
    d.advance(9)
    assert d.proto.idle_unloads(d.now) == []
    d.do("renew", session="held", lease=held, ttl=3600)
    d.advance(2)
    plans = d.proto.idle_unloads(d.now)
    assert [p.session for p in plans] == ["free"]  # "held" keeps its lease
    assert d.inspect("free")["busy"] == "unload"  # reserved until it completes
    d.run(plans[0])
    assert set(d.proto.sessions) == {"held"}
    # no store, or no idle time: nothing is ever unloaded
    for limits in ({"durable": False, "unload_idle": 1.0}, {"durable": True}):
        other = Driver(max_sessions=2, **limits)
        other.do("create", session="a")
        other.proto.idle_unloads(other.now)
        other.advance(1000)
        assert other.proto.idle_unloads(other.now) == []


def test_a_full_durable_server_makes_room_by_unloading_the_session_given_up_longest_ago():
    d = Driver(max_sessions=3, durable=True)
    held = d.session("held")
    d.session("older")
    d.session("newer")
    d.do("release", session="older", lease=d.proto.sessions["older"].lease.token)
    d.advance(5)
    d.do("release", session="newer", lease=d.proto.sessions["newer"].lease.token)
    d.refuse_control(CapacityExceeded, 429, "create", session="new")
    plan = d.proto.room_unload(d.now)
    assert plan.session == "older" and d.inspect("older")["busy"] == "unload"
    d.run(plan)
    assert d.effects[-1] == fx.UnloadSession("older")
    d.do("create", session="new")
    # a leased session, one never leased (its creator's next step is acquire) or one with an open transaction
    # is never taken; with none free, or without a store, the create stays a 429
    d.do("renew", session="held", lease=held, ttl=3600)
    lease = d.do("acquire", session="newer")["lease"]
    d.do("begin", session="newer", lease=lease, transaction="t1")
    d.advance(4000)  # both leases lapse; "newer" keeps its open transaction, "held" is free again
    assert d.proto.room_unload(d.now).session == "held"
    # without a store only a session whose memory is empty goes: never published to, and not a copy
    plain = Driver(max_sessions=2)
    lease = plain.session("a")
    plain.do("begin", session="a", lease=lease, transaction="t")
    plain.do("publish", session="a", lease=lease, transaction="t")
    plain.do("release", session="a", lease=lease)
    lease = plain.session("b")
    plain.do("release", session="b", lease=lease)
    assert plain.proto.room_unload(plain.now).session == "b"
    plain = Driver(max_sessions=2)
    lease = plain.session("a")
    plain.do("create", session="copy", source="a", source_lease=lease)
    plain.do("release", session="a", lease=lease)
    plain.do("release", session="copy", lease=plain.do("acquire", session="copy")["lease"])
    assert plain.proto.room_unload(plain.now).session == "a"  # empty, given up after the copy was made
    plain.do("release", session="a", lease=plain.do("acquire", session="a")["lease"]) if False else None
    plain.proto.sessions["a"].published_version = 1  # written since: no session can go without loss
    assert plain.proto.room_unload(plain.now) is None
    fresh = Driver(max_sessions=1, durable=True)
    fresh.do("create", session="a")
    assert fresh.proto.room_unload(fresh.now) is None


def test_delete_snapshot_needs_a_leased_session_and_is_a_plan_of_one_effect():
    d = Driver()
    d.do("create", session="a")
    lease = d.do("acquire", session="a")["lease"]
    plan = d.plan("delete_snapshot", session="a", lease=lease, file="offload-1.safetensors")
    assert plan.effects == (fx.DeleteSnapshot(session="", file="offload-1.safetensors"),)
    d.effects.clear()
    assert d.run(plan) == {"file": "offload-1.safetensors", "deleted": False}  # the fake engine found none
    d.refuse_control(InvalidRequest, 400, "delete_snapshot", session="a", lease=lease, file="../etc/passwd")
    d.refuse_control(EpochMismatch, 409, "delete_snapshot", session="a", lease=lease, file="m.safetensors", epoch="other")
    d.refuse_control(LeaseConflict, 409, "delete_snapshot", session="a", lease="forged", file="m.safetensors")
    d.refuse_control(UnknownSession, 409, "delete_snapshot", session="nobody", lease=lease, file="m.safetensors")
    d.advance(301)  # past the default lease TTL
    d.refuse_control(LeaseConflict, 409, "delete_snapshot", session="a", lease=lease, file="m.safetensors", match="expired")
