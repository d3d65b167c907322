"""The bearer-token parser and key check shared by the core server and the proxy."""

from memt_core.bearer import bearer_token, matching


def test_only_the_bearer_scheme_yields_a_token():
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer   abc ") == "abc"  # the scheme is case-insensitive; spaces around the token go
    assert bearer_token("Basic abc") is None
    assert bearer_token("abc") is None
    assert bearer_token("") is None and bearer_token(None) is None


def test_a_key_matches_only_itself():
    tenants = {"key-a": "tenant-a", "key-b": "tenant-b"}
    assert matching("key-b", tenants) == "tenant-b"  # a mapping gives the key's value
    assert matching("key-b", ["key-a", "key-b"]) == "key-b"  # a list gives the key
    assert matching("key-", tenants) is None and matching("key-bb", tenants) is None
    assert matching(None, tenants) is None and matching("key-a", []) is None
    assert matching("clé-ä", ["key-a"]) is None  # any client string is simply unequal, never an error
