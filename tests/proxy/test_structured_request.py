"""Structured outputs and sampling fields as the proxy maps them, without an upstream: ``response_format``
→ a native grammar field (checked with llguidance, compiled here against the demo tokenizer to show
what it accepts), every OpenAI sampling field → the native ``sampling_params``, log-probabilities →
OpenAI's shape, ``n`` with a session refused, ``on_usage`` and the memory-token estimate."""

from __future__ import annotations

import asyncio
import json

import pytest

from memt_core.client.chat_format import load_chat_format, load_tokenizer
from memt_core.client.native import AsyncNativeClient, generate_body, query_body
from memt_demo import BUNDLED_MODEL
from memt_demo.tool_turns import TOOLS
from memt_core.grammar import GrammarCompiler
from memt_proxy.responses.records import ResponseRecords
from memt_proxy.errors import ProxyError
from memt_proxy.protocol import ChatCompletionRequest, logprobs_content, output_schema
from memt_proxy.request_context import RequestContext
from memt_proxy.responses.plan import ResponseTurn
from memt_proxy.responses.service import ResponsesService
from memt_proxy.responses.protocol import InputItems, ResponseRequest, message_item
from memt_proxy.chat.service import ChatService
from memt_proxy.session.turn import NO_MEMORY, MemoryPlan, Prompt, Turn
from memt_proxy.structured import RawStream
from memt_proxy.session.state import MemoryTokens
from memt_proxy.session.sessions import Sessions, SessionState
from memt_proxy.structured import check_schema, structure

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "degrees": {"type": "integer"}}, "required": ["city", "degrees"], "additionalProperties": False}
TOOLS_OFFERED = [TOOLS["get_weather"], TOOLS["add"]]


@pytest.fixture(scope="module")
def service():
    chat_format, parser = load_chat_format(BUNDLED_MODEL, tokenizer=load_tokenizer(BUNDLED_MODEL))
    return ChatService(Sessions(AsyncNativeClient("http://127.0.0.1:9"), identity=chat_format.identity), chat_format, parser, model_names=["m"])


@pytest.fixture(scope="module")
def compiler(service):
    return GrammarCompiler(service.chat_format.tokenizer)


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})


def accepts(compiler, grammar, text: str) -> bool:
    """Whether the compiled grammar allows ``text``'s tokens (then only the end token), one by one."""
    state = compiler.compile(grammar.field, grammar.source)
    tokenizer = compiler.tokenizer
    for token in tokenizer.encode(text, add_special_tokens=False):
        if not state.allowed(len(tokenizer))[token]:
            return False
        state.advance(token)
    return bool(state.allowed(len(tokenizer))[tokenizer.eos_token_id])


# ---------------------------------------------------------------------- response_format


def test_output_schema_forms():
    assert output_schema(None, "response_format") is None
    assert output_schema({"type": "text"}, "response_format") is None
    assert output_schema({"type": "json_object"}, "response_format") == {"type": "object"}
    assert output_schema({"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER, "strict": True}}, "response_format") == WEATHER
    assert output_schema({"type": "json_schema", "name": "w", "schema": WEATHER}, "text.format", flat=True) == WEATHER
    for bad in ("json", {"type": "xml"}, {"type": "json_schema"}, {"type": "json_schema", "json_schema": {"schema": []}}):
        with pytest.raises(ProxyError) as info:
            output_schema(bad, "response_format")
        assert info.value.status == 400 and info.value.param == "response_format"


def test_responses_text_format_is_read_and_echoed():
    r = ResponseRequest.model_validate({"model": "m", "input": "hi", "text": {"format": {"type": "json_schema", "name": "w", "schema": WEATHER, "strict": True}}})
    assert r.checked() == [] and r.output_schema() == WEATHER and r.text_format["type"] == "json_schema"
    assert ResponseRequest.model_validate({"model": "m", "input": "hi"}).text_format == {"type": "text"}


def test_a_schema_llguidance_cannot_compile_is_a_400_naming_the_field(service):
    with pytest.raises(ProxyError) as info:
        check_schema({"type": "objectx"}, "response_format")
    assert (info.value.status, info.value.param, info.value.code) == (400, "response_format", "invalid_schema")
    with pytest.raises(ProxyError) as info:
        service.plans.sampling(request(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}), [])
    assert info.value.param == "response_format"
    bad_tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}
    with pytest.raises(ProxyError) as info:
        service.plans.sampling(request(tools=[TOOLS["add"], bad_tool], tool_choice="required"), [], [TOOLS["add"], bad_tool])
    assert info.value.param == "tools[1].function.parameters"


