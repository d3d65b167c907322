"""Wire bodies → events: the memt-http-v1 request grammar, checked without a server.

Every refusal is an ``InvalidRequest`` (400) whose message names what was wrong.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memt_core.errors import InvalidRequest
from memt_core.protocol import (
    Commit,
    PlainGeneration,
    Query,
    Rid,
    action_name,
    check_name,
    check_snapshot_name,
    is_memt_rid,
    parse_control,
    parse_generate,
    parse_rid,
)
from memt_core.protocol.events import (
    CONTROL_ACTIONS,
    EXTENSION_ACTIONS,
    GENERATE_FIELDS,
    MAX_REQUEST_ID,
    MAX_SCHEMA_DEPTH,
    SAMPLING_FIELDS,
    Abort,
    Acquire,
    Begin,
    Cancel,
    Close,
    Create,
    DeleteSnapshot,
    Export,
    Import,
    Inspect,
    KvReset,
    MemoryRead,
    Publish,
    Recover,
    Release,
    Renew,
    Reset,
    Status,
    Unload,
)

VOCAB, MAX_PREFILL = 1000, 16


def refused(call, *args, match: str, **kwargs) -> InvalidRequest:
    """``call`` must raise InvalidRequest (400) whose message contains ``match``."""
    with pytest.raises(InvalidRequest) as info:
        call(*args, **kwargs)
    assert info.value.status == 400
    assert match in info.value.message, info.value.message
    assert info.value.to_wire()["error"]["type"] == "invalid_memory_request"
    return info.value


def generate(body):
    return parse_generate(body, vocab_size=VOCAB, max_prefill_tokens=MAX_PREFILL)


def commit_body(**over):
    """The spec's commit example."""
    body = {
        "rid": "memt|s1|commit:3|n1",
        "input_ids": [101, 102, 103],
        "sampling_params": {"max_new_tokens": 0},
        "memt_lease": "L",
        "memt_transaction": "t1",
        "memt_epoch": "E",
    }
    body.update(over)
    return {k: v for k, v in body.items() if v is not ...}


def query_body(**over):
    """The spec's query example."""
    body = {
        "rid": "memt|s1|query|n2",
        "input_ids": [101, 104, 105],
        "sampling_params": {"max_new_tokens": 512},
        "memt_lease": "L",
        "memt_epoch": "E",
        "stream": False,
    }
    body.update(over)
    return {k: v for k, v in body.items() if v is not ...}


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize("name", ["a", "s1", "A-b_c.9", "x" * 160, "...", "-", "0"])
def test_name_grammar_accepts(name):
    assert check_name(name, "session") == name


@pytest.mark.parametrize(
    "name",
    ["", "x" * 161, "a|b", "a b", "a/b", "é", "a\n", "\na", "a:b", None, 5, ["a"]],
)
def test_name_grammar_refuses(name):
    refused(check_name, name, "session ID", match="session ID must match [A-Za-z0-9_.-]{1,160}")


@pytest.mark.parametrize("name", ["m.safetensors", "Snap_1.v2.safetensors", "_x.safetensors", "a" * 182 + ".safetensors"])
def test_snapshot_name_accepts(name):
    assert check_snapshot_name(name) == name


@pytest.mark.parametrize(
    "name, match",
    [
        ("", "nonempty snapshot file name"),
        (None, "nonempty snapshot file name"),
        (3, "nonempty snapshot file name"),
        ("../m.safetensors", "simple file name"),
        ("a/m.safetensors", "simple file name"),
        ("/abs.safetensors", "simple file name"),
        ("a\\m.safetensors", "simple file name"),
        (".hidden.safetensors", "simple file name"),
        ("m..safetensors", "simple file name"),
        ("m.bin", "end with '.safetensors'"),
        ("m.safetensors.tmp", "end with '.safetensors'"),
        ("-m.safetensors", "end with '.safetensors'"),
        ("a b.safetensors", "end with '.safetensors'"),
        ("m.safetensors\n", "end with '.safetensors'"),
        ("a" * 196 + ".safetensors", "end with '.safetensors'"),
    ],
)
def test_snapshot_name_refuses(name, match):
    refused(check_snapshot_name, name, match=match)


# --------------------------------------------------------------------------- RIDs


def test_parse_rid_query_and_commit():
    assert parse_rid("memt|s1|query|n2") == Rid("s1", "query", "n2")
    rid = parse_rid("memt|s1|commit:3|n1")
    assert rid == Rid("s1", "commit", "n1", 3)
    assert rid.text == "memt|s1|commit:3|n1"
    assert parse_rid("memt|s1|query|n2").text == "memt|s1|query|n2"


