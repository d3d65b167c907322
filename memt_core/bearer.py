"""API keys sent as ``Authorization: Bearer <key>``: the one parser and constant-time check that the core
server and the proxy (its routes and its cluster middleware) share."""

from __future__ import annotations

import hmac
from typing import Any


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization`` header value; None for no header or another scheme."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def matching(token: str | None, keys) -> Any:
    """What ``keys`` (key → value, or a list of keys) holds for ``token``, compared in constant time;
    None without a match (or without a token)."""
    if token is None:
        return None
    given = token.encode()
    for key in keys:
        if hmac.compare_digest(given, key.encode()):
            return keys[key] if isinstance(keys, dict) else key
    return None