def test_response_format_becomes_json_schema_and_turns_thinking_off(service, compiler):
    r = request(response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}}, reasoning_effort="high")
    sampling = service.plans.sampling(r, [])
    assert json.loads(sampling["json_schema"]) == WEATHER
    assert service.plans.options(r)[0] is False  # the grammar starts at the answer: no reasoning block
    grammar = structure(service.chat_format, schema=WEATHER, schema_param="response_format", tools=None, tools_param="tools", forced=False, name=None)
    assert grammar.raw
    assert accepts(compiler, grammar, '{"city":"Paris","degrees":21}')
    assert not accepts(compiler, grammar, '{"city":"Paris"}')  # a required key missing
    assert not accepts(compiler, grammar, '{"city":"Paris","degrees":"21"}')


def test_a_raw_answer_is_returned_as_it_is(service):
    prepared = Prompt([], raw=True)
    text = '{"note":"<tool_call>\\n{\\"name\\": \\"add\\"}"}'
    assert service._message(prepared, text, "stop") == ({"role": "assistant", "content": text}, "stop", text)
    stream = RawStream()
    assert [d.text for d in stream.feed('{"a"')] == ['{"a"'] and stream.feed('{"a"') == []
    assert [d.text for d in stream.finish('{"a":1}')] == [":1}"]


# ---------------------------------------------------------------------- forced tool calls


def test_a_named_call_is_constrained_to_its_parameters(service, compiler):
    grammar = structure(service.chat_format, schema=None, schema_param="response_format", tools=TOOLS_OFFERED, tools_param="tools", forced=True, name="add")
    assert grammar.field == "ebnf" and grammar.source.startswith("%llguidance") and not grammar.raw
    # what follows the forced prefix '<tool_call>\n{"name": "add", "arguments":'
    assert accepts(compiler, grammar, ' {"a": 2, "b": 3.5}}\n</tool_call>')
    assert not accepts(compiler, grammar, ' {"a": 2}}\n</tool_call>')  # b is required
    assert not accepts(compiler, grammar, ' {"city": "Paris"}}\n</tool_call>')  # another tool's arguments
    assert not accepts(compiler, grammar, ' {"a": 2, "b": 3}}')  # the closing markup is part of the call