@pytest.mark.parametrize(
    "rid, match",
    [
        ("memt", "is not memt|<session>|<operation>|<nonce>"),
        ("memt|s1|query", "is not memt|<session>|<operation>|<nonce>"),
        ("memt|s1|query|n|x", "is not memt|<session>|<operation>|<nonce>"),
        ("memtx|s1|query|n", "is not memt|<session>|<operation>|<nonce>"),
        ("memt||query|n", "rid session"),
        ("memt|s 1|query|n", "rid session"),
        ("memt|" + "s" * 161 + "|query|n", "rid session"),
        ("memt|s1|query|", "rid nonce"),
        ("memt|s1|query|n/1", "rid nonce"),
        ("memt|s1|write|n", "operation must be 'query' or 'commit:<token_count>'"),
        ("memt|s1|commit|n", "operation must be 'query' or 'commit:<token_count>'"),
        ("memt|s1|Query|n", "operation must be 'query' or 'commit:<token_count>'"),
        ("memt|s1|commit:|n", "positive integer count"),
        ("memt|s1|commit:0|n", "positive integer count"),
        ("memt|s1|commit:03|n", "positive integer count"),
        ("memt|s1|commit:-1|n", "positive integer count"),
        ("memt|s1|commit:+3|n", "positive integer count"),
        ("memt|s1|commit:3.0|n", "positive integer count"),
        ("memt|s1|commit:²|n", "positive integer count"),  # str.isdigit() is true for '²'
        ("memt|s1|commit:٣|n", "positive integer count"),  # a non-ASCII digit
    ],
)
def test_parse_rid_refuses(rid, match):
    refused(parse_rid, rid, match=match)


def test_memt_prefix_is_reserved():
    assert is_memt_rid("memt|s|query|n")
    assert is_memt_rid("memtastic")
    assert not is_memt_rid("MEMT|s|query|n")
    assert not is_memt_rid("req-1")
    assert not is_memt_rid(None)
    assert not is_memt_rid(["memt|s|query|n"])


# --------------------------------------------------------------------------- control actions

LEASED = dict(session="s1", lease="L")

# action → (extra body fields, expected event)
CONTROL_CASES = {
    "create": ({"session": "s1"}, Create(session="s1", memory_read=True)),
    "acquire": ({"session": "s1"}, Acquire(session="s1", ttl=300)),
    "renew": (dict(LEASED, ttl=60), Renew(session="s1", lease="L", ttl=60)),
    "release": (LEASED, Release(session="s1", lease="L")),
    "begin": (dict(LEASED, transaction="t1"), Begin(session="s1", lease="L", transaction="t1")),
    "abort": (dict(LEASED, transaction="t1"), Abort(session="s1", lease="L", transaction="t1")),
    "publish": (dict(LEASED, transaction="t1", memory_read=False), Publish(session="s1", lease="L", transaction="t1", memory_read=False)),
    "memory_read": (dict(LEASED, enabled=False), MemoryRead(session="s1", lease="L", enabled=False)),
    "export": (
        dict(LEASED, encoding="hf-chat-template", file="m.safetensors", transaction="t1", overwrite=True),
        Export(session="s1", lease="L", encoding="hf-chat-template", file="m.safetensors", transaction="t1", overwrite=True),
    ),
    "import": (
        dict(LEASED, transaction="t1", file="m.safetensors", encoding="hf-chat-template"),
        Import(session="s1", lease="L", transaction="t1", file="m.safetensors", encoding="hf-chat-template"),
    ),
    "inspect": ({"session": "s1"}, Inspect(session="s1")),
    "status": (LEASED, Status(session="s1", lease="L")),
    "recover": (dict(LEASED, ttl=3600), Recover(session="s1", lease="L", ttl=3600)),
    "cancel": (dict(LEASED, request_id="memt|s1|query|n2"), Cancel(session="s1", lease="L", request_id="memt|s1|query|n2")),
    "kv_reset": (LEASED, KvReset(session="s1", lease="L")),
    "reset": (LEASED, Reset(session="s1", lease="L")),
    "close": (LEASED, Close(session="s1", lease="L")),
    "unload": (LEASED, Unload(session="s1", lease="L")),
    "delete_snapshot": (dict(LEASED, file="m.safetensors"), DeleteSnapshot(session="s1", lease="L", file="m.safetensors")),
}


