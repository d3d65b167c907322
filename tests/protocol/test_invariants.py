"""DESIGN §5 invariants under random interleavings of several clients (hypothesis stateful test).

Clients remember the lease token they believe they hold (possibly stale, or forged on purpose) and fire
control actions and generation requests at 1-3 sessions while time advances. A fake engine carries out
the protocol's effects on "memories" that are tuples of commit labels; a reference model of what each
session's published memory *should* hold is built only from successful responses. After every step:

* published memory (engine) equals the model: it changed only through publish/reset/close, and aborted
  or abandoned transactions left no trace;
* at most one client holds the session's lease token; at most one open transaction (and candidate);
* a nonce is accepted at most once per session and the engine never applies one twice;
* receipts say exactly which commits landed;
* ``inflight_commits`` equals the started-unfinished commits and stays within its limit;
* a refused request (any ``MemTError``, always 400/409/429) changed nothing.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from memt_core.errors import EpochMismatch, MemTError
from memt_core.protocol import APPLIED, FAILED, UNKNOWN, Limits, MemTProtocol, parse_control, parse_generate
from memt_core.protocol import effects as fx
from memt_core.protocol.events import Create

EPOCH = "E1"
SESSIONS = ("s0", "s1", "s2")
CLIENTS = range(3)
LIMITS = Limits(max_sessions=2, max_inflight_commits=1, receipts_kept=10_000)
ENDED = ("aborted", "abandoned")

clients = st.sampled_from(CLIENTS)
sessions = st.sampled_from(SESSIONS[:1] * 4 + SESSIONS[1:2] * 2 + SESSIONS[2:])  # mostly s0, so that work piles up
ttls = st.sampled_from([1, 30, 300, 300])
nonces = st.sampled_from([f"n{i}" for i in range(24)])  # a small pool, so that some nonces come back
txn_names = st.sampled_from([f"t{i}" for i in range(12)])
use_open = st.sampled_from([True] * 4 + [False])  # name the open transaction (else a random name)
epochs = st.sampled_from([None] * 4 + [EPOCH] * 4 + ["E0"])
defer = st.sampled_from([False] * 9 + [True])  # leave the plan pending; a later step completes or abandons it
# which lease a request carries: the current holder's (if some client holds it), the chosen client's own
# belief (possibly stale or none), or a made-up token
lease_choice = st.sampled_from(["holder"] * 6 + ["own"] * 2 + ["forged"])


class EngineFailure(Exception):
    """The fake engine could not carry out an effect (the server then abandons the plan)."""


class FakeEngine:
    """Carries out effects on memories that are tuples of commit labels ``(incarnation, transaction, nonce)``."""

    def __init__(self):
        self.published: dict[str, tuple] = {}
        self.candidates: dict[str, dict[str, list]] = {}
        self.landed: dict[tuple[str, str], list[str]] = {}  # (session, transaction) → nonces applied in it
        self.applied: dict[str, list[str]] = {}  # session → every nonce ever applied

    def state(self):
        return (dict(self.published), {s: {t: tuple(c) for t, c in cs.items()} for s, cs in self.candidates.items()},
                {k: tuple(v) for k, v in self.landed.items()}, {s: tuple(v) for s, v in self.applied.items()})

    def check(self, effect: fx.Effect) -> None:
        if isinstance(effect, fx.CopyMemory) and effect.source not in self.published:
            raise EngineFailure(f"source {effect.source!r} is gone")

    def apply(self, effect: fx.Effect):
        s = effect.session
        if isinstance(effect, (fx.NewMemory, fx.CopyMemory)):
            assert s not in self.published, f"{s} created twice"
            self.published[s] = self.published[effect.source] if isinstance(effect, fx.CopyMemory) else ()
            self.candidates[s], self.applied[s] = {}, []
        elif isinstance(effect, fx.ForkCandidate):
            assert not self.candidates[s], f"{s}: a second candidate {effect.transaction} next to {list(self.candidates[s])}"
            self.candidates[s][effect.transaction] = list(self.published[s])
        elif isinstance(effect, fx.DropCandidate):
            self.candidates[s].pop(effect.transaction)
        elif isinstance(effect, fx.PublishCandidate):
            self.published[s] = tuple(self.candidates[s].pop(effect.transaction))
        elif isinstance(effect, fx.ClearMemory):
            self.published[s] = ()
        elif isinstance(effect, fx.DropSession):
            del self.published[s], self.candidates[s], self.applied[s]
            self.landed = {k: v for k, v in self.landed.items() if k[0] != s}
        elif isinstance(effect, fx.ReconcileCommits):
            return list(self.landed.get((s, effect.transaction), []))
        elif isinstance(effect, fx.CancelRequest):
            return True
        else:
            raise AssertionError(f"unexpected effect {effect}")
        return None

    def apply_commit(self, session: str, transaction: str, nonce: str, label: tuple) -> None:
        assert nonce not in self.applied[session], f"nonce {nonce} applied twice on {session}"
        self.candidates[session][transaction].append(label)
        self.landed.setdefault((session, transaction), []).append(nonce)
        self.applied[session].append(nonce)


def protocol_state(proto: MemTProtocol) -> dict:
    """The protocol's whole state, independent of the clock."""
    return {
        "sessions": {name: session_state(s) for name, s in proto.sessions.items()},
        "creating": sorted(proto._creating),
        "inflight_commits": proto.inflight_commits,
    }


