"""Structured outputs and sampling parity through the live proxy, on the bundled demo model.

The demo model knows nothing of these schemas, so every valid answer here is the grammar's doing:
``response_format`` json_schema / json_object (openai ``parse``, LangChain ``with_structured_output``,
``responses.parse``), 100 generated schemas all valid, forced tool calls whose arguments match the
tool's schema; and the sampling fields: logprobs (OpenAI shape, streamed too), seed, logit_bias, n.
"""

from __future__ import annotations

import json
import random
from typing import Literal

import jsonschema
import pytest
from e2e.proxies import DEMO_MODEL, assert_openai_error, demo_chat_format, unique
from pydantic import BaseModel, Field

from memt_demo.tool_turns import TOOLS

pytestmark = pytest.mark.timeout(900)

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


class Weather(BaseModel):
    city: str
    temperature: int
    sunny: bool


class Forecast(BaseModel):
    """Nested models ($defs / $ref), an enum, an optional field and a list, as apps' schemas have."""

    days: list[Weather] = Field(max_length=2)
    unit: Literal["C", "F"]
    note: str | None = None


@pytest.fixture(scope="module")
def client(demo_proxy):
    return demo_proxy.openai("unused")


@pytest.fixture(scope="module")
def http(demo_proxy):
    with demo_proxy.http(None, timeout=300) as http:
        yield http


def chat(http, headers=None, **body) -> dict:
    response = http.post("/v1/chat/completions", json={"model": DEMO_MODEL, "messages": QUESTION, "max_tokens": 48, **body}, headers=headers or {})
    assert response.status_code == 200, response.text
    return response.json()


def events(http, **body) -> list[dict]:
    with http.stream("POST", "/v1/chat/completions", json={"model": DEMO_MODEL, "messages": QUESTION, "max_tokens": 24, "stream": True, **body}) as response:
        assert response.status_code == 200, response.read()
        lines = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


# ---------------------------------------------------------------------- structured outputs


def test_openai_parse_returns_the_pydantic_object(client):
    completion = client.chat.completions.parse(model=DEMO_MODEL, messages=QUESTION, response_format=Weather, max_tokens=64)
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Weather), completion.choices[0].message.content
    assert completion.choices[0].finish_reason == "stop"


def test_openai_parse_with_nested_models(client):
    completion = client.chat.completions.parse(model=DEMO_MODEL, messages=QUESTION, response_format=Forecast, max_tokens=128)
    assert isinstance(completion.choices[0].message.parsed, Forecast), completion.choices[0].message.content


@pytest.mark.parametrize("method", [None, "function_calling"])  # None: langchain-openai's default, json_schema
def test_langchain_with_structured_output(demo_proxy, method):
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(model=DEMO_MODEL, base_url=demo_proxy.base_url, api_key="unused", temperature=0, max_tokens=64, max_retries=0)
    structured = model.with_structured_output(Weather, **({"method": method} if method else {}))
    result = structured.invoke("What is the weather in Paris?")
    assert isinstance(result, Weather)


def test_responses_parse(client):
    response = client.responses.parse(model=DEMO_MODEL, input="What is the weather in Paris?", text_format=Weather, max_output_tokens=64, store=False)
    assert isinstance(response.output_parsed, Weather), response.output_text
    assert response.text.format.type == "json_schema"


def test_responses_stream_with_a_schema_and_a_forced_function_call(demo_proxy):
    schema = Weather.model_json_schema()
    body = {"model": DEMO_MODEL, "input": "Weather in Oslo?", "max_output_tokens": 64, "store": False, "stream": True,
            "text": {"format": {"type": "json_schema", "name": "w", "schema": schema, "strict": True}}}
    with demo_proxy.http(None, timeout=300) as http, http.stream("POST", "/v1/responses", json=body) as response:
        assert response.status_code == 200
        done = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")][-1]
    assert done["type"] == "response.completed", done
    jsonschema.validate(json.loads(done["response"]["output"][0]["content"][0]["text"]), schema)
    tool = {"type": "function", "name": "add", "parameters": TOOLS["add"]["function"]["parameters"]}
    with demo_proxy.http(None, timeout=300) as http:
        made = http.post("/v1/responses", json={"model": DEMO_MODEL, "input": "Tell me a story.", "tools": [tool], "tool_choice": "required", "max_output_tokens": 64, "store": False})
    calls = [item for item in made.json()["output"] if item["type"] == "function_call"]
    assert len(calls) == 1 and calls[0]["name"] == "add", made.json()["output"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), tool["parameters"])