def test_delete_snapshot_names_a_file_and_a_leased_session():
    refused(parse_control, {"action": "delete_snapshot", **LEASED}, match="field 'file' is required")
    refused(parse_control, {"action": "delete_snapshot", "file": "m.safetensors", "lease": "L"}, match="field 'session' is required")
    refused(parse_control, {"action": "delete_snapshot", "file": "m.safetensors", "session": "s1"}, match="field 'lease' is required")


@pytest.mark.parametrize("action", EXTENSION_ACTIONS)
def test_without_extensions_every_extension_action_is_refused(action):
    """``--spec-strict``: the actions this server adds to the spec are refused as unknown ones, naming why."""
    body = {"action": action, **CONTROL_CASES[action][0]}
    assert parse_control(body) == CONTROL_CASES[action][1]
    refused(parse_control, body, extensions=False, match="refused under --spec-strict")


def test_without_extensions_every_spec_action_is_taken():
    for action, (fields, event) in CONTROL_CASES.items():
        if action not in EXTENSION_ACTIONS:
            assert parse_control({"action": action, **fields}, extensions=False) == event


@pytest.mark.parametrize("action", sorted(CONTROL_CASES))
def test_every_action_parses_with_its_fields(action):
    fields, expected = CONTROL_CASES[action]
    event = parse_control({"action": action, **fields})
    assert event == expected
    assert type(event) is type(expected)
    assert action_name(event) == action
    with_epoch = parse_control({"action": action, **fields, "epoch": "E7"})
    assert with_epoch.epoch == "E7"


def test_every_action_has_a_case():
    from memt_core.protocol.events import CONTROL_ACTIONS

    assert set(CONTROL_ACTIONS) == set(CONTROL_CASES)


def test_create_defaults_and_optional_fields():
    event = parse_control({"action": "create"})
    assert event == Create(session="", memory_read=True, source=None, source_lease=None, retain_kv=False)
    event = parse_control({"action": "create", "session": "s2", "memory_read": False, "source": "s1", "source_lease": "L", "retain_kv": True})
    assert event == Create(session="s2", memory_read=False, source="s1", source_lease="L", retain_kv=True)
    # null optional fields mean "absent"
    assert parse_control({"action": "create", "memory_read": None}).memory_read is True
    refused(parse_control, {"action": "create", "source": "a|b"}, match="'source' must match")


def test_publish_memory_read_is_optional():
    assert parse_control({"action": "publish", **LEASED, "transaction": "t1"}).memory_read is None


def test_export_defaults():
    event = parse_control({"action": "export", **LEASED, "encoding": "hf-chat-template"})
    assert (event.file, event.transaction, event.overwrite) == (None, None, False)


@pytest.mark.parametrize("body, match", [
    ([], "must be a JSON object"),
    ("create", "must be a JSON object"),
    (None, "must be a JSON object"),
    ({}, "'action' must be one of"),
    ({"action": "explode", "session": "s1"}, "got 'explode'"),
    ({"action": ["create"]}, "'action' must be one of"),
    ({"action": "Create"}, "'action' must be one of"),
])
def test_control_body_and_action(body, match):
    refused(parse_control, body, match=match)


@pytest.mark.parametrize("action", sorted(set(CONTROL_CASES) - {"create"}))
def test_session_is_required_except_for_create(action):
    fields = {k: v for k, v in CONTROL_CASES[action][0].items() if k != "session"}
    refused(parse_control, {"action": action, **fields}, match="field 'session' is required")


LEASE_ACTIONS = sorted(set(CONTROL_CASES) - {"create", "acquire", "inspect"})


@pytest.mark.parametrize("action", LEASE_ACTIONS)
def test_lease_is_required_except_for_create_acquire_inspect(action):
    fields = {k: v for k, v in CONTROL_CASES[action][0].items() if k != "lease"}
    refused(parse_control, {"action": action, **fields}, match=f"control {action!r}: field 'lease' is required")


@pytest.mark.parametrize("action", ["create", "acquire", "inspect"])
def test_lease_may_be_omitted(action):
    event = parse_control({"action": action, "session": "s1"})
    assert event == CONTROL_CASES[action][1] and event.lease is None


@pytest.mark.parametrize("action, field", [
    ("begin", "transaction"), ("abort", "transaction"), ("publish", "transaction"), ("import", "transaction"),
    ("import", "file"), ("import", "encoding"), ("export", "encoding"), ("memory_read", "enabled"), ("cancel", "request_id"),
])
def test_required_action_fields(action, field):
    fields = {k: v for k, v in CONTROL_CASES[action][0].items() if k != field}
    refused(parse_control, {"action": action, **fields}, match=f"field {field!r} is required")
    # null is the same as missing
    refused(parse_control, {"action": action, **fields, field: None}, match=f"field {field!r} is required")


