"""Hostile requests against the live native server: each is a 4xx naming the problem, never a 500, and the server stays up."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from e2e.servers import HOST, REPO_ROOT
from e2e.wire import Wire, assert_error, nonce

PROMPT = [1, 2, 3]


@pytest.fixture
def wire(nano_server):
    with nano_server.client() as http:
        yield Wire(http)


def raw(wire: Wire, path: str, body: bytes) -> object:
    return wire.http.post(path, content=body, headers={"content-type": "application/json"})


@pytest.mark.parametrize("path", ["/generate", "/memt/control"])
@pytest.mark.parametrize("body, status, match", [
    (b'{"input_ids": [1], "sampling_params": {"max_new_tokens": ' + b"9" * 5000 + b"}}", 400, "integer of 5000 digits"),
    (b"[" * 10_000 + b"]" * 10_000, 400, "nests deeper"),
    (b'{"text": "a\\ud800", "sampling_params": {"max_new_tokens": 1}}', 400, "lone UTF-16 surrogate"),
    (b'{"rid": "memt|s|query|\\ud800", "input_ids": [1]}', 400, "lone UTF-16 surrogate"),
    (b'{"action": "inspect", "session": "\\udc00"}', 400, "lone UTF-16 surrogate"),
])
def test_malformed_bodies_are_400(wire, path, body, status, match):
    response = raw(wire, path, body)
    assert_error(response, status, match=match)
    assert len(response.content) < 4096


def test_oversized_bodies_are_413_and_errors_do_not_echo_input(wire):
    big = b'{"text": "' + b"a" * (9 * 1024 * 1024) + b'"}'
    response = raw(wire, "/generate", big)
    assert_error(response, 413, match="exceeds this server's limit")
    assert len(response.content) < 4096
    # a long bad value inside the limit: refused with a bounded message
    response = raw(wire, "/memt/control", b'{"action": "inspect", "session": "' + b"!" * 1_000_000 + b'"}')
    assert_error(response, 400)
    assert len(response.content) < 4096
    assert wire.http.get("/health").status_code == 200


def test_export_onto_a_directory_name_is_400(wire, nano_server):
    (nano_server.state_directory / "taken.safetensors").mkdir(exist_ok=True)
    h = wire.open()
    for overwrite in (False, True):
        response = wire.post_control({"action": "export", "session": h.session, "lease": h.lease, "epoch": wire.epoch,
                                      "file": "taken.safetensors", "encoding": wire.encoding, "overwrite": overwrite})
        assert_error(response, 400, match="names a directory")
    wire.ctl("close", h)


def test_a_taken_port_is_refused_before_the_model_loads(nano_checkpoint):
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run(
            [sys.executable, "-m", "memt_core.launch", "--model-path", str(nano_checkpoint), "--device", "cpu",
             "--host", HOST, "--port", str(port)],
            capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
        )
    assert run.returncode == 2
    assert f"cannot listen on {HOST}:{port}" in run.stderr and "Traceback" not in run.stderr
    assert "serving" not in run.stdout  # refused before building the engine


def test_a_nonce_with_a_surrogate_never_breaks_a_stream(wire):
    h = wire.open()
    body = wire.query_body(h, PROMPT, 2, nonce_="PLACEHOLDER", stream=True)
    payload = json.dumps(body).replace("PLACEHOLDER", "n\\ud800")  # the JSON escape of a lone surrogate
    assert_error(raw(wire, "/generate", payload.encode()), 400, match="surrogate")
    assert wire.query(h, PROMPT, 2, nonce_=nonce())["output_ids"]  # nothing was consumed, the session works
    wire.ctl("close", h)


def test_openai_paths_on_the_native_server_point_to_the_proxy(nano_server):
    import openai

    client = openai.OpenAI(base_url=f"{nano_server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="memt", messages=[{"role": "user", "content": "hi"}])
    assert "native memt-http-v1 server" in str(info.value) and "python -m memt_proxy" in str(info.value)


def test_docs_render_without_network(wire):
    """Swagger UI's page and every asset it names come from this server (no CDN)."""
    import re

    page = wire.http.get("/docs")
    assert page.status_code == 200 and "swagger-ui" in page.text
    urls = re.findall(r"""(?:src|href|url)\s*[:=]\s*['"]([^'"]+)['"]""", page.text)
    assert urls and not [u for u in urls if u.startswith(("http://", "https://", "//"))], urls
    for url in urls:
        asset = wire.http.get(url)
        assert asset.status_code == 200 and len(asset.content) > 100, url
    schema = wire.http.get("/openapi.json").json()
    assert "/generate" in schema["paths"] and "/memt/control" in schema["paths"]


def test_a_huge_text_is_refused_before_tokenising_and_the_server_stays_responsive(wire):
    text = "word " * 1_000_000  # 5 MB: far more characters than max_prefill_tokens tokens can hold
    response = wire.http.post("/generate", json={"text": text, "sampling_params": {"max_new_tokens": 1}})
    assert_error(response, 400, match="more than max_prefill_tokens")
    assert wire.http.get("/health").status_code == 200


