"""``--spec-strict`` refuses every control action this server adds to the spec (issue 48, item 6), and
docs/native.md lists every route and action the server has (item 8).

The server is the launcher's assembly over the fake engine (``test_engine_seam.serve_fake``), spoken to over HTTP.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from e2e.wire import assert_error
from fake_engine import FakeEngine
from memt_core.checkpoint import read_checkpoint
from memt_core.launch import assemble, build_parser, plan_launch
from memt_core.protocol.events import CONTROL_ACTIONS, EXTENSION_ACTIONS
from test_engine_seam import Served, serve_fake
from transformers import PreTrainedTokenizerFast

NATIVE_DOCS = Path(__file__).resolve().parents[2] / "docs" / "native.md"


def test_a_spec_strict_server_refuses_every_extension_action_and_changes_nothing(nano_checkpoint, tmp_path):
    args = build_parser().parse_args(["--model-path", str(nano_checkpoint), "--device", "cpu", "--state-directory", str(tmp_path), "--spec-strict"])
    plan = plan_launch(args)
    app, _ = assemble(plan, FakeEngine.load(plan.checkpoint, plan.engine_options()), tokenizer=PreTrainedTokenizerFast.from_pretrained(str(nano_checkpoint)))
    encoding = read_checkpoint(nano_checkpoint, validate_backbone=False).native_encoding()["name"]
    with Served(app) as http:
        epoch = http.get("/memt/capabilities").json()["epoch"]

        def control(action: str, **fields):
            return http.post("/memt/control", json={"action": action, "epoch": epoch, **fields})

        session = control("create", session="strict").json()["session"]
        lease = control("acquire", session=session).json()["lease"]
        held = {"session": session, "lease": lease}
        file = "strict.safetensors"
        assert control("export", encoding=encoding, file=file, **held).status_code == 200
        bodies = {"unload": held, "delete_snapshot": {"file": file, **held}}
        assert set(bodies) == set(EXTENSION_ACTIONS)
        for action, fields in bodies.items():
            answer = control(action, **fields)
            message = assert_error(answer, 400)
            assert f"got {action!r}" in message and "--spec-strict" in message
            assert "code" not in answer.json()["error"]  # as every answer of a strict server
        assert (tmp_path / file).is_file()  # delete_snapshot deleted nothing
        assert control("inspect", session=session).json()["leased"]  # unload unloaded nothing
        assert control("close", **held).status_code == 200


def test_a_server_without_spec_strict_takes_them(nano_checkpoint, tmp_path):
    with serve_fake(nano_checkpoint, tmp_path) as (wire, _, _):
        handle = wire.open()
        file = f"{handle.session}.safetensors"
        wire.ctl("export", handle, encoding=wire.encoding, file=file)
        assert set(wire.ctl("delete_snapshot", handle, file=file)) == {"file", "deleted"}  # the fake engine deletes no file
        assert wire.ctl("inspect", handle)["leased"]
        wire.ctl("unload", handle, expect=400)  # taken, and refused for its own reason: no snapshot store
        wire.ctl("close", handle)


@pytest.fixture(scope="module")
def native_docs() -> str:
    return NATIVE_DOCS.read_text(encoding="utf-8")


@pytest.mark.parametrize("action", sorted(CONTROL_ACTIONS))
def test_the_native_docs_list_every_control_action(native_docs, action):
    assert f"`{action}`" in native_docs


def test_the_native_docs_list_every_route(native_docs, nano_checkpoint, tmp_path):
    with serve_fake(nano_checkpoint, tmp_path) as (wire, _, _):
        paths = set(wire.http.get("/openapi.json").json()["paths"])
    assert {"/memt/control", "/generate", "/health"} <= paths
    documented = set(re.findall(r"`(?:GET|POST) (/[^`]*)`", native_docs))
    assert paths <= documented, f"routes docs/native.md does not list: {sorted(paths - documented)}"