@pytest.mark.parametrize("action, field, value, kind", [
    ("create", "memory_read", "yes", "a boolean"),
    ("create", "memory_read", 1, "a boolean"),
    ("create", "retain_kv", "true", "a boolean"),
    ("create", "source_lease", 7, "a string"),
    ("create", "session", 12, "a string"),
    ("acquire", "ttl", "60", "an integer"),
    ("acquire", "ttl", 1.5, "an integer"),
    ("acquire", "ttl", True, "an integer"),
    ("renew", "lease", 5, "a string"),
    ("renew", "epoch", 3, "a string"),
    ("begin", "transaction", 1, "a string"),
    ("publish", "memory_read", "no", "a boolean"),
    ("memory_read", "enabled", 0, "a boolean"),
    ("export", "overwrite", 1, "a boolean"),
    ("export", "file", ["m.safetensors"], "a string"),
    ("export", "encoding", {"name": "x"}, "a string"),
    ("cancel", "request_id", 42, "a string"),
])
def test_wrong_field_types(action, field, value, kind):
    fields = dict(CONTROL_CASES[action][0], **{field: value})
    refused(parse_control, {"action": action, **fields}, match=f"field {field!r} must be {kind}")


@pytest.mark.parametrize("action, extra", [
    ("renew", {"foo": 1}),
    ("begin", {"ttl": 60}),  # a field of another action
    ("inspect", {"lease": "L", "transaction": "t1"}),
    ("create", {"enabled": True}),
    ("status", {"Session": "s1"}),
])
def test_unknown_fields_refused(action, extra):
    fields = dict(CONTROL_CASES[action][0], **extra)
    error = refused(parse_control, {"action": action, **fields}, match="unknown field(s)")
    assert all(repr(name) in error.message for name in extra if name not in ("lease",))


@pytest.mark.parametrize("action", ["acquire", "renew", "recover"])
def test_ttl_bounds_and_default(action):
    fields = {k: v for k, v in CONTROL_CASES[action][0].items() if k != "ttl"}
    assert parse_control({"action": action, **fields}).ttl == 300
    assert parse_control({"action": action, **fields, "ttl": 1}).ttl == 1
    assert parse_control({"action": action, **fields, "ttl": 3600}).ttl == 3600
    for bad in (0, -1, 3601, 10**9):
        refused(parse_control, {"action": action, **fields, "ttl": bad}, match="'ttl' must be between 1 and 3600 seconds")


def test_control_names_are_checked():
    refused(parse_control, {"action": "acquire", "session": "s|1"}, match="'session' must match")
    refused(parse_control, {"action": "acquire", "session": ""}, match="'session' must match")
    refused(parse_control, {"action": "begin", **LEASED, "transaction": "t" * 161}, match="'transaction' must match")
    refused(parse_control, {"action": "export", **LEASED, "encoding": "e", "transaction": "a b"}, match="'transaction' must match")


# --------------------------------------------------------------------------- generation requests


def test_request_ids_are_bounded_so_answers_never_echo_a_huge_one():
    """Issue 38: a cancel answer echoed a 100 KB request_id, a plain generation its rid in every frame."""
    longest = "memt|" + "s" * 160 + "|commit:99999|" + "n" * 160
    assert len(longest) < MAX_REQUEST_ID
    assert parse_control({"action": "cancel", **LEASED, "request_id": "r" * MAX_REQUEST_ID}).request_id == "r" * MAX_REQUEST_ID
    for size in (MAX_REQUEST_ID + 1, 100_000):
        error = refused(parse_control, {"action": "cancel", **LEASED, "request_id": "r" * size},
                        match=f"'request_id' is {size} characters long; request ids are at most {MAX_REQUEST_ID}")
        assert len(error.message) < 200
        error = refused(generate, {"rid": "r" * size, "input_ids": [1], "sampling_params": {"max_new_tokens": 1}},
                        match=f"'rid' is {size} characters long; request ids are at most {MAX_REQUEST_ID}")
        assert len(error.message) < 200
    assert generate({"rid": "r" * MAX_REQUEST_ID, "input_ids": [1], "sampling_params": {"max_new_tokens": 1}}).rid == "r" * MAX_REQUEST_ID


def test_spec_commit_example():
    event = generate(commit_body())
    assert event == Commit(rid=Rid("s1", "commit", "n1", 3), input_ids=(101, 102, 103), lease="L", transaction="t1", epoch="E")


def test_spec_query_example():
    event = generate(query_body())
    assert isinstance(event, Query)
    assert event.rid == Rid("s1", "query", "n2")
    assert event.input_ids == (101, 104, 105)
    assert event.sampling.max_new_tokens == 512
    assert (event.lease, event.epoch, event.stream, event.session_params) == ("L", "E", False, None)