def test_json_object_gives_an_object(http):
    body = chat(http, response_format={"type": "json_object"}, max_tokens=32)
    assert isinstance(json.loads(body["choices"][0]["message"]["content"]), dict)


def test_structured_stream_reassembles_to_valid_json(http):
    schema = Weather.model_json_schema()
    chunks = events(http, response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}, max_tokens=64)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    jsonschema.validate(json.loads(text), schema)


def test_structured_answer_on_a_session_is_valid_and_committed(demo_proxy, http):
    session = unique("structured")
    schema = Weather.model_json_schema()
    body = chat(http, headers={"X-MemT-Session": session}, response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}, max_tokens=64)
    answer = body["choices"][0]["message"]["content"]
    jsonschema.validate(json.loads(answer), schema)
    assert demo_proxy.inspect(session, None)["committed_messages"] == 2  # the question and the JSON answer
    follow = QUESTION + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And in Oslo?"}]
    again = chat(http, headers={"X-MemT-Session": session}, messages=follow, response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}, max_tokens=64)
    jsonschema.validate(json.loads(again["choices"][0]["message"]["content"]), schema)
    assert demo_proxy.inspect(session, None)["committed_messages"] == 4  # the transcript lined up with memory


def test_invalid_schema_is_a_400_naming_response_format(http):
    response = http.post("/v1/chat/completions", json={
        "model": DEMO_MODEL, "messages": QUESTION, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}},
    })
    assert_openai_error(response, 400, param="response_format", code="invalid_schema")


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A small JSON schema of the kinds structured outputs use: strict-style objects, bounded numbers,
    string lengths and patterns, enums, arrays with item counts, anyOf."""
    kinds = ["string", "integer", "number", "boolean", "enum", "null"] + (["object", "array", "anyOf"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "string":
        if rng.random() < 0.25:
            return {"type": "string", "pattern": rng.choice(["^[a-z]{2,6}$", "^[A-Z][0-9]{3}$", "^(yes|no)$", "^\\d{4}-\\d{2}-\\d{2}$"])}
        schema: dict = {"type": "string", "maxLength": rng.randint(1, 12)}
        if rng.random() < 0.3:
            schema["minLength"] = rng.randint(0, schema["maxLength"])
        return schema
    if kind == "integer":
        low = rng.randint(-1000, 1000)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 5000)} if rng.random() < 0.5 else {"type": "integer"}
    if kind == "number" and rng.random() < 0.5:
        return {"type": "number", "minimum": -10.5, "maximum": rng.choice([0, 3.25, 1e6])}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 1, 2.5, True, None, "x y"], rng.randint(1, 4))}
    if kind == "object":
        names = rng.sample(["a", "name", "city", "count", "items", "ok", "value", "kind"], rng.randint(1, 4))
        properties = {name: random_schema(rng, depth + 1) for name in names}
        required = [name for name in names if rng.random() < 0.7]
        return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    if kind == "array":
        most = rng.randint(1, 3)
        return {"type": "array", "items": random_schema(rng, depth + 1), "minItems": rng.randint(0, most), "maxItems": most}
    if kind == "anyOf":
        return {"anyOf": [random_schema(rng, depth + 1), random_schema(rng, depth + 1)]}
    return {"type": kind}


def test_one_hundred_random_schemas_all_valid(http):
    rng = random.Random(16)
    failures = []
    for number in range(100):
        schema = random_schema(rng)
        body = chat(http, response_format={"type": "json_schema", "json_schema": {"name": f"s{number}", "schema": schema, "strict": True}}, max_tokens=96)
        text = body["choices"][0]["message"]["content"]
        try:
            jsonschema.validate(json.loads(text), schema)
        except (ValueError, jsonschema.ValidationError) as exc:
            failures.append((schema, text, str(exc)[:200]))
    assert not failures, failures[:3]


# ---------------------------------------------------------------------- forced tool calls


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_forced_tool_call_arguments_match_the_schema(client, tool_choice):
    tools = [TOOLS["get_weather"], TOOLS["add"]]
    message = client.chat.completions.create(
        model=DEMO_MODEL, messages=[{"role": "user", "content": "Tell me a story."}], tools=tools, tool_choice=tool_choice, max_tokens=64,
    ).choices[0].message
    assert message.tool_calls and len(message.tool_calls) == 1, message
    call = message.tool_calls[0].function
    if isinstance(tool_choice, dict):
        assert call.name == "add"
    spec = next(t["function"] for t in tools if t["function"]["name"] == call.name)
    jsonschema.validate(json.loads(call.arguments), spec["parameters"])


def test_forced_tool_call_with_a_strict_schema_streamed(http):
    tool = {"type": "function", "function": {"name": "book", "parameters": {
        "type": "object", "additionalProperties": False, "required": ["seats", "class"],
        "properties": {"seats": {"type": "integer", "minimum": 1, "maximum": 9}, "class": {"enum": ["economy", "business"]}},
    }}}
    chunks = events(http, tools=[tool], tool_choice={"type": "function", "function": {"name": "book"}}, max_tokens=48)
    calls = [call for c in chunks if c["choices"] for call in c["choices"][0]["delta"].get("tool_calls") or []]
    arguments = "".join(call["function"].get("arguments") or "" for call in calls)
    jsonschema.validate(json.loads(arguments), tool["function"]["parameters"])
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]] == ["tool_calls"]


# ---------------------------------------------------------------------- sampling parity


def test_logprobs_in_openai_shape(http):
    body = chat(http, logprobs=True, top_logprobs=3, max_tokens=8)
    choice = body["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == body["usage"]["completion_tokens"] > 0
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["logprob"] <= 0 and entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["logprob"] >= entry["logprob"] - 1e-6  # greedy: the chosen one is the most likely
    assert chat(http, max_tokens=4)["choices"][0]["logprobs"] is None


def test_streamed_logprobs_cover_every_token(http):
    chunks = events(http, logprobs=True, max_tokens=12, stream_options={"include_usage": True})
    entries = [e for c in chunks if c["choices"] and c["choices"][0]["logprobs"] for e in c["choices"][0]["logprobs"]["content"]]
    assert len(entries) == chunks[-1]["usage"]["completion_tokens"]
    assert all(entry["top_logprobs"] == [] for entry in entries)


def test_responses_logprobs_streamed_and_not(client):
    """Responses API: ``include`` message.output_text.logprobs gives every generated token's log-probability
    (with ``top_logprobs`` alternatives) on the output text; streamed, the text deltas carry them all, and
    the completed response equals the non-streamed one; without ``include`` there are none."""
    ask = {"model": DEMO_MODEL, "input": "Hello!", "max_output_tokens": 16, "temperature": 0}
    plain = client.responses.create(**ask, include=["message.output_text.logprobs"], top_logprobs=2)
    part = plain.output[0].content[0]
    assert len(part.logprobs) == plain.usage.output_tokens > 0 and plain.top_logprobs == 2
    for entry in part.logprobs:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-6  # greedy: the chosen token is the most likely
    with client.responses.stream(**ask, include=["message.output_text.logprobs"], top_logprobs=2) as stream:
        deltas = [e for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    carried = [entry.token for delta in deltas for entry in delta.logprobs]
    assert "".join(d.delta for d in deltas) == final.output_text == plain.output_text
    assert carried == [entry.token for entry in final.output[0].content[0].logprobs][: len(carried)] and carried
    assert final.output[0].content[0].logprobs == part.logprobs
    assert client.responses.create(**ask).output[0].content[0].logprobs == []


def test_same_seed_same_output(http):
    def sample(seed: int) -> str:
        return chat(http, temperature=1.0, seed=seed, max_tokens=16)["choices"][0]["message"]["content"]

    assert sample(11) == sample(11)
    assert len({sample(seed) for seed in range(4)}) > 1  # and the seed matters: sampling is random at all


def test_logit_bias_forces_a_token(http):
    token = demo_chat_format().tokenizer.encode(" sunny", add_special_tokens=False)[0]
    body = chat(http, logit_bias={str(token): 100}, max_tokens=4, temperature=0)
    text = demo_chat_format().tokenizer.decode([token] * 4).strip()  # (the answer's leading space is trimmed)
    assert body["choices"][0]["message"]["content"] == text
    assert "sunny" not in chat(http, logit_bias={str(token): -100}, max_tokens=4, temperature=0)["choices"][0]["message"]["content"]


def test_penalties_and_sglang_extras_reach_the_sampler(http):
    body = chat(http, presence_penalty=1.5, frequency_penalty=-0.5, repetition_penalty=1.2, min_p=0.05, top_k=20, temperature=0.8, seed=1, max_tokens=8)
    assert body["choices"][0]["finish_reason"] in ("stop", "length")
    story = [{"role": "user", "content": "Tell me a long story about the weather."}]
    sunny = demo_chat_format().tokenizer.encode(" sunny", add_special_tokens=False)[0]

    def greedy(**fields) -> str:
        # a bias of 20 makes greedy decoding repeat one word whatever the checkpoint: a penalty that grows
        # with the repetitions must then change the answer (a presence penalty of 2 never outweighs the
        # bias, and shares the frequency penalty's path in the sampler)
        body = chat(http, messages=story, temperature=0, max_tokens=32, logit_bias={str(sunny): 20}, **fields)
        return body["choices"][0]["message"]["content"]

    plain = greedy()
    assert plain.split().count("sunny") >= 8, plain
    assert greedy(frequency_penalty=2) != plain
    assert greedy(repetition_penalty=2) != plain


def test_n_choices_stateless(http):
    body = chat(http, n=2, temperature=1.0, seed=5, max_tokens=8)
    assert [c["index"] for c in body["choices"]] == [0, 1]
    chunks = events(http, n=2, max_tokens=4)
    assert {c["choices"][0]["index"] for c in chunks if c["choices"]} == {0, 1}
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]) == 2


def test_n_with_a_session_is_refused(http):
    response = http.post("/v1/chat/completions", json={"model": DEMO_MODEL, "messages": QUESTION, "n": 2}, headers={"X-MemT-Session": unique("n")})
    error = assert_openai_error(response, 400, param="n")
    assert "stateless" in error["message"]
    off = http.post("/v1/chat/completions", json={"model": DEMO_MODEL, "messages": QUESTION, "n": 2, "max_tokens": 4}, headers={"X-MemT-Session": unique("n"), "X-MemT-Memory": "off"})
    assert off.status_code == 200 and len(off.json()["choices"]) == 2


def test_usage_counted_for_every_choice(http):
    """n=2 with seed 3 is the answers of seed 3 and seed 4 (choice i runs with seed + i): its usage is both."""
    one = chat(http, temperature=1.0, seed=3, max_tokens=6)
    other = chat(http, temperature=1.0, seed=4, max_tokens=6)
    two = chat(http, n=2, temperature=1.0, seed=3, max_tokens=6)
    assert two["choices"][0]["message"] == one["choices"][0]["message"]  # choice 0 keeps the request's seed
    assert two["choices"][1]["message"] == other["choices"][0]["message"]
    assert two["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    assert two["usage"]["completion_tokens"] == one["usage"]["completion_tokens"] + other["usage"]["completion_tokens"]
    assert two["usage"]["total_tokens"] == two["usage"]["prompt_tokens"] + two["usage"]["completion_tokens"]
