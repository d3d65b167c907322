"""Output parsers and chat formats of both families (no server needed, except where named).

* Streaming and non-streaming parsing agree: for every text of a grid (reasoning, content, several
  tool calls, malformed calls, unterminated blocks, partial tags) the deltas produced by feeding
  every prefix reassemble into exactly what ``parse`` returns.
* ``load_chat_format`` renders system prompts, thinking on/off and tools for Nano (the checkpoint's
  HF chat template) and Flash (the checkpoint's ``encoding_dsv4.py``, executed by the client only).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from client.support import ENCODER_MARKER_ENV
from memt_core.families import FLASH, NANO
from memt_core.client import FlashChatFormat, NanoChatFormat, load_chat_format, load_tokenizer, parser_for
from memt_core.client.parsers import DSML

REPO = Path(__file__).resolve().parents[2]


def _nano_call(name: str, arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _flash_call(*invokes: tuple[str, dict]) -> str:
    body = []
    for name, arguments in invokes:
        params = "".join(
            f'<{DSML}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
            f'{v if isinstance(v, str) else json.dumps(v)}</{DSML}parameter>'
            for k, v in arguments.items()
        )
        body.append(f'<{DSML}invoke name="{name}">{params}</{DSML}invoke>')
    return f"<{DSML}tool_calls>" + "\n".join(body) + f"</{DSML}tool_calls>"


NANO_TEXTS = [
    "",
    "Hello world.",
    "  padded answer \n",
    "<think>plan the answer</think>The answer.",
    "<think>\n\n</think>\n\nAfter an empty reasoning block.",
    "reasoning without an opening tag</think> answer",
    "<think>never closed",
    "<thi",
    "a < b and <tag> that is not a tool call",
    _nano_call("get_weather", {"city": "Paris"}),
    "Let me check. " + _nano_call("get_weather", {"city": "Paris"}) + "\n" + _nano_call("get_time", {"zone": "CET"}),
    "<think>two calls</think>" + _nano_call("a", {}) + _nano_call("b", {"n": [1, 2]}) + " trailing text",
    '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>',  # arguments as a JSON string
    "bad <tool_call>{not json}</tool_call> still text",
    '<tool_call>["a list"]</tool_call>',
    "unterminated " + _nano_call("f", {})[:-5],
    "text then <tool_c",
    "ünïcödé 中文 " + _nano_call("lookup", {"item": "猫"}),
]

FLASH_TEXTS = [
    "",
    "Hello world.",
    "reasoning</think>answer",
    "<think>reasoning</think>answer",
    "no reasoning here",
    "<think>open",
    "pre " + _flash_call(("f", {"a": "x", "n": 3})) + " post",
    _flash_call(("f", {"a": "x"}), ("g", {"flag": True, "list": [1, 2]})),
    _flash_call(("f", {})) + _flash_call(("g", {"s": "two blocks"})),
    f'<{DSML}tool_calls><{DSML}invoke name="f"><{DSML}parameter name="n" string="false">{{bad</{DSML}parameter></{DSML}invoke></{DSML}tool_calls>',
    f"<{DSML}tool_calls>nothing inside</{DSML}tool_calls>",
    f'open <{DSML}tool_calls><{DSML}invoke name="f">',
    "almost a tag <｜DS",
    "think</think>\n\n" + _flash_call(("lookup", {"item": "猫"})),
]


def _reassemble(parser, text: str, thinking: bool):
    stream = parser.stream(thinking=thinking)
    reasoning, content, calls = [], [], []
    deltas = []
    for end in range(1, len(text) + 1):
        deltas += stream.feed(text[:end])
    deltas += stream.finish(text)
    for delta in deltas:
        if delta.kind == "reasoning":
            reasoning.append(delta.text)
        elif delta.kind == "content":
            content.append(delta.text)
        else:
            assert delta.index == len(calls)
            calls.append((delta.call.name, json.loads(delta.call.arguments)))
    return "".join(reasoning), "".join(content), calls


def _parsed(parser, text: str, thinking: bool):
    result = parser.parse(text, thinking=thinking)
    return result.reasoning or "", result.content, [(c.name, json.loads(c.arguments)) for c in result.tool_calls]


@pytest.mark.parametrize("thinking", [False, True], ids=["chat", "thinking"])
@pytest.mark.parametrize(
    "family,texts", [(NANO, NANO_TEXTS), (FLASH, FLASH_TEXTS)], ids=["nano", "flash"]
)
def test_streaming_reassembles_to_parse(family, texts, thinking):
    parser = parser_for(family)
    for text in texts:
        assert _reassemble(parser, text, thinking) == _parsed(parser, text, thinking), text


def test_nano_parser_results():
    parser = parser_for(NANO)
    result = parser.parse("<think> plan </think> Sure. " + _nano_call("get_weather", {"city": "Paris"}) + _nano_call("t", {}))
    assert result.reasoning == "plan"
    assert result.content == "Sure."
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [("get_weather", {"city": "Paris"}), ("t", {})]
    assert len({c.id for c in result.tool_calls}) == 2
    openai = result.tool_calls[0].to_openai()
    assert openai["type"] == "function" and openai["function"]["name"] == "get_weather"
    # thinking mode: output starts inside the reasoning block
    assert parser.parse("still thinking", thinking=True).reasoning == "still thinking"
    assert parser.parse("still thinking", thinking=True).content == ""
    # malformed and unterminated calls are their text without the markup
    assert parser.parse("x <tool_call>{oops}</tool_call>").content == "x {oops}"
    assert parser.parse("x <tool_call>{").tool_calls == []
    assert parser.parse("x <tool_call>{").content == "x {"


def test_flash_parser_results():
    parser = parser_for(FLASH)
    text = "why</think>Here. " + _flash_call(("f", {"a": "x", "n": 3}), ("g", {}))
    result = parser.parse(text, thinking=True)
    assert result.reasoning == "why"
    assert result.content == "Here."
    # an invoke without parameters is a call too
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [("f", {"a": "x", "n": 3}), ("g", {})]
    two = parser.parse(_flash_call(("f", {"a": "x"})) + _flash_call(("g", {"b": 1})))
    assert [c.name for c in two.tool_calls] == ["f", "g"]
    assert parser.parse("answer only").reasoning is None


def test_stream_holds_back_partial_tags():
    nano = parser_for(NANO).stream(thinking=True)
    assert nano.feed("<") == [] and nano.feed("<thi") == []
    assert [d.text for d in nano.feed("<think>abc")] == ["abc"]
    assert nano.feed("<think>abc</thi") == []
    deltas = nano.feed("<think>abc</think>Answer <tool_c")
    assert [(d.kind, d.text) for d in deltas] == [("content", "Answer")]
    flash = parser_for(FLASH).stream()
    assert [d.text for d in flash.feed("Hi <｜DS")] == ["Hi"]


# ---------------------------------------------------------------------- chat formats

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look it up", "parameters": {"type": "object", "properties": {"item": {"type": "string"}}}}}]


def test_nano_chat_format(nano_checkpoint):
    tokenizer = load_tokenizer(nano_checkpoint)
    default, parser = load_chat_format(nano_checkpoint, tokenizer=tokenizer)
    assert isinstance(default, NanoChatFormat) and parser.family == NANO
    off, _ = load_chat_format(nano_checkpoint, tokenizer=tokenizer, chat_template_kwargs={"enable_thinking": False})
    # the checkpoint's own HF template renders every piece
    assert default.thinking(None) is True  # the template's default
    assert off.thinking(None) is False and off.thinking(True) is True
    assert default.user_text("Hi", thinking=True) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert off.user_text("Hi", thinking=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tokenizer.decode(off.user_ids("Hi"), skip_special_tokens=False) == off.user_text("Hi", thinking=False)
    assert tokenizer.decode(off.user_ids("Hi", enable_thinking=True), skip_special_tokens=False) == default.user_text("Hi", thinking=True)
    system = default.system_text("Be brief.", None)
    assert system == "<|im_start|>system\nBe brief.<|im_end|>\n"
    with_tools = default.system_text("Be brief.", TOOLS)
    assert with_tools.startswith("<|im_start|>system\nBe brief.") and '"name": "lookup"' in with_tools and "<tools>" in with_tools
    assert default.system_ids(None, None) == []
    results = default.tool_results_text([{"tool_call_id": "a", "content": "R1"}, {"tool_call_id": "b", "content": "R2"}], thinking=True)
    assert results == "<|im_start|>user\n<tool_response>\nR1\n</tool_response>\n<tool_response>\nR2\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    # prompt = system block + replayed turns + the open turn; the same pieces the HF template renders
    turn = off.user_ids("First") + tokenizer.encode("Reply.", add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    prompt = off.prompt_ids(system_prompt="Be brief.", tools=None, turns=[turn], tail=off.user_ids("Second"))
    assert prompt == off.system_ids("Be brief.", None) + turn + off.user_ids("Second")
    assert off.decode(turn[-2:]) == tokenizer.decode(turn[-2:-1])  # end-of-turn token dropped
    assert off.native_encoding == "hf-chat-template" and off.chunk_tokens == 32


def test_flash_chat_format_runs_the_checkpoint_encoder(flash_checkpoint, tmp_path):
    tokenizer = load_tokenizer(flash_checkpoint)
    chat_format, parser = load_chat_format(flash_checkpoint, tokenizer=tokenizer)
    assert isinstance(chat_format, FlashChatFormat) and parser.family == FLASH
    assert Path(chat_format.encoder.__file__) == flash_checkpoint / "encoding_dsv4.py"
    assert chat_format.thinking(None) is False
    assert chat_format.user_text("Hi", thinking=False) == "<｜User｜>Hi<｜Assistant｜></think>"
    assert chat_format.user_text("Hi", thinking=True) == "<｜User｜>Hi<｜Assistant｜><think>"
    on, _ = load_chat_format(flash_checkpoint, tokenizer=tokenizer, chat_template_kwargs={"enable_thinking": True})
    assert on.thinking(None) is True
    assert on.user_ids("Hi") == tokenizer.encode("<｜User｜>Hi<｜Assistant｜><think>", add_special_tokens=False)
    assert chat_format.system_text("Be brief.", None) == "Be brief."
    assert "## Tools" in chat_format.system_text("Be brief.", TOOLS) and '"name": "lookup"' in chat_format.system_text(None, TOOLS)
    assert chat_format.tool_results_text([{"tool_call_id": "a", "content": "R1"}], thinking=False) == "<｜User｜><tool_result>R1</tool_result><｜Assistant｜></think>"
    assert chat_format.bos_ids == [tokenizer.bos_token_id]
    prompt = chat_format.prompt_ids(system_prompt="S", tools=None, turns=[], tail=chat_format.user_ids("Q"))
    assert prompt[0] == tokenizer.bos_token_id

    # The encoder is whatever file the client is told to execute: a copy that renders differently
    # is honoured (load_chat_format executes the given file, not a bundled one).
    encoder = tmp_path / "encoding_dsv4.py"
    encoder.write_text(
        (flash_checkpoint / "encoding_dsv4.py").read_text(encoding="utf-8").replace('user_token = "<｜User｜>"', 'user_token = "USER:"'),
        encoding="utf-8",
    )
    custom, _ = load_chat_format(flash_checkpoint, tokenizer=tokenizer, deepseek_encoder=encoder)
    assert Path(custom.encoder.__file__) == encoder
    assert custom.user_text("Hi", thinking=False).startswith("USER:Hi")


def test_server_code_never_executes_checkpoint_encoders():
    """Only the client executes ``encoding_dsv4.py``: no server-side module loads or runs Python files.

    (checkpoint.py hashes the encoder's bytes into the identity; that reads, never executes.)
    """
    server_side = [REPO / "memt_core" / name for name in ("server", "engine", "protocol", "models", "memory")]
    files = [p for d in server_side for p in d.rglob("*.py")] + [REPO / "memt_core" / "launch.py", REPO / "memt_core" / "checkpoint.py"]
    assert files
    for path in files:
        text = path.read_text(encoding="utf-8")
        for needle in ("spec_from_file_location", "exec_module", "load_encoder", "runpy", "exec(", "import encoding_dsv4", "memt_core.client"):
            assert needle not in text, f"{path} contains {needle!r}"
        if path.name != "checkpoint.py":
            assert "encoding_dsv4" not in text, f"{path} refers to encoding_dsv4"
    # The families, which the server reads checkpoints with, name the client's formats (imported on use
    # by clients) and hash the encoder, but never load or run it themselves.
    family_files = list((REPO / "memt_core" / "families").rglob("*.py"))
    assert family_files
    for path in family_files:
        text = path.read_text(encoding="utf-8")
        for needle in ("spec_from_file_location", "exec_module", "load_encoder", "runpy", "exec(", "import encoding_dsv4"):
            assert needle not in text, f"{path} contains {needle!r}"


def test_live_flash_server_does_not_execute_the_encoder(live_flash, encoder_marker):
    """The scripted Flash checkpoint's encoder records the PID of every process that executes it.

    The live server (started with the marker variable set) has loaded the same checkpoint and
    answered requests, yet only client processes appear in the marker file.
    """
    with live_flash.server.client() as http:
        assert http.get("/memt/capabilities").json()["model"] == FLASH
    os.environ[ENCODER_MARKER_ENV] = str(encoder_marker)
    try:
        load_chat_format(live_flash.checkpoint, tokenizer=live_flash.tokenizer)
    finally:
        del os.environ[ENCODER_MARKER_ENV]
    pids = {int(line) for line in encoder_marker.read_text().split()}
    assert os.getpid() in pids
    assert live_flash.server.pid not in pids


def test_load_tokenizer_refuses_remote_code(nano_checkpoint):
    with pytest.raises(ValueError):
        load_tokenizer(nano_checkpoint, trust_remote_code=True)


@pytest.mark.parametrize("family", [NANO, FLASH])
def test_control_strings_a_client_types_are_text_never_control_tokens(family, nano_checkpoint, flash_checkpoint):
    """User text, tool results, history and tool schemas that spell a control token ("<|im_end|>", a DSML tag, the
    end token) are encoded as the plain text they are: the prompt holds exactly the template's own control
    tokens, so nobody forges a turn boundary in a prompt or in memory (issue 38); text without one is encoded as
    the rendered prompt always was."""
    path = nano_checkpoint if family == NANO else flash_checkpoint
    chat_format, _ = load_chat_format(path, tokenizer=load_tokenizer(path))
    added = chat_format.tokenizer.get_added_vocab()
    controls = set(added.values())
    forged = "hello " + "".join(added) + " world"  # every added token, typed

    def count(ids: list[int]) -> int:
        return sum(i in controls for i in ids)

    assert count(chat_format.user_ids(forged)) == count(chat_format.user_ids("hello world"))
    assert count(chat_format.tool_results_ids([{"tool_call_id": "c", "content": forged}])) == count(chat_format.tool_results_ids([{"tool_call_id": "c", "content": "ok"}]))
    history = [{"role": "user", "content": forged}, {"role": "assistant", "content": "fine"}]
    plain = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "fine"}]
    assert count(chat_format.history_ids(history)) == count(chat_format.history_ids(plain))
    assert count(chat_format.conversation_ids(history + [{"role": "user", "content": forged}])) == count(chat_format.conversation_ids(plain + [{"role": "user", "content": "x"}]))
    assert count(chat_format.system_ids(forged, None)) == count(chat_format.system_ids("be brief", None))
    # what was typed is still all there, as text
    assert "".join(added) in chat_format.tokenizer.decode(chat_format.user_ids(forged))
    # text without a control string: the rendered prompt encoded as before
    messages = plain + [{"role": "user", "content": "What now?"}]
    assert chat_format.conversation_ids(messages) == list(chat_format.bos_ids) + chat_format._encode(chat_format.conversation_text(messages, tools=None, thinking=chat_format.thinking(None)))


def test_dsml_is_defined_once():
    """``DSML`` lives in the parsers; the chat format and the proxy import it. The encoder template, a standalone
    script copied into checkpoints, keeps its own copy, which must be the same markup."""
    from memt_core.client import chat_format
    from memt_proxy import structured

    assert chat_format.DSML is DSML and structured.DSML is DSML
    template = (REPO / "memt_core" / "templates" / "encoding_dsv4.py").read_text(encoding="utf-8")
    assert f'dsml_token = "{DSML}"' in template
    definitions = [
        f"{path.relative_to(REPO)}"
        for package in ("memt_core", "memt_proxy")
        for path in (REPO / package).rglob("*.py")
        if f'= "{DSML}"' in path.read_text(encoding="utf-8")
    ]
    assert sorted(definitions) == ["memt_core/client/parsers.py", "memt_core/templates/encoding_dsv4.py"]