def test_query_may_stream_and_omit_epoch():
    event = generate(query_body(stream=True, memt_epoch=...))
    assert event.stream is True and event.epoch is None


def test_query_sampling_fields():
    params = {"max_new_tokens": 0, "temperature": 0, "top_p": 0.5, "top_k": 20, "seed": 7, "stop": "END",
              "stop_token_ids": [2], "skip_special_tokens": False, "n": 1, "ignore_eos": False}
    sampling = generate(query_body(sampling_params=params)).sampling
    assert (sampling.max_new_tokens, sampling.temperature, sampling.top_p, sampling.top_k) == (0, 0.0, 0.5, 20)
    assert (sampling.seed, sampling.stop, sampling.stop_token_ids, sampling.skip_special_tokens) == (7, ("END",), (2,), False)
    assert generate(query_body(sampling_params={"max_new_tokens": 1, "stop": ["a", "b"]})).sampling.stop == ("a", "b")


@pytest.mark.parametrize("make", [commit_body, query_body], ids=["commit", "query"])
@pytest.mark.parametrize("ids, match", [
    (..., "'input_ids' is required"),
    (None, "'input_ids' is required"),
    ([], "one nonempty list of token ids"),
    ("101 102", "one nonempty list of token ids"),
    ([[101, 102, 103]], "batched 'input_ids' are not supported"),
    ([[101], [102], [103]], "batched 'input_ids' are not supported"),
    ([101, 1000, 103], "holds 1000, not a token id in [0, 1000)"),
    ([101, -1, 103], "holds -1"),
    ([101, True, 103], "holds True"),
    ([101, 102.0, 103], "holds 102.0"),
    ([101, "102", 103], "holds '102'"),
])
def test_input_ids_rules(make, ids, match):
    refused(generate, make(input_ids=ids), match=match)


def test_input_ids_limited_by_max_prefill_tokens():
    assert len(generate(query_body(input_ids=[1] * MAX_PREFILL)).input_ids) == MAX_PREFILL
    refused(generate, query_body(input_ids=[1] * (MAX_PREFILL + 1)), match=f"exceed max_prefill_tokens ({MAX_PREFILL})")
    ok = commit_body(rid=f"memt|s1|commit:{MAX_PREFILL}|n1", input_ids=[5] * MAX_PREFILL)
    assert generate(ok).rid.count == MAX_PREFILL
    refused(generate, commit_body(rid=f"memt|s1|commit:{MAX_PREFILL + 1}|n1", input_ids=[5] * (MAX_PREFILL + 1)),
            match="exceed max_prefill_tokens")


@pytest.mark.parametrize("make", [commit_body, query_body], ids=["commit", "query"])
@pytest.mark.parametrize("params, match", [
    (..., "'sampling_params' with an explicit 'max_new_tokens' is required"),
    (None, "'sampling_params' with an explicit 'max_new_tokens' is required"),
    ([0], "'sampling_params' must be an object"),
    ({}, "field 'max_new_tokens' is required"),
    ({"temperature": 0}, "field 'max_new_tokens' is required"),
    ({"max_new_tokens": -1}, "max_new_tokens must be non-negative"),
    ({"max_new_tokens": "0"}, "'max_new_tokens' must be an integer"),
    ({"max_new_tokens": 0.0}, "'max_new_tokens' must be an integer"),
    ({"max_new_tokens": False}, "'max_new_tokens' must be an integer"),
    ({"max_new_tokens": 0, "n": 2}, "sampling_params.n must be 1"),
    ({"max_new_tokens": 0, "ignore_eos": True}, "ignore_eos must remain false"),
    ({"max_new_tokens": 0, "best_of": 2}, "unsupported sampling_params field(s) 'best_of'"),
    ({"max_new_tokens": 0, "temperature": -0.5}, "temperature must be >= 0"),
    ({"max_new_tokens": 0, "temperature": float("nan")}, "'temperature' must be a finite number"),
    ({"max_new_tokens": 0, "temperature": 10**400}, "'temperature' must be a finite number"),
    ({"max_new_tokens": 0, "top_p": 0}, "top_p must be in (0, 1]"),
    ({"max_new_tokens": 0, "top_k": 0}, "top_k must be -1 or a positive integer"),
    ({"max_new_tokens": 0, "stop": [""]}, "stop must be a string or a list of nonempty strings"),
    ({"max_new_tokens": 0, "stop_token_ids": [True]}, "stop_token_ids must be a list of token ids"),
    ({"max_new_tokens": 0, "repetition_penalty": 3}, "repetition_penalty must be in (0, 2]"),
    ({"max_new_tokens": 0, "repetition_penalty": 0}, "repetition_penalty must be in (0, 2]"),
    ({"max_new_tokens": 0, "min_p": 1.5}, "min_p must be in [0, 1]"),
    ({"max_new_tokens": 0, "frequency_penalty": 2.5}, "frequency_penalty must be in [-2, 2]"),
    ({"max_new_tokens": 0, "presence_penalty": "1"}, "'presence_penalty' must be a finite number"),
    ({"max_new_tokens": 2, "min_new_tokens": 3}, "min_new_tokens must be between 0 and max_new_tokens"),
    ({"max_new_tokens": 0, "logit_bias": {"abc": 1}}, "logit_bias keys must be token ids below"),
    ({"max_new_tokens": 0, "logit_bias": {"999999": 1}}, "logit_bias keys must be token ids below"),
    ({"max_new_tokens": 0, "logit_bias": {"5": 101}}, "must be a number in [-100, 100]"),
    ({"max_new_tokens": 0, "logit_bias": [5]}, "'logit_bias' must be an object"),
    ({"max_new_tokens": 0, "json_schema": "{", "regex": "a"}, "at most one of sampling_params.json_schema, regex, ebnf"),
    ({"max_new_tokens": 0, "json_schema": "{not json"}, "sampling_params.json_schema is not valid JSON"),
    ({"max_new_tokens": 0, "json_schema": {"type": "object"}}, "'json_schema' must be a string"),
    ({"max_new_tokens": 0, "json_schema": "[1]"}, "json_schema must be a JSON object"),
])
def test_sampling_rules(make, params, match):
    refused(generate, make(sampling_params=params), match=match)