def test_a_client_that_stalls_in_its_headers_is_disconnected(nano_checkpoint, memt_servers):
    """The connection is closed once --header-timeout passes (waiting on the socket's state, not a sleep)."""
    server = memt_servers(nano_checkpoint, "--header-timeout", "1", snapshots=False)
    with socket.create_connection((HOST, server.port), timeout=60) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Le")  # half a header, then nothing
        assert sock.recv(1024) == b""  # closed by the server
    with server.client() as http:
        assert http.get("/health").status_code == 200


def test_a_body_that_never_arrives_is_408(nano_checkpoint, memt_servers):
    server = memt_servers(nano_checkpoint, "--body-timeout", "1", snapshots=False)
    with socket.create_connection((HOST, server.port), timeout=60) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"te")
        reply = b""
        while b"did not arrive" not in reply:  # headers and body may come in separate packets
            chunk = sock.recv(4096)
            assert chunk, reply
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in reply


@pytest.mark.parametrize("depth", [5_000, 100_000])
def test_deeply_nested_grammars_are_400_and_change_nothing(wire, depth):
    """Issue 38: a json_schema nested thousands deep was a RecursionError (a 500); regex and ebnf sources as deep are 400s too."""
    schema = '{"type": "array", "items": ' * depth + '{"type": "integer"}' + "}" * depth
    grammars = [
        ("json_schema", schema, "sampling_params.json_schema nests deeper than 64 levels"),
        ("regex", "(" * depth + "a" + ")" * depth, "sampling_params.regex does not compile"),
        ("ebnf", "root ::= " + "(" * depth + '"a"' + ")" * depth, "sampling_params.ebnf does not compile"),
        ("ebnf", "%llguidance {}\nstart: %json " + schema, "sampling_params.ebnf does not compile"),
    ]
    h = wire.open()
    kept = nonce()
    for field, source, match in grammars:
        response = wire.post_generate(wire.query_body(h, PROMPT, 2, nonce_=kept, **{field: source}))
        assert_error(response, 400, match=match)
        assert len(response.content) < 4096
        plain = wire.post_generate({"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, field: source}})
        assert_error(plain, 400, match=match)
    assert wire.control("inspect", h.session)["in_flight"] == []
    assert wire.query(h, PROMPT, 2, nonce_=kept)["output_ids"]  # the refused queries consumed nothing, not even the nonce
    wire.ctl("close", h)


def test_answers_never_echo_a_huge_request_id_or_path(wire):
    """Issue 38: cancel echoed a 100 KB request_id in its answer, and a 404 a 50 KB path; both are bounded now."""
    h = wire.open()
    huge = "r" * 100_000
    response = wire.post_control({"action": "cancel", "session": h.session, "lease": h.lease, "epoch": wire.epoch, "request_id": huge})
    assert_error(response, 400, match="'request_id' is 100000 characters long; request ids are at most")
    assert len(response.content) < 1024
    response = wire.post_generate({"rid": huge, "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}})
    assert_error(response, 400, match="'rid' is 100000 characters long")
    assert len(response.content) < 1024
    # an ordinary cancel still answers with its request id
    answer = wire.ctl("cancel", h, request_id=f"memt|{h.session}|query|{nonce()}")
    assert answer["cancelled"] is False and answer["request_id"].startswith(f"memt|{h.session}|query|")
    for method in ("GET", "POST"):
        response = wire.http.request(method, "/" + "p" * 50_000)
        message = assert_error(response, 404, match=r"/ppp+… \(50001 characters\): Not Found")
        assert len(response.content) < 1024 and message.startswith(f"{method} /ppp")
    wire.ctl("close", h)


def test_content_addressed_snapshots_cannot_be_overwritten(wire, nano_server):
    """Issue 38: export with overwrite: true replaced a sha256-<hex> snapshot with other bytes, and its restore then
    failed the hash check. Such names are immutable on the core; the same bytes again succeed without a rewrite."""
    a, b = wire.open(), wire.open()
    wire.write(a, [5, 6, 7])
    wire.write(b, [8, 9])
    name = wire.export(a)["file"]
    path = nano_server.state_directory / name
    data, before = path.read_bytes(), path.stat()
    for overwrite in (True, False):
        response = wire.post_control({"action": "export", "session": b.session, "lease": b.lease, "epoch": wire.epoch,
                                      "file": name, "encoding": wire.encoding, "overwrite": overwrite})
        assert_error(response, 400, match="is content-addressed: it may hold only the bytes its name hashes")
    made_up = "sha256-" + "0" * 64 + ".safetensors"
    response = wire.post_control({"action": "export", "session": b.session, "lease": b.lease, "epoch": wire.epoch,
                                  "file": made_up, "encoding": wire.encoding})
    assert_error(response, 400, match="is content-addressed")
    assert not (nano_server.state_directory / made_up).exists()
    assert path.read_bytes() == data
    assert wire.export(a, name, overwrite=True)["file"] == name  # the bytes it names: nothing is rewritten
    assert (path.stat().st_ino, path.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    wire.ctl("begin", b, transaction="t-restore")
    wire.ctl("import", b, transaction="t-restore", file=name, encoding=wire.encoding)  # the hash check passes
    wire.ctl("publish", b, transaction="t-restore")
    assert wire.export(b)["file"] == name
    for handle in (a, b):
        wire.ctl("close", handle)
