"""The proxy's HTTP layer in-process (FastAPI TestClient), with the real ChatService and chat format
of a tiny checkpoint; its upstream is a closed port, so everything here is decided before (or by
failing to reach) the upstream: request validation, headers, auth, error shapes, the OpenAPI schema,
the command line and the tenant-scoped session ids.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from memt_core.errors import CheckpointError
from memt_core.protocol.events import check_name
from memt_proxy.__main__ import build_app, build_parser, load_api_keys
from memt_proxy.session.sessions import native_session_id

ROOT = Path(__file__).resolve().parents[3]
GOOD = {"model": "tiny-random-nano", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def app(nano_checkpoint, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("# key tenant\nkey-a alpha\nkey-b beta\n")
    args = build_parser().parse_args([
        "--upstream", f"http://127.0.0.1:{closed_port()}", "--model-path", str(nano_checkpoint),
        "--api-keys-file", str(keys), "--api-key", "key-default", "--timeout", "5",
    ])
    return build_app(args)[0]


@pytest.fixture(scope="module")
def http(app):
    with TestClient(app, headers={"Authorization": "Bearer key-a"}) as client:
        yield client


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def test_models_and_health(http):
    assert http.get("/health").json() == {"status": "ok"}
    assert http.get("/v1/models").json() == {"object": "list", "data": [{"id": "tiny-random-nano", "object": "model", "created": 0, "owned_by": "memt"}]}


@pytest.mark.parametrize("auth", [None, "Bearer nope", "Basic key-a", "Bearer ", "key-a", "Bearer key-a2", "Bearer key-"])
def test_auth(http, auth):
    headers = {"Authorization": auth} if auth is not None else {"Authorization": ""}
    for response in (http.get("/v1/models", headers=headers), http.post("/v1/chat/completions", json=GOOD, headers=headers),
                     http.post("/v1/memt/sessions/s/reset", headers=headers)):
        error = error_of(response, 401)
        assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"


def test_every_key_maps_to_a_tenant(http):
    for key in ("key-a", "key-b", "key-default"):
        assert http.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
    assert http.get("/v1/models", headers={"Authorization": "bearer key-b"}).status_code == 200  # scheme is case-insensitive


def test_body_errors(http):
    assert error_of(http.post("/v1/chat/completions", content=b"{oops"), 400)["type"] == "invalid_request_error"
    assert error_of(http.post("/v1/chat/completions", json=[GOOD]), 400)["type"] == "invalid_request_error"
    assert error_of(http.post("/v1/chat/completions", json={"model": "x"}), 400)["param"] == "messages"
    assert error_of(http.post("/v1/chat/completions", json={**GOOD, "n": 0}), 400)["param"] == "n"
    assert error_of(http.post("/v1/chat/completions", json={**GOOD, "model": "other"}), 404)["code"] == "model_not_found"
    assert error_of(http.post("/v1/chat/completions", json=GOOD, headers={"X-MemT-Memory": "all"}), 400)["param"] == "X-MemT-Memory"
    assert error_of(http.post("/v1/chat/completions", json=GOOD, headers={"X-MemT-Session": "no spaces"}), 400)["code"] == "invalid_session"
    assert error_of(http.post("/v1/chat/completions", json=GOOD, headers={"X-MemT-On-Divergence": "x"}), 400)["param"] == "X-MemT-On-Divergence"


def test_admin_body_errors(http):
    assert error_of(http.post("/v1/memt/sessions/s/restore", json={}), 400)["param"] == "name"
    assert error_of(http.post("/v1/memt/sessions/s/restore", json={"name": "../../etc/passwd"}), 400)["code"] == "invalid_snapshot_name"
    assert error_of(http.post("/v1/memt/sessions/s/snapshots", json={"name": "x.bin"}), 400)["code"] == "invalid_snapshot_name"
    assert error_of(http.post("/v1/memt/sessions/s/snapshots", json={"overwrite": "maybe"}), 400)["param"] == "overwrite"


def test_unknown_routes_in_openai_shape(http):
    assert error_of(http.get("/v1/completions"), 404)["code"] == "not_found"
    assert error_of(http.put("/v1/chat/completions", json=GOOD), 405)["type"] == "invalid_request_error"


def test_unreachable_upstream_is_503(http):
    for headers in ({}, {"X-MemT-Session": "s1"}):
        error = error_of(http.post("/v1/chat/completions", json=GOOD, headers=headers), 503)
        assert error["type"] == "upstream_error" and error["code"] == "upstream_unavailable"
    assert error_of(http.get("/v1/memt/sessions/s1"), 503)["type"] == "upstream_error"
    assert error_of(http.post("/v1/chat/completions", json={**GOOD, "stream": True}), 503)["type"] == "upstream_error"


def test_openapi_documents_the_session_routes(http):
    paths = http.get("/openapi.json").json()["paths"]
    assert set(paths["/v1/memt/sessions/{session}"]) == {"get", "delete"}
    for route in ("snapshots", "restore", "reset"):
        assert set(paths[f"/v1/memt/sessions/{{session}}/{route}"]) == {"post"}
    assert "post" in paths["/v1/chat/completions"] and "get" in paths["/v1/models"]


# ---------------------------------------------------------------------- sessions and tenants


def test_native_session_ids_are_tenant_scoped():
    a, b = native_session_id("alpha", "chat"), native_session_id("beta", "chat")
    assert a != b and a == native_session_id("alpha", "chat")
    assert native_session_id("alpha", "chat2") != a
    assert native_session_id("al", "phachat") != native_session_id("alpha", "chat")  # no concatenation collisions
    for name in (a, b, native_session_id("t" * 200, "s" * 160)):
        assert check_name(name, "session") == name and len(name) <= 160


# ---------------------------------------------------------------------- command line


def test_api_keys_files(tmp_path):
    as_json = tmp_path / "keys.json"
    as_json.write_text(json.dumps({"k1": "t1", "k2": "t2"}))
    assert load_api_keys(["k0"], str(as_json)) == {"k0": "default", "k1": "t1", "k2": "t2"}
    lines = tmp_path / "keys.txt"
    lines.write_text("k1 t1\n\n# comment\n  k2   t2  \n")
    assert load_api_keys([], str(lines)) == {"k1": "t1", "k2": "t2"}
    assert load_api_keys(["a", "b"], None) == {"a": "default", "b": "default"}
    bad = tmp_path / "bad.txt"
    bad.write_text("just-a-key\n")
    with pytest.raises(CheckpointError, match="bad.txt:1"):
        load_api_keys([], str(bad))
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"k": 1}))
    with pytest.raises(CheckpointError):
        load_api_keys([], str(wrong))


def test_help_explains_every_option():
    text = subprocess.run([sys.executable, "-m", "memt_proxy", "--help"], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    options = set(re.findall(r"--[a-z][a-z-]+", text)) - {"--help"}
    expected = {"--upstream", "--upstream-api-key", "--host", "--port", "--api-key", "--api-keys-file", "--default-memory",
                "--model-path", "--served-model-name", "--thinking", "--on-divergence", "--lease-wait", "--timeout", "--log-level",
                "--max-sessions"}
    assert expected <= options
    for action in build_parser()._actions:
        assert action.help, action.option_strings


def test_max_sessions_is_a_positive_count(capsys):
    assert build_parser().parse_args([]).max_sessions == 1024
    assert build_parser().parse_args(["--max-sessions", "2"]).max_sessions == 2
    for bad in ("0", "-3", "many"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--max-sessions", bad])
    assert "--max-sessions" in capsys.readouterr().err


def test_refuses_a_missing_checkpoint(tmp_path):
    result = subprocess.run([sys.executable, "-m", "memt_proxy", "--model-path", str(tmp_path / "none")], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 2 and "refused" in result.stderr


def test_docs_load_their_assets_from_the_proxy_itself(http):
    """Offline docs: the page names no CDN, and every asset it names is served here."""
    import re

    page = http.get("/docs")
    assert page.status_code == 200
    urls = re.findall(r"""(?:src|href)\s*=\s*['"]([^'"]+)['"]""", page.text)
    assert urls and not [u for u in urls if u.startswith(("http://", "https://", "//"))], urls
    for url in urls:
        assert http.get(url).status_code == 200, url


def test_metrics_are_the_operators_once_an_operator_key_is_set(nano_checkpoint):
    """Node-wide counts are no tenant's business (issue 38): with --admin-key a tenant's key gets 403."""
    args = build_parser().parse_args(["--model-path", str(nano_checkpoint), "--api-key", "tenant-key", "--admin-key", "operator-key"])
    with TestClient(build_app(args)[0]) as http:
        assert http.get("/metrics").status_code == 401
        assert http.get("/metrics", headers={"Authorization": "Bearer tenant-key"}).status_code == 403
        assert http.get("/metrics", headers={"Authorization": "Bearer operator-key"}).status_code == 200