@pytest.mark.parametrize("depth", [MAX_SCHEMA_DEPTH + 1, 5_000, 100_000])
@pytest.mark.parametrize("opening, closing", [('{"type": "array", "items": ', "}"), ('{"anyOf": [', "]}"), ("[", "]")])
def test_a_deeply_nested_json_schema_is_refused_naming_the_bound(opening, closing, depth):
    """A schema is JSON inside a string, so the body's depth bound does not see it: parse_sampling bounds it (no RecursionError)."""
    params = {"max_new_tokens": 4, "json_schema": opening * depth + '{"type": "integer"}' + closing * depth}
    for body in (query_body(sampling_params=params), {"input_ids": [1], "sampling_params": params}):
        refused(generate, body, match=f"sampling_params.json_schema nests deeper than {MAX_SCHEMA_DEPTH} levels")


def test_a_json_schema_at_the_depth_bound_is_taken():
    schema = '{"type": "array", "items": ' * (MAX_SCHEMA_DEPTH - 1) + '{"type": "integer"}' + "}" * (MAX_SCHEMA_DEPTH - 1)
    assert generate(query_body(sampling_params={"max_new_tokens": 4, "json_schema": schema})).sampling.grammar == ("json_schema", schema)


def test_ignore_eos_false_and_n_one_are_accepted():
    """They are the defaults: the query is the one without them."""
    event = generate(query_body(sampling_params={"max_new_tokens": 3, "n": 1, "ignore_eos": False}))
    assert event == generate(query_body(sampling_params={"max_new_tokens": 3}))
    assert event.sampling.max_new_tokens == 3 and event.sampling.skip_eos is False


@pytest.mark.parametrize("rid, n", [("memt|s1|commit:2|n1", 3), ("memt|s1|commit:4|n1", 3), ("memt|s1|commit:1|n1", 2)])
def test_commit_count_must_match_input_ids(rid, n):
    refused(generate, commit_body(rid=rid, input_ids=list(range(n))), match="does not match")


def test_commit_rules():
    refused(generate, commit_body(sampling_params={"max_new_tokens": 1}), match="commits must set sampling_params.max_new_tokens to 0")
    refused(generate, commit_body(memt_transaction=...), match="commits must name their transaction in 'memt_transaction'")
    refused(generate, commit_body(memt_transaction="t|1"), match="'memt_transaction' must match")
    refused(generate, commit_body(memt_transaction=5), match="'memt_transaction' must match")
    refused(generate, commit_body(stream=True), match="only queries support stream: true")
    refused(generate, commit_body(session_params={"id": "s1"}), match="session_params are not accepted on commits")


