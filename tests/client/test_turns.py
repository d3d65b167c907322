"""The memory-write plan (``memt_core.client.turns``) driven with bare step outcomes, no server: the
step order of each kind of write, retries while capacity is full, abandoning on failure, and resuming
an uncertain write from a commit receipt without resending what landed."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

from memt_core.client import turns
from memt_core.client.turns import (
    AbortStep, BeginStep, CommitStep, ImportStep, MemoryWrite, PublishStep, WaitStep,
)


def nonces():
    counter = itertools.count(1)
    return lambda: f"n{next(counter)}"


def plan(pieces=([1, 2], [3], [4, 5, 6]), **options) -> MemoryWrite:
    return MemoryWrite("t-1", pieces, new_nonce=nonces(), **options)


def run(write: MemoryWrite, outcomes: dict | None = None, now: float = 0.0) -> list:
    """Drive ``write`` to its end: each step succeeds unless ``outcomes`` maps its stage (or
    ``(stage, attempt)``) to a failure dict for ``failed``. Returns the steps in order."""
    outcomes, steps, seen = outcomes or {}, [], {}
    while (step := write.next_step(now)) is not None:
        steps.append(step)
        if isinstance(step, WaitStep):
            now += step.seconds
            continue
        seen[step.stage] = seen.get(step.stage, 0) + 1
        failure = outcomes.get((step.stage, seen[step.stage]), outcomes.get(step.stage))
        if failure is None:
            write.succeeded({"stage": step.stage})
        else:
            write.failed(now=now, **failure)
    return steps


def kinds(steps) -> list[str]:
    return [step.stage for step in steps]


def test_a_write_commits_each_piece_in_order_then_publishes():
    write = plan()
    steps = run(write)
    assert kinds(steps) == ["begin", "commit", "commit", "commit", "publish"]
    assert all(step.transaction == "t-1" for step in steps)
    assert [(s.ids, s.index, s.nonce) for s in steps if isinstance(s, CommitStep)] == [([1, 2], 0, "n1"), ([3], 1, "n2"), ([4, 5, 6], 2, "n3")]
    assert write.outcome == "published" and write.attempts == [("n1", 0), ("n2", 1), ("n3", 2)]
    assert steps[-1] == PublishStep("t-1", None)


def test_an_import_and_an_export():
    write = MemoryWrite("t-2", new_nonce=nonces(), import_file="a.safetensors", memory_read=True)
    assert run(write) == [BeginStep("t-2"), ImportStep("t-2", "a.safetensors"), PublishStep("t-2", True)]
    write = plan([[7]], export=("b.safetensors", True))
    assert kinds(run(write)) == ["begin", "commit", "export", "publish"]
    assert write.results["export"] == {"stage": "export"} and write.outcome == "published"
    with pytest.raises(ValueError):
        MemoryWrite("t-3", [[1]], new_nonce=nonces(), import_file="a.safetensors")


def test_a_commit_refused_for_capacity_is_retried_with_a_new_nonce_after_a_growing_wait():
    write = plan(capacity_wait=30.0)
    full = {"uncertain": False, "capacity": True}
    steps = run(write, {("commit", 2): full, ("commit", 3): full})
    assert kinds(steps) == ["begin", "commit", "commit", "wait", "commit", "wait", "commit", "commit", "publish"]
    assert [s.seconds for s in steps if isinstance(s, WaitStep)] == [0.02, 0.04]
    retried = [s for s in steps if isinstance(s, CommitStep) and s.index == 1]
    assert len(retried) == 3 and len({s.nonce for s in retried}) == 3
    assert write.outcome == "published"


def test_capacity_retries_stop_at_their_deadline():
    write = plan(capacity_wait=1.0)
    steps = run(write, {"commit": {"uncertain": False, "capacity": True}})
    waited = sum(s.seconds for s in steps if isinstance(s, WaitStep))
    assert write.outcome == "abandoned" and 1.0 <= waited <= 1.0 + turns.CAPACITY_RETRY_MOST
    assert max(s.seconds for s in steps if isinstance(s, WaitStep)) == turns.CAPACITY_RETRY_MOST
    assert "publish" not in kinds(steps)
    # without capacity_wait (the blocking client) a full upstream abandons at once
    write = plan()
    assert kinds(run(write, {"commit": {"uncertain": False, "capacity": True}})) == ["begin", "commit"]
    assert write.outcome == "abandoned"


def test_a_certain_failure_abandons_the_write():
    write = plan()
    assert kinds(run(write, {("commit", 2): {"uncertain": False}})) == ["begin", "commit", "commit"]
    assert write.outcome == "abandoned" and write.stage == "commit"
    write = plan()
    assert kinds(run(write, {"publish": {"uncertain": False}})) == ["begin", "commit", "commit", "commit", "publish"]
    assert write.outcome == "abandoned"


def test_a_failed_import_is_aborted_when_asked():
    write = MemoryWrite("t-4", new_nonce=nonces(), import_file="x.safetensors", memory_read=True, abort_on_failure=True)
    assert run(write, {"import": {"uncertain": False}})[-1] == AbortStep("t-4")
    assert write.outcome == "abandoned"
    write = MemoryWrite("t-5", new_nonce=nonces(), import_file="x.safetensors", memory_read=True, abort_on_failure=True)
    assert kinds(run(write, {"begin": {"uncertain": False}})) == ["begin"]  # nothing open: nothing to abort
    assert write.outcome == "abandoned"


def test_an_uncertain_commit_resumes_from_its_receipt_without_resending_what_landed():
    write = plan()
    steps = run(write, {("commit", 2): {"uncertain": True}})
    assert kinds(steps) == ["begin", "commit", "commit"] and write.outcome == "uncertain" and write.stage == "commit"
    assert write.next_step() is None
    # the second commit (n2) did land; only the third piece is left
    receipt = {"state": "open", "commits": [{"nonce": "n1", "status": "applied"}, {"nonce": "n2", "status": "applied"}]}
    write.resume(receipt)
    resumed = run(write)
    assert kinds(resumed) == ["commit", "publish"] and resumed[0].index == 2 and resumed[0].nonce == "n3"
    assert write.outcome == "published" and write.resent == 1 and write.landed == {"n1", "n2"}


def test_an_uncertain_commit_that_did_not_land_is_sent_again_under_a_new_nonce():
    write = plan()
    run(write, {("commit", 2): {"uncertain": True}})
    write.resume({"state": "open", "commits": [{"nonce": "n1", "status": "applied"}, {"nonce": "n2", "status": "failed"}]})
    resumed = run(write)
    assert [(s.index, s.nonce) for s in resumed if isinstance(s, CommitStep)] == [(1, "n3"), (2, "n4")]
    assert write.resent == 2 and write.attempts == [("n1", 0), ("n3", 1), ("n4", 2)]
    # uncertain again while resuming: resumable again
    write = plan()
    run(write, {("commit", 1): {"uncertain": True}})
    write.resume({"state": "open", "commits": []})
    run(write, {"commit": {"uncertain": True}})
    assert write.outcome == "uncertain"
    write.resume({"state": "open", "commits": [{"nonce": "n2", "status": "applied"}]})
    assert kinds(run(write)) == ["commit", "commit", "publish"]


def test_a_receipt_of_a_closed_transaction_ends_the_plan():
    for state in ("published", "abandoned", "aborted"):
        write = plan()
        run(write, {"publish": {"uncertain": True}})
        write.resume({"state": state, "commits": []})
        assert write.outcome == state and write.next_step() is None
    write = plan()
    run(write, {"begin": {"uncertain": True}})
    write.resume(None)  # the server never heard of the transaction
    assert write.outcome == "unknown"


def test_an_uncertain_import_publishes_only_the_file_it_imported():
    def uncertain_import(imported):
        write = MemoryWrite("t-6", new_nonce=nonces(), import_file="x.safetensors", memory_read=True)
        run(write, {"import": {"uncertain": True}})
        write.resume({"state": "open", "commits": [], "imported": imported})
        return write, run(write)

    write, steps = uncertain_import("x.safetensors")
    assert steps == [PublishStep("t-6", True)] and write.outcome == "published"
    write, steps = uncertain_import(None)
    assert steps == [AbortStep("t-6")] and write.outcome == "aborted"


def test_misuse_is_refused():
    write = plan()
    write.next_step()
    with pytest.raises(RuntimeError):
        write.next_step()  # the begin's outcome was never reported
    write.succeeded()
    with pytest.raises(RuntimeError):
        write.succeeded()
    with pytest.raises(RuntimeError):
        write.resume({"state": "open", "commits": []})  # nothing is uncertain


def test_the_plan_does_no_io():
    tree = ast.parse(Path(turns.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "dataclasses", "typing"}
