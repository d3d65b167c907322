"""The last resort of both servers (issue 58): an exception no handler takes is a 500 in the server's own error shape,
its trace logged once, and the keep-alive connection it came on goes on serving (Starlette's plain-text 500 closed it).

Each app is the real one (the core assembled over the pure-Python ``FakeEngine``, the proxy from its command line in
front of a closed port), served by uvicorn on 127.0.0.1; one route that raises is added to it, as the fault.
"""

from __future__ import annotations

import logging
import socket

import httpx
import pytest
from test_engine_seam import Served
from transformers import PreTrainedTokenizerFast

from fake_engine import FakeEngine


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def core_app(checkpoint, state):
    from memt_core.launch import assemble, build_parser, plan_launch

    plan = plan_launch(build_parser().parse_args(["--model-path", str(checkpoint), "--device", "cpu", "--state-directory", str(state)]))
    app, _ = assemble(plan, FakeEngine.load(plan.checkpoint, plan.engine_options()), tokenizer=PreTrainedTokenizerFast.from_pretrained(str(checkpoint)))
    return app


def proxy_app(checkpoint, state):
    from memt_proxy.__main__ import build_app, build_parser

    return build_app(build_parser().parse_args([
        "--upstream", f"http://127.0.0.1:{_closed_port()}", "--model-path", str(checkpoint), "--timeout", "5", "--state-directory", str(state)]))[0]


@pytest.mark.parametrize("server", ["core", "proxy"])
def test_an_unhandled_exception_is_a_shaped_500_on_a_connection_that_stays(nano_checkpoint, tmp_path, caplog, server):
    app = (core_app if server == "core" else proxy_app)(nano_checkpoint, tmp_path)

    @app.get("/boom")
    async def boom():
        raise RuntimeError("a bug no handler knows")

    with caplog.at_level(logging.INFO), Served(app) as http:
        http.close()
        with httpx.Client(base_url=str(http.base_url), timeout=30, limits=httpx.Limits(max_connections=1)) as one:
            failed = one.get("/boom")
            where = failed.extensions["network_stream"].get_extra_info("client_addr")
            after = one.get("/health")
            again = after.extensions["network_stream"].get_extra_info("client_addr")
    assert failed.status_code == 500 and failed.headers["content-type"] == "application/json", failed.text
    error = failed.json()["error"]
    if server == "proxy":  # OpenAI's shape
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "server_error" and error["code"] == "internal_error"
    else:  # the core's native shape
        assert set(error) == {"type", "message", "code"} and error["code"] == "internal_error"
    assert "a bug no handler knows" not in error["message"]  # nothing internal on the wire
    assert after.status_code == 200 and again == where  # the same keep-alive connection
    traces = [record for record in caplog.records if record.exc_info is not None]
    assert len(traces) == 1 and "/boom" in traces[0].getMessage(), [r.getMessage() for r in traces]