@pytest.mark.parametrize("field", ["return_logprob", "return_hidden_states", "top_logprobs_num", "logprob_start_len", "return_text_in_logprobs"])
def test_commits_refuse_scores_and_hidden_states(field):
    refused(generate, commit_body(**{field: True if field.startswith("return") else 5}), match="do not return output scores or hidden states")
    assert generate(commit_body(**{field: False if field.startswith("return") else 0})) == generate(commit_body())  # falsy values ask for nothing


def test_queries_take_logprob_requests_but_not_hidden_states():
    query = generate(query_body(return_logprob=True, top_logprobs_num=3, return_text_in_logprobs=True))
    assert (query.sampling.logprobs, query.sampling.top_logprobs, query.sampling.logprob_text) == (True, 3, True)
    assert generate(query_body()).sampling.logprobs is False
    refused(generate, query_body(return_hidden_states=True), match="'return_hidden_states' is not supported by this engine")
    refused(generate, query_body(top_logprobs_num=2), match="need 'return_logprob': true")
    refused(generate, query_body(return_logprob=True, top_logprobs_num=21), match="'top_logprobs_num' must be between 0 and 20")
    refused(generate, query_body(return_logprob=True, logprob_start_len=0), match="input-token log-probabilities are not supported")


def test_sglang_sampling_fields_are_taken():
    params = {"max_new_tokens": 4, "min_p": 0.1, "frequency_penalty": 0.5, "presence_penalty": -0.5, "repetition_penalty": 1.3,
              "min_new_tokens": 2, "logit_bias": {"7": 5.0, "3": -100}, "json_schema": '{"type": "object"}'}
    sampling = generate(query_body(sampling_params=params)).sampling
    assert (sampling.min_p, sampling.frequency_penalty, sampling.presence_penalty, sampling.repetition_penalty) == (0.1, 0.5, -0.5, 1.3)
    assert sampling.min_new_tokens == 2 and sampling.logit_bias == ((3, -100.0), (7, 5.0))
    assert sampling.grammar == ("json_schema", '{"type": "object"}')
    assert generate(query_body(sampling_params={"max_new_tokens": 4, "regex": "[a-z]+"})).sampling.grammar == ("regex", "[a-z]+")
    refused(generate, commit_body(sampling_params={"max_new_tokens": 0, "regex": "a"}), match="commits generate nothing")


@pytest.mark.parametrize("field, value", [
    ("text", "hello"), ("text", ""), ("input_embeds", [[0.1]]), ("image_data", "img.png"),
    ("audio_data", "a.wav"), ("video_data", "v.mp4"),
])
@pytest.mark.parametrize("make", [commit_body, query_body], ids=["commit", "query"])
def test_non_token_inputs_refused_on_memt_requests(field, value, make):
    refused(generate, make(**{field: value}), match=f"{field!r} is not supported for MemT requests")


def test_lease_and_epoch_on_memt_requests():
    for make in (commit_body, query_body):
        refused(generate, make(memt_lease=...), match="'memt_lease' is required")
        refused(generate, make(memt_lease=""), match="'memt_lease' is required")
        refused(generate, make(memt_lease=5), match="'memt_lease' is required")
        refused(generate, make(memt_epoch=5), match="'memt_epoch' must be a string")


def test_query_rules():
    refused(generate, query_body(memt_transaction="t1"), match="queries do not take 'memt_transaction'")
    refused(generate, query_body(stream="yes"), match="'stream' must be a boolean")
    assert generate(query_body(session_params={"id": "s1"})).session_params == {"id": "s1"}
    for bad in ({"id": "s2"}, {"id": "s1", "rid": "x"}, {}, "s1"):
        refused(generate, query_body(session_params=bad), match='session_params may only be {"id": "s1"}')


@pytest.mark.parametrize("rid, match", [
    ("memt|s1|query", "is not memt|<session>|<operation>|<nonce>"),
    ("memtastic", "reserved for MemT"),
    ("memt|s1|commit:x|n", "positive integer count"),
    ("memt|s1|query|bad nonce", "rid nonce"),
])
def test_every_memt_prefixed_rid_is_validated(rid, match):
    refused(generate, query_body(rid=rid), match=match)
    # even when the body looks like an ordinary generation
    refused(generate, {"rid": rid, "text": "hi", "sampling_params": {"max_new_tokens": 1}}, match=match)


def test_plain_generation_without_memt_rid():
    event = generate({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4}})
    assert event == PlainGeneration(rid=None, input_ids=(1, 2), text=None, sampling=event.sampling, stream=False)
    event = generate({"rid": "req-1", "text": "hi", "sampling_params": {"max_new_tokens": 4}, "stream": True})
    assert isinstance(event, PlainGeneration)
    assert (event.rid, event.text, event.input_ids, event.stream) == ("req-1", "hi", None, True)
    assert isinstance(generate({"rid": "MEMT|s1|query|n", "text": "x", "sampling_params": {"max_new_tokens": 1}}), PlainGeneration)