def test_required_picks_any_tool_each_with_its_own_schema(service, compiler):
    grammar = structure(service.chat_format, schema=None, schema_param="response_format", tools=TOOLS_OFFERED, tools_param="tools", forced=True, name=None)
    # what follows the forced prefix '<tool_call>\n{"name": "'
    assert accepts(compiler, grammar, 'get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    assert accepts(compiler, grammar, 'add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    assert not accepts(compiler, grammar, 'add", "arguments": {"city": "Oslo"}}\n</tool_call>')
    assert not accepts(compiler, grammar, 'multiply", "arguments": {"a": 1, "b": 2}}\n</tool_call>')


def test_response_format_with_tools_allows_the_answer_or_a_call(service, compiler):
    grammar = structure(service.chat_format, schema=WEATHER, schema_param="response_format", tools=TOOLS_OFFERED, tools_param="tools", forced=False, name=None)
    assert not grammar.raw  # a call must be parsed out
    assert accepts(compiler, grammar, '{"city":"Paris","degrees":21}')
    assert accepts(compiler, grammar, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    assert not accepts(compiler, grammar, 'Sure! {"city":"Paris","degrees":21}')


# ---------------------------------------------------------------------- sampling fields


def test_every_sampling_field_reaches_the_native_params(service):
    sampling = service.plans.sampling(request(
        max_tokens=9, temperature=0.5, top_p=0.9, top_k=40, min_p=0.1, presence_penalty=1.5, frequency_penalty=-2,
        repetition_penalty=1.2, min_tokens=3, seed=-1, logit_bias={"12": -100, "7": 5}, logprobs=True, top_logprobs=4, stop=["x", "y"],
    ), [])
    assert sampling == {
        "temperature": 0.5, "max_new_tokens": 9, "top_p": 0.9, "top_k": 40, "min_p": 0.1, "presence_penalty": 1.5,
        "frequency_penalty": -2, "repetition_penalty": 1.2, "min_new_tokens": 3, "seed": (1 << 63) - 1,  # a negative seed maps into the native range
        "logit_bias": {"12": -100.0, "7": 5.0}, "return_logprob": True, "top_logprobs_num": 4, "return_text_in_logprobs": True, "stop": ["x", "y"],
    }
    assert service.plans.sampling(request(min_tokens=50, max_tokens=4), [])["min_new_tokens"] == 4


def test_logprob_fields_go_to_the_native_body_top_level():
    params = {"max_new_tokens": 4, "return_logprob": True, "top_logprobs_num": 2, "return_text_in_logprobs": True}
    for body in (generate_body([1], params, False), query_body("e", "s", "l", [1], params, False, "n")):
        assert body["sampling_params"] == {"max_new_tokens": 4}
        assert (body["return_logprob"], body["top_logprobs_num"], body["return_text_in_logprobs"]) == (True, 2, True)
    assert "return_logprob" not in generate_body([1], {"max_new_tokens": 4}, False)


def test_logit_bias_beyond_the_vocabulary_is_refused(service):
    with pytest.raises(ProxyError) as info:
        service.plans.sampling(request(logit_bias={str(len(service.chat_format.tokenizer)): 1}), [])
    assert info.value.param == "logit_bias" and "vocabulary" in info.value.message


def test_logprobs_in_openai_shape():
    meta = {"output_token_logprobs": [[-0.5, 10, "hé"], [-1.0, 11, " x"]], "output_top_logprobs": [[[-0.5, 10, "hé"], [-2.0, 3, "a"]], [[-1.0, 11, " x"]]]}
    content = logprobs_content(meta)
    assert content[0] == {"token": "hé", "logprob": -0.5, "bytes": list("hé".encode()), "top_logprobs": [
        {"token": "hé", "logprob": -0.5, "bytes": list("hé".encode())}, {"token": "a", "logprob": -2.0, "bytes": [97]},
    ]}
    assert [e["token"] for e in logprobs_content(meta, 1)] == [" x"]  # a stream sends only the new tokens
    assert logprobs_content({"output_token_logprobs": [[-0.1, 5, "z"]]})[0]["top_logprobs"] == []


def test_n_with_a_session_is_refused_before_anything_runs(service):
    with pytest.raises(ProxyError) as info:
        asyncio.run(service.complete(request(n=2), RequestContext("t", "auto", 0, "d"), session="s"))
    assert info.value.status == 400 and info.value.param == "n" and "stateless" in info.value.message


def test_choices_get_their_own_seeds(service):
    prepared = Prompt([], sampling={"seed": (1 << 63) - 1})
    assert service._choice_sampling(prepared, 0)["seed"] == (1 << 63) - 1
    assert service._choice_sampling(prepared, 1)["seed"] == 0
    unseeded = Prompt([], sampling={"temperature": 1.0})
    assert service._choice_sampling(unseeded, 3) == {"temperature": 1.0}


# ---------------------------------------------------------------------- usage


def test_on_usage_is_called_with_the_contracted_fields_and_never_fails_a_request(service):
    fresh = ChatService(service.sessions, service.chat_format, service.parser, model_names=["m"])
    context = RequestContext("t", "auto", 0, "")
    prepared = Turn(Prompt([1] * 7), MemoryPlan("auto", SessionState(native="n"), saved=40), context)  # read a session's memory
    fresh.runner.usage(prepared, 3)  # the default observer: nobody counting
    seen = []
    fresh.runner.on_usage = lambda **fields: seen.append(fields)
    fresh.runner.usage(prepared, 3)
    fresh.runner.usage(Turn(Prompt([1] * 7), NO_MEMORY, context), 2)  # no memory read
    assert seen == [{"prompt_tokens": 7, "completion_tokens": 3, "saved_tokens": 40, "memory": True},
                    {"prompt_tokens": 7, "completion_tokens": 2, "saved_tokens": 0, "memory": False}]
    fresh.runner.on_usage = lambda **fields: 1 / 0
    fresh.runner.usage(prepared, 3)  # logged, not raised


def test_memory_tokens_count_what_this_proxy_wrote():
    tokens, state = MemoryTokens(), SessionState(native="n")
    assert tokens.held(state) == 0  # empty memory
    tokens.wrote(state, 2, 30)
    state.committed = ["a", "b"]  # the commit landed
    assert tokens.held(state) == 30
    tokens.wrote(state, 4, 20)
    assert tokens.held(state) == 0  # that commit has not landed (or failed): not trusted
    state.committed = ["a", "b", "c", "d"]
    assert tokens.held(state) == 50
    assert tokens.held(SessionState(native="adopted", committed=["x"])) == 0  # memory this proxy did not write


def test_responses_plan_and_usage(service):
    """The Responses surface: ``text.format`` becomes the same grammar, and ``on_usage`` hears of a settled response."""
    responses = ResponsesService(service.sessions, service.chat_format, service.parser, ResponseRecords(None), model_names=["m"])
    request = ResponseRequest.model_validate({"model": "m", "input": "hi", "store": False, "reasoning": {"effort": "high"}, "text": {"format": {"type": "json_schema", "name": "w", "schema": WEATHER}}})
    items = InputItems.of(request.input).items
    prompt = responses.plans.plan(request, items, [], [], None)
    assert json.loads(prompt.sampling["json_schema"]) == WEATHER and prompt.raw and prompt.thinking is False
    seen = []
    responses.runner.on_usage = lambda **fields: seen.append(fields)
    plan = ResponseTurn(Turn(prompt, NO_MEMORY, RequestContext("t", "auto", 0, "")), items=items)
    body = asyncio.run(responses._settle(request, plan, None, "resp_1", 0, [message_item('{"city":"Oslo","degrees":3}')], [5, 6, 7], "stop", None))
    assert body["text"] == {"format": request.text["format"]}
    assert seen == [{"prompt_tokens": len(prompt.ids), "completion_tokens": 3, "saved_tokens": 0, "memory": False}]
