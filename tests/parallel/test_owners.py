"""DP attention's bookkeeping (``memt_core.parallel.owners``): where each handle goes, a step split by it, the moves a
prefill needs, and the ranks' results merged back into one in the scheduler's order."""

from __future__ import annotations

from memt_core.engine.step import Commit, CommitOutcome, Decode, Leave, Logits, Prefill, Step, StepResult
from memt_core.parallel.owners import Move, Owners


def test_puts_go_to_the_least_loaded_rank_and_forks_stay_beside_their_source():
    owners = Owners(2)
    assert owners.place(1) == 0
    assert owners.place(2) == 1  # rank 0 holds one handle now
    assert owners.place(3, near=2) == 1  # a fork
    assert owners.place(4) == 0
    assert owners.load() == [2, 2]
    assert owners.place(5, near=99) == 0  # an unknown source: the least loaded


def test_a_step_splits_by_where_each_handle_lives():
    owners = Owners(2)
    owners.place(10)  # session a's memory → rank 0
    owners.place(20)  # session b's memory → rank 1
    step = Step(prefills=(Prefill(1, (5, 6), memory=10), Prefill(2, (7,), memory=20), Prefill(3, (8,))))
    parts, moves = owners.split(step)
    assert moves == ()
    # 1 beside its memory (rank 0), 2 beside its own (rank 1), 3 reads none: the least loaded (a tie: the first)
    assert [p.request for p in parts[0].prefills] == [1, 3] and [p.request for p in parts[1].prefills] == [2]
    assert owners.prefills == [2, 1]
    step = Step(decode=(Decode(1, 9, 2), Decode(2, 9, 1), Decode(3, 9, 1)), commits=(Commit(20, (1, 2)), Commit(10, (3,))))
    parts, _ = owners.split(step)
    assert [d.request for d in parts[0].decode] == [1, 3] and [d.request for d in parts[1].decode] == [2]
    assert [c.memory for c in parts[1].commits] == [20] and [c.memory for c in parts[0].commits] == [10]


def test_a_prefill_runs_where_its_retained_kv_is_and_its_memory_moves_there():
    owners = Owners(2)
    parts, _ = owners.split(Step(prefills=(Prefill(1, (5,)),)))  # a session's first query, no memory: rank 0
    assert parts[0].prefills
    parts, _ = owners.split(Step(leave=(Leave(1, retain=50),)))  # its context kept on rank 0
    assert parts[0].leave and owners.of(50) == 0 and owners.of(1) is None
    owners.place(60)  # the session's first state put in place: rank 1, the least loaded
    assert owners.of(60) == 1
    parts, moves = owners.split(Step(prefills=(Prefill(2, (6,), memory=60, retained=50),)))
    assert moves == (Move(60, 1, 0),)
    assert parts[0].prefills and not parts[1].prefills
    assert owners.of(60) == 0 and owners.of(50) is None  # the request owns its KV now


def test_leaving_and_freeing_forget_handles_and_unknown_frees_reach_every_rank():
    owners = Owners(2)
    owners.place(10)
    owners.split(Step(prefills=(Prefill(1, (5,), memory=10),)))
    assert owners.load() == [2, 0]
    owners.split(Step(leave=(Leave(1),)))  # the request and the memory it read are let go
    assert owners.load() == [0, 0]
    owners.place(11)
    parts, _ = owners.split(Step(free=(11, 999)))
    assert parts[0].free == (11, 999) and parts[1].free == (999,)
    assert owners.load() == [0, 0]


def test_results_merge_in_the_steps_order_and_a_failed_batch_fails_only_its_commits():
    owners = Owners(2)
    owners.place(10)
    owners.place(20)
    owners.place(11, near=10)
    step = Step(commits=(Commit(20, (1,)), Commit(10, (2,)), Commit(11, (3,))))
    parts, _ = owners.split(step)
    failed = RuntimeError("out of memory")
    results = [StepResult(commits=failed, decoded=[Logits((7,), "a")], prefilled={8: failed}),
               StepResult(commits=[CommitOutcome(1, 1)], decoded=[Logits((9,), "b")], prefilled={})]
    merged = owners.merge(step, parts, results)
    assert merged.commits == [CommitOutcome(1, 1), failed, failed]
    assert [block.requests for block in merged.decoded] == [(7,), (9,)]
    assert merged.prefilled == {8: failed}


def test_a_failed_prefill_lets_go_of_what_its_request_held():
    owners = Owners(2)
    owners.place(10)
    step = Step(prefills=(Prefill(1, (5,), memory=10),))
    parts, _ = owners.split(step)
    assert owners.load() == [2, 0]
    owners.merge(step, parts, [StepResult(prefilled={1: ValueError("bad")}), StepResult()])
    assert owners.load() == [0, 0] and owners.of(1) is None