@pytest.mark.parametrize("field", ["memt_lease", "memt_transaction", "memt_epoch"])
def test_plain_generation_may_not_carry_memt_fields(field):
    body = {"rid": "req-1", "input_ids": [1], "sampling_params": {"max_new_tokens": 1}, field: "x"}
    refused(generate, body, match=f"{field!r} needs a MemT rid")
    body.pop("rid")
    refused(generate, body, match=f"{field!r} needs a MemT rid")


def test_plain_generation_rules():
    params = {"max_new_tokens": 1}
    refused(generate, {"text": "a", "input_ids": [1], "sampling_params": params}, match="exactly one of 'text' or 'input_ids'")
    refused(generate, {"sampling_params": params}, match="exactly one of 'text' or 'input_ids'")
    refused(generate, {"text": ["a", "b"], "sampling_params": params}, match="'text' must be one string")
    refused(generate, {"rid": ["memt|s1|query|n1", "memt|s1|query|n2"], "input_ids": [[1], [2]], "sampling_params": params},
            match="'rid' must be a string (batched requests are not supported)")
    refused(generate, {"input_ids": [[1], [2]], "sampling_params": params}, match="batched 'input_ids'")
    refused(generate, {"text": "a", "image_data": "i.png", "sampling_params": params}, match="'image_data' is not supported")
    refused(generate, {"text": "a"}, match="'sampling_params' with an explicit 'max_new_tokens' is required")
    refused(generate, {"text": "a", "sampling_params": params, "lora_path": "x"}, match="'lora_path' is not supported")


def test_generate_body_shape():
    refused(generate, [commit_body()], match="must be a JSON object")
    refused(generate, commit_body(unknown_field=1), match="unknown field(s) 'unknown_field'")
    refused(generate, query_body(custom_logit_processor="x"), match="'custom_logit_processor' is not supported")


# --------------------------------------------------------------------------- any JSON: a 400 or an event, never a crash

json_scalars = st.none() | st.booleans() | st.integers() | st.integers(-(10**400), 10**400) | st.floats() | st.text(max_size=12)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                           max_leaves=6)
control_keys = sorted({"action", "session", "lease", "epoch", "ttl", "memory_read", "source", "source_lease", "retain_kv",
                       "transaction", "enabled", "encoding", "file", "overwrite", "request_id", "bogus"})
names = st.sampled_from(["s1", "t1", "L", "", "a|b", "x" * 161, "m.safetensors", "memt|s1|query|n1", "create", "begin"])
FUZZ = settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(action=st.sampled_from(sorted(CONTROL_ACTIONS)),
       changes=st.dictionaries(st.sampled_from(control_keys), json_values | names | st.just(...), max_size=3))
def test_any_control_body_is_an_event_or_a_400(action, changes):
    body = {k: v for k, v in {"action": action, **CONTROL_CASES[action][0], **changes}.items() if v is not ...}
    try:
        event = parse_control(body)
    except InvalidRequest as error:
        assert error.status == 400 and error.message
    else:
        assert action_name(event) == body["action"]


PLAIN = {"rid": "req-1", "input_ids": [1, 2], "sampling_params": {"max_new_tokens": 5}}
generate_fields = st.sampled_from(sorted(GENERATE_FIELDS | {"bogus"}))
sampling_fields = st.sampled_from(sorted(SAMPLING_FIELDS | {"best_of"}))
field_values = json_values | names | st.just([1, 2]) | st.just(...)  # ... removes the field


def mutated(base: dict, changes: dict) -> dict:
    body = {**base, **changes}
    return {k: v for k, v in body.items() if v is not ...}


@FUZZ
@given(base=st.sampled_from([commit_body(rid="memt|s1|commit:2|n1", input_ids=[1, 2]), query_body(), PLAIN]),
       changes=st.dictionaries(generate_fields, field_values, max_size=3),
       sampling=st.dictionaries(sampling_fields, field_values, max_size=3))
def test_any_generate_body_is_an_event_or_a_400(base, changes, sampling):
    body = mutated(base, changes)
    if isinstance(body.get("sampling_params"), dict):
        body["sampling_params"] = mutated(body["sampling_params"], sampling)
    try:
        event = generate(body)
    except InvalidRequest as error:
        assert error.status == 400 and error.message
    else:
        assert isinstance(event, (Query, Commit, PlainGeneration))