def session_state(s) -> dict:
    return {
        "memory_read": s.memory_read, "retain_kv": s.retain_kv, "lease": (s.lease.token, s.lease.expires_at) if s.lease else None,
        "transaction": s.transaction.name if s.transaction else None, "history": [(k, t.to_wire()) for k, t in s.history.items()],
        "nonces": sorted(s.nonces), "in_flight": dict(s.in_flight), "reserved": s.reserved, "uncertain": s.uncertain,
        "published_version": s.published_version,
    }


class ProtocolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        n = iter(range(1, 10**9))
        self.proto = MemTProtocol(epoch=EPOCH, limits=LIMITS, new_token=lambda: f"tok{next(n)}")
        self.engine = FakeEngine()
        self.now = 1000.0
        self.tokens: dict[tuple[int, str], str] = {}  # (client, session) → the lease token the client believes it holds
        # reference model, changed only by successful responses
        self.published: dict[str, tuple] = {}
        self.candidate: dict[str, tuple[str, list]] = {}  # session → (open transaction, its expected memory)
        self.lapsed: dict[str, str] = {}  # session → transaction the reaper abandoned under its current lease
        self.version: dict[str, int] = {}
        self.nonces: dict[str, set[str]] = {}
        self.incarnation: dict[str, int] = {}
        self.created = 0
        # work in progress
        self.commits: list = []  # tickets of started, unfinished commits
        self.queries: list = []
        self.deferred: list = []  # (plan, on_success) of planned actions whose effects have not run yet

    # ------------------------------------------------------------------ plumbing

    def attempt(self, call):
        """Run ``call``; a refusal must be a 4xx MemTError that changed nothing."""
        before, engine_before = protocol_state(self.proto), self.engine.state()
        try:
            return call()
        except MemTError as error:
            assert error.status in (400, 409, 429), (type(error), error.status, error.message)
            assert protocol_state(self.proto) == before, f"refused {type(error).__name__} changed the protocol"
            assert self.engine.state() == engine_before
            return None

    def control(self, body: dict, on_success=None, deferred: bool = False):
        before = protocol_state(self.proto)
        plan = self.attempt(lambda: self.proto.control(parse_control(body), self.now))
        if plan is None:
            return None
        if deferred:
            self.deferred.append((plan, on_success))
            return plan
        return self.finish((plan, on_success), fail=False, before=before)

    def finish(self, entry, *, fail: bool, before: dict | None = None):
        """Complete a plan, or abandon it when the engine fails; ``before`` is the state before ``control``."""
        plan, on_success = entry
        try:
            if fail:
                raise EngineFailure("engine failed")
            for effect in plan.effects:
                self.engine.check(effect)
        except EngineFailure:
            # abandon only releases the reservation: the state is the one just before, less the reservation
            expected = protocol_state(self.proto)
            if plan.reserved and plan.session in expected["sessions"]:
                expected["sessions"][plan.session]["reserved"] = None
            if isinstance(plan.action, Create):
                expected["creating"].remove(plan.session)
            self.proto.abandon(plan)
            assert protocol_state(self.proto) == expected, f"abandoned {plan.name} changed the protocol"
            if before is not None:  # nothing happened in between: as if the action had never been asked for
                assert protocol_state(self.proto) == before
            return None
        results = [self.engine.apply(effect) for effect in plan.effects]
        body = self.proto.complete(plan, results, self.now)
        if on_success is not None:
            on_success(body)
        return body

    def pick(self, client: int, session: str, choice: str) -> tuple[int, str]:
        """The acting client and the lease token it sends (see ``lease_choice``)."""
        if choice == "forged":
            return client, "forged"
        s = self.proto.sessions.get(session)
        if choice == "holder" and s is not None and s.lease is not None:
            for (c, name), token in self.tokens.items():
                if name == session and token == s.lease.token:
                    return c, token
        return client, self.tokens.get((client, session), "none")

    def holder(self, session: str):
        """(token, valid now) of the session's current lease, or None."""
        s = self.proto.sessions.get(session)
        return (s.lease.token, s.lease.valid(self.now)) if s and s.lease else None

    def leased(self, action: str, session: str, lease: str, deferred: bool = False, on_success=None, epoch=None, **fields):
        """A leased control action; success implies the client held the session's (valid) lease."""
        holder = self.holder(session)
        body = {"action": action, "session": session, "lease": lease, **fields}
        if epoch is not None:
            body["epoch"] = epoch
        result = self.control(body, on_success, deferred)
        if result is not None:
            assert holder is not None and holder[0] == lease, f"{action} succeeded with a lease that is not the session's"
            assert holder[1] or action in ("release", "status", "recover"), f"{action} succeeded on an expired lease"
            assert epoch in (None, EPOCH)
        return result

    def drop_candidate(self, session: str, transaction: str | None) -> None:
        if transaction is None:
            assert session not in self.candidate
        else:
            assert self.candidate.pop(session)[0] == transaction

    def end_lease(self, session: str, reported: str | None) -> None:
        """Acquire and release report the transaction the ending lease left open, even if the reaper took it."""
        lapsed = self.lapsed.pop(session, None)
        if session in self.candidate:
            self.drop_candidate(session, reported)
        else:
            assert reported == lapsed, f"{session}: reported {reported!r} as abandoned, the lease left {lapsed!r}"

    # ------------------------------------------------------------------ control rules

    @initialize()
    def start_with_a_leased_session(self):
        for client, session in ((0, "s0"), (1, "s1")):
            self.create(client, session, True, None, False)
            self.acquire(client, session, 300, None, False)
            assert session in self.published and (client, session) in self.tokens

    @rule(client=clients, session=sessions, memory_read=st.booleans(), source=st.none() | sessions, deferred=defer)
    def create(self, client, session, memory_read, source, deferred):
        body = {"action": "create", "session": session, "memory_read": memory_read}
        if source is not None:
            body.update(source=source, source_lease=self.pick(client, source, "holder")[1])

        def on_success(response):
            assert response["session"] == session and session not in self.published
            self.published[session] = self.published[source] if source else ()
            self.version[session], self.nonces[session] = 0, set()
            self.created += 1
            self.incarnation[session] = self.created

        self.control(body, on_success, deferred)

    ACQUIRE = dict(client=clients, session=sessions, ttl=ttls, epoch=epochs, deferred=defer)

    @rule(**ACQUIRE)
    def acquire(self, client, session, ttl, epoch, deferred):
        holder = self.holder(session)

        def on_success(response):
            self.tokens[(client, session)] = response["lease"]
            self.end_lease(session, response["abandoned_transaction"])

        body = {"action": "acquire", "session": session, "ttl": ttl, **({"epoch": epoch} if epoch else {})}
        if self.control(body, on_success, deferred) is not None:
            assert holder is None or not holder[1], "acquire succeeded while another lease was valid"
            assert epoch != "E0"

    @rule(client=clients, session=sessions, ttl=ttls, choice=lease_choice)
    def renew(self, client, session, ttl, choice):
        self.leased("renew", session, self.pick(client, session, choice)[1], ttl=ttl)

    @rule(client=clients, session=sessions, choice=lease_choice, deferred=defer)
    def release(self, client, session, choice, deferred):
        client, lease = self.pick(client, session, choice)

        def on_success(response):
            self.tokens.pop((client, session), None)
            self.end_lease(session, response["abandoned_transaction"])

        self.leased("release", session, lease, deferred, on_success)

    BEGIN = dict(client=clients, session=sessions, transaction=txn_names, choice=lease_choice, epoch=epochs, deferred=defer)

    @rule(**BEGIN)
    def begin(self, client, session, transaction, choice, epoch, deferred):
        def on_success(response):
            assert session not in self.candidate
            self.candidate[session] = (transaction, list(self.published[session]))
            self.lapsed.pop(session, None)

        lease = self.pick(client, session, choice)[1]
        self.leased("begin", session, lease, deferred, on_success, epoch=epoch, transaction=transaction)

    def open_or(self, session: str, transaction: str, use_open: bool) -> str:
        return self.candidate[session][0] if use_open and session in self.candidate else transaction

    PUBLISH = dict(client=clients, session=sessions, transaction=txn_names, use_open=use_open, memory_read=st.none() | st.booleans(),
                   choice=lease_choice, deferred=defer)

    @rule(**PUBLISH)
    def publish(self, client, session, transaction, use_open, memory_read, choice, deferred):
        transaction = self.open_or(session, transaction, use_open)

        def on_success(response):
            name, memory = self.candidate.pop(session)
            assert name == transaction == response["transaction"]
            assert response["commits"] == sum(label[0] == self.incarnation[session] and label[1] == name for label in memory)
            self.published[session] = tuple(memory)
            self.version[session] += 1

        extra = {} if memory_read is None else {"memory_read": memory_read}
        self.leased("publish", session, self.pick(client, session, choice)[1], deferred, on_success, transaction=transaction, **extra)

    @rule(client=clients, session=sessions, transaction=txn_names, use_open=use_open, choice=lease_choice, deferred=defer)
    def abort(self, client, session, transaction, use_open, choice, deferred):
        transaction = self.open_or(session, transaction, use_open)
        self.leased("abort", session, self.pick(client, session, choice)[1], deferred,
                    lambda response: self.drop_candidate(session, transaction), transaction=transaction)

    @rule(client=clients, session=sessions, choice=lease_choice, deferred=defer)
    def reset(self, client, session, choice, deferred):
        def on_success(response):
            self.drop_candidate(session, response["aborted_transaction"])
            self.published[session] = ()
            self.version[session] += 1

        self.leased("reset", session, self.pick(client, session, choice)[1], deferred, on_success)

    @rule(client=clients, session=sessions, choice=lease_choice, deferred=defer, really=st.sampled_from([False, True]))
    def close(self, client, session, choice, deferred, really):
        if not really:  # closing less often than the other actions lets work pile up on a session
            return

        def on_success(response):
            for model in (self.published, self.candidate, self.version, self.nonces, self.incarnation, self.lapsed):
                model.pop(session, None)

        self.leased("close", session, self.pick(client, session, choice)[1], deferred, on_success)

    @rule(client=clients, session=sessions, ttl=ttls, choice=lease_choice, deferred=defer)
    def recover(self, client, session, ttl, choice, deferred):
        def on_success(response):
            s = self.proto.sessions[session]
            assert not s.uncertain
            assert all(r.status not in (UNKNOWN, "pending") for t in s.history.values() for r in t.commits)

        self.leased("recover", session, self.pick(client, session, choice)[1], deferred, on_success, ttl=ttl)

    @rule(client=clients, session=sessions, choice=lease_choice)
    def status(self, client, session, choice):
        body = self.leased("status", session, self.pick(client, session, choice)[1])
        if body is not None:
            s = self.proto.sessions[session]
            assert body["uncertain"] == s.uncertain and body["published_version"] == self.version[session]
            assert body["transaction"] == (self.candidate[session][0] if session in self.candidate else None)
            assert set(body["receipts"]) == set(s.history)

    @rule(session=sessions)
    def inspect(self, session):
        body = self.control({"action": "inspect", "session": session})
        if body is not None:
            assert not any(token in repr(body) for token in self.tokens.values())
            assert body["published_version"] == self.version[session]

    FINISH_DEFERRED = dict(index=st.integers(0, 7), fail=st.sampled_from([False, False, True]))

    @precondition(lambda self: self.deferred)
    @rule(**FINISH_DEFERRED)
    def finish_deferred(self, index, fail):
        self.finish(self.deferred.pop(index % len(self.deferred)), fail=fail)

    # ------------------------------------------------------------------ generation rules

    def admitted(self, session: str, nonce: str, lease: str, epoch) -> None:
        """Checks for a generation request the protocol accepted."""
        holder = self.holder(session)
        assert holder is not None and holder == (lease, True), "generation accepted without the valid lease"
        assert epoch in (None, EPOCH)
        assert nonce not in self.nonces[session], f"nonce {nonce} accepted twice on {session}"
        self.nonces[session].add(nonce)

    START_COMMIT = dict(client=clients, session=sessions, transaction=txn_names, use_open=use_open, nonce=nonces,
                        n=st.integers(1, 3), choice=lease_choice, epoch=epochs)

    @rule(**START_COMMIT)
    def start_commit(self, client, session, transaction, use_open, nonce, n, choice, epoch):
        transaction = self.open_or(session, transaction, use_open)
        lease = self.pick(client, session, choice)[1]
        body = {"rid": f"memt|{session}|commit:{n}|{nonce}", "input_ids": [7] * n, "sampling_params": {"max_new_tokens": 0},
                "memt_lease": lease, "memt_transaction": transaction, **({"memt_epoch": epoch} if epoch else {})}
        holder = self.holder(session)  # the lease as the request finds it
        ticket = self.attempt(lambda: self.proto.start_commit(parse_generate(body, vocab_size=16, max_prefill_tokens=8), self.now))
        if epoch == "E0":
            assert ticket is None
        if ticket is not None:
            assert holder == (lease, True)
            self.admitted(session, nonce, lease, epoch)
            assert self.candidate[session][0] == transaction
            self.commits.append(ticket)

    FINISH_COMMIT = dict(index=st.integers(0, 7), outcome=st.sampled_from([APPLIED, APPLIED, FAILED, UNKNOWN]), lands=st.booleans())

    @precondition(lambda self: self.commits)
    @rule(**FINISH_COMMIT)
    def finish_commit(self, index, outcome, lands):
        ticket = self.commits.pop(index % len(self.commits))
        if ticket.transaction not in self.engine.candidates.get(ticket.session, {}):
            # released while in flight: the candidate is gone, so the engine cannot apply the commit
            outcome, lands = (FAILED if outcome == APPLIED else outcome), False
        if outcome == APPLIED or (outcome == UNKNOWN and lands):
            label = (self.incarnation[ticket.session], ticket.transaction, ticket.nonce)
            self.engine.apply_commit(ticket.session, ticket.transaction, ticket.nonce, label)
            name, memory = self.candidate[ticket.session]
            assert name == ticket.transaction
            memory.append(label)
        self.proto.finish_commit(ticket, outcome, self.now)

    @rule(client=clients, session=sessions, nonce=nonces, choice=lease_choice, epoch=epochs)
    def start_query(self, client, session, nonce, choice, epoch):
        lease = self.pick(client, session, choice)[1]
        body = {"rid": f"memt|{session}|query|{nonce}", "input_ids": [1], "sampling_params": {"max_new_tokens": 2},
                "memt_lease": lease, **({"memt_epoch": epoch} if epoch else {})}
        ticket = self.attempt(lambda: self.proto.start_query(parse_generate(body, vocab_size=16, max_prefill_tokens=8), self.now))
        if ticket is not None:
            self.admitted(session, nonce, lease, epoch)
            self.queries.append(ticket)

    @precondition(lambda self: self.queries)
    @rule(index=st.integers(0, 7))
    def finish_query(self, index):
        self.proto.finish_query(self.queries.pop(index % len(self.queries)), self.now)

    # ------------------------------------------------------------------ time

    @rule(seconds=st.sampled_from([0.5] * 3 + [29.0, 31.0, 301.0]))
    def advance(self, seconds):
        self.now += seconds

    @rule()
    def reap(self):
        for effect in self.proto.reap(self.now):
            assert isinstance(effect, fx.DropCandidate)
            self.engine.apply(effect)
            self.drop_candidate(effect.session, effect.transaction)
            self.lapsed[effect.session] = effect.transaction

    @rule(client=clients, session=sessions)
    def wrong_epoch(self, client, session):
        error = None
        try:
            self.proto.control(parse_control({"action": "renew", "session": session, "lease": self.pick(client, session, "holder")[1],
                                              "epoch": "E0"}), self.now)
        except EpochMismatch as e:
            error = e
        assert error is not None and error.status == 409

    # ------------------------------------------------------------------ the happy path, drawn more often

    @rule(client=clients, session=sessions, transaction=txn_names,
          writes=st.lists(st.tuples(nonces, st.sampled_from([APPLIED, APPLIED, FAILED, UNKNOWN]), st.booleans()), max_size=3),
          end=st.sampled_from(["publish", "publish", "abort", "leave open"]))
    def write_transaction(self, client, session, transaction, writes, end):
        """A client's whole write: acquire if nobody holds the lease, begin, commit, publish or abort.

        Each step goes through the same checked calls as the single-action rules and may be refused.
        """
        holder = self.holder(session)
        if holder is None or not holder[1]:
            self.acquire(client, session, 300, None, False)
        if session in self.proto.sessions and self.proto.sessions[session].uncertain:
            self.recover(client, session, 300, "holder", False)
        if session not in self.candidate:
            self.begin(client, session, transaction, "holder", None, False)
        for nonce, outcome, lands in writes:
            started = len(self.commits)
            self.start_commit(client, session, transaction, True, nonce, 2, "holder", None)
            if len(self.commits) > started:
                self.finish_commit(len(self.commits) - 1, outcome, lands)
        if end != "leave open":
            getattr(self, end)(client=client, session=session, transaction=transaction, use_open=True,
                               **({"memory_read": None} if end == "publish" else {}), choice="holder", deferred=False)

    @rule(client=clients, session=sessions, transaction=txn_names,
          writes=st.lists(st.tuples(nonces, st.sampled_from([APPLIED, APPLIED, FAILED, UNKNOWN]), st.booleans()), max_size=3),
          end=st.sampled_from(["publish", "publish", "abort", "leave open"]))
    def write_transaction_again(self, **args):
        self.write_transaction(**args)

    @rule(**ACQUIRE)
    def acquire_again(self, **args):
        self.acquire(**args)

    @rule(**BEGIN)
    def begin_again(self, **args):
        self.begin(**args)

    @rule(**PUBLISH)
    def publish_again(self, **args):
        self.publish(**args)

    @precondition(lambda self: self.deferred)
    @rule(**FINISH_DEFERRED)
    def finish_deferred_again(self, **args):
        self.finish_deferred(**args)

    @rule(**START_COMMIT)
    def start_commit_again(self, **args):
        self.start_commit(**args)

    @rule(**START_COMMIT)
    def start_commit_once_more(self, **args):
        self.start_commit(**args)

    @precondition(lambda self: self.commits)
    @rule(**FINISH_COMMIT)
    def finish_commit_again(self, **args):
        self.finish_commit(**args)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def published_memory_matches_the_model(self):
        assert self.engine.published == self.published
        assert set(self.proto.sessions) == set(self.published)
        for name, s in self.proto.sessions.items():
            assert s.published_version == self.version[name]

    @invariant()
    def published_memory_holds_only_published_commits(self):
        for name, memory in self.engine.published.items():
            history = self.proto.sessions[name].history
            for incarnation, transaction, nonce in memory:
                if incarnation != self.incarnation[name]:
                    continue  # copied from another session
                txn = history[transaction]
                assert txn.state == "published", f"{nonce} of {txn.state} transaction {transaction} is in published memory"
                assert [r.status for r in txn.commits if r.nonce == nonce] == [APPLIED]

    @invariant()
    def one_open_transaction_and_candidate(self):
        for name, s in self.proto.sessions.items():
            open_ = [t.name for t in s.history.values() if t.state == "open"]
            assert open_ == ([s.transaction.name] if s.transaction else [])
            candidates = self.engine.candidates[name]
            assert len(candidates) <= 1
            if name in self.candidate:
                transaction, memory = self.candidate[name]
                assert candidates == {transaction: memory}
                assert s.transaction is not None and s.transaction.name == transaction
            else:
                assert candidates == {}
                # a begin may be planned but not yet complete
                assert s.transaction is None

    @invariant()
    def one_lease_holder(self):
        for name, s in self.proto.sessions.items():
            if s.lease is not None:
                holders = [c for (c, session), token in self.tokens.items() if session == name and token == s.lease.token]
                assert len(holders) <= 1

    @invariant()
    def nonces_once(self):
        for name, s in self.proto.sessions.items():
            assert s.nonces == self.nonces[name]
            applied = self.engine.applied[name]
            assert len(applied) == len(set(applied))

    @invariant()
    def receipts_tell_what_landed(self):
        for name, s in self.proto.sessions.items():
            unknown = False
            for txn in s.history.values():
                landed = set(self.engine.landed.get((name, txn.name), []))
                assert landed <= {r.nonce for r in txn.commits}
                for r in txn.commits:
                    in_flight = f"memt|{name}|commit:{r.tokens}|{r.nonce}" in s.in_flight
                    assert (r.status == "pending") == in_flight
                    if r.status == APPLIED:
                        assert r.nonce in landed
                    elif r.status == FAILED:
                        # an uncertain commit of a transaction that ended is resolved as failed: nothing of it can publish
                        assert r.nonce not in landed or txn.state in ENDED
                    elif r.status == UNKNOWN:
                        unknown = True
                        assert txn.state != "published"
                    if r.nonce in landed and txn.state not in ENDED:
                        assert r.status in (APPLIED, UNKNOWN)
            assert s.uncertain == unknown

    @invariant()
    def inflight_commits_counted(self):
        assert self.proto.inflight_commits == len(self.commits) <= LIMITS.max_inflight_commits
        in_flight = {(t.session, t.rid) for t in self.commits + self.queries}
        assert {(name, rid) for name, s in self.proto.sessions.items() for rid in s.in_flight} == in_flight
        assert all(len(s.in_flight) <= 1 for s in self.proto.sessions.values())
        assert self.proto.counts(self.now)["inflight_commits"] == len(self.commits)


ProtocolMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow],
)
TestProtocolInvariants = ProtocolMachine.TestCase
