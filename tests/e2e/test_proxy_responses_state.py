"""The Responses API's refusals, tenancy and persistence, live.

On the tiny random checkpoint with two API keys (``proxy``): bad input gets OpenAI-shaped 4xx errors
that name the field and say what to send; every response and conversation id is visible to its own
tenant only. On the demo model, a proxy with ``--state-directory`` killed with SIGKILL restarts with
its conversations, chains, stored responses and a turn waiting for function results, all continued
from the right memory; a branch past ``--response-snapshots`` is refused with 409.
"""

from __future__ import annotations

import json
import time

import openai
import pytest
from e2e.proxies import DEMO_MODEL, DEMO_PATH, KEY_A, KEY_B, MODEL, ProxyServer, assert_openai_error, demo_chat_format, proxy_metric

from memt_demo.tool_turns import TOOLS

pytestmark = pytest.mark.timeout(600)

WEATHER = [{"type": "function", **TOOLS["get_weather"]["function"]}]


def post(proxy, body: dict, key: str = KEY_A):
    with proxy.http(key) as http:
        return http.post("/v1/responses", json={"model": MODEL, "max_output_tokens": 4, **body})


@pytest.mark.parametrize(("body", "status", "code", "param", "says"), [
    ({"input": [{"type": "computer_call", "call_id": "c"}]}, 400, "unsupported_item_type", "input[0].type", "function_call_output"),
    ({"input": "hi", "conversation": "conv_x", "previous_response_id": "resp_x"}, 400, "invalid_request", "previous_response_id", "not both"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "unsupported_tool", "tools[0].type", "only function tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, 400, "unsupported_content", "input[0].content[0].type", "input_text"),
    ({"input": "hi", "tools": WEATHER, "tool_choice": {"type": "function", "name": "nope"}}, 400, "invalid_tool_choice", "tool_choice", "one of the request's function tools"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, 400, None, "input[0].call_id", "call_id"),
    ({"input": "hi", "background": True}, 400, "unsupported_parameter", "background", "background"),
    ({"input": "hi", "model": "gpt-4o"}, 404, "model_not_found", "model", MODEL),
    ({"input": "hi", "conversation": "conv_unknown"}, 404, "conversation_not_found", "conversation", "POST /v1/conversations"),
    ({"input": "hi", "previous_response_id": "resp_unknown"}, 400, "previous_response_not_found", "previous_response_id", "not found"),
    ({"input": "hi", "max_output_tokens": 0}, 400, None, "max_output_tokens", "greater than or equal to 1"),
])
def test_bad_input_is_refused_in_openai_shape_saying_what_to_fix(proxy, body, status, code, param, says):
    error = assert_openai_error(post(proxy, body), status, code=code, param=param)
    assert says in error["message"], error


def test_every_id_belongs_to_its_tenant(proxy):
    response = post(proxy, {"input": "hello"})
    assert response.status_code == 200, response.text
    response_id = response.json()["id"]
    with proxy.http(KEY_A) as alpha, proxy.http(KEY_B) as beta:
        conversation = alpha.post("/v1/conversations", json={}).json()["id"]
        assert alpha.get(f"/v1/responses/{response_id}").status_code == 200
        assert_openai_error(beta.get(f"/v1/responses/{response_id}"), 404, code="response_not_found")
        assert_openai_error(beta.get(f"/v1/responses/{response_id}/input_items"), 404, code="response_not_found")
        assert_openai_error(beta.delete(f"/v1/responses/{response_id}"), 404, code="response_not_found")
        assert_openai_error(beta.get(f"/v1/conversations/{conversation}"), 404, code="conversation_not_found")
        assert_openai_error(beta.get(f"/v1/conversations/{conversation}/items"), 404, code="conversation_not_found")
        assert_openai_error(beta.delete(f"/v1/conversations/{conversation}"), 404, code="conversation_not_found")
        assert alpha.get(f"/v1/conversations/{conversation}").status_code == 200  # untouched by beta's attempts
        assert_openai_error(beta.post("/v1/conversations", headers={"Authorization": "Bearer wrong"}, json={}), 401, code="invalid_api_key")
    assert_openai_error(post(proxy, {"input": "hi", "previous_response_id": response_id}, key=KEY_B), 400, code="previous_response_not_found")
    assert_openai_error(post(proxy, {"input": "hi", "conversation": conversation}, key=KEY_B), 404, code="conversation_not_found")


# ---------------------------------------------------------------------- persistence (demo model)


def prompt_tokens(text: str) -> int:
    chat_format = demo_chat_format()
    return len(chat_format.bos_ids + chat_format.system_ids(None, None) + chat_format.open_turn_ids([{"role": "user", "content": text}], enable_thinking=False))


def create(client, **kwargs):
    return client.responses.create(model=DEMO_MODEL, temperature=0.0, max_output_tokens=48, **kwargs)


def written(client, **where) -> None:
    """Return once the turn committed behind the last answer of ``where`` (a conversation or a chain's
    latest response) has landed: a request on the same session waits for it before it is refused."""
    with pytest.raises(openai.BadRequestError):
        create(client, input=[{"role": "assistant", "content": "no user message: refused"}], **where)


@pytest.fixture()
def durable(demo_proxy, tmp_path):
    """A proxy with a state directory on the demo model's upstream; ``durable.restart()`` SIGKILLs and restarts it."""
    args = ["--state-directory", str(tmp_path / "state"), "--lease-ttl", "3", "--response-snapshots", "2"]

    class Durable:
        server = ProxyServer(demo_proxy.upstream, DEMO_PATH, args=args).start()

        def restart(self):
            self.server.process.kill()
            self.server.process.wait(30)
            self.server = ProxyServer(demo_proxy.upstream, DEMO_PATH, args=args).start()

    durable = Durable()
    yield durable
    durable.server.stop()


def test_conversations_chains_and_a_pending_tool_turn_survive_a_sigkill(durable):
    client = durable.server.openai("unused")
    conversation = client.conversations.create()
    create(client, conversation=conversation.id, input="I live in Lisbon.")
    chain = [create(client, input="My name is Tomasz.")]
    for text in ("I live in Lisbon.", "I live in Oslo."):
        chain.append(create(client, input=text, previous_response_id=chain[-1].id))
    tools = client.conversations.create()
    call = create(client, conversation=tools.id, input="What is the weather in Paris?", tools=WEATHER)
    assert call.output[0].type == "function_call"
    written(client, conversation=conversation.id)
    written(client, previous_response_id=chain[-1].id)
    durable.restart()
    client = durable.server.openai("unused")

    recalled = create(client, conversation=conversation.id, input="Where do I live?")
    assert recalled.usage.input_tokens == prompt_tokens("Where do I live?")
    assert "Lisbon" in recalled.output_text, recalled.output_text
    assert [i.type for i in client.conversations.items.list(conversation.id).data] == ["message"] * 4
    assert client.responses.retrieve(chain[1].id).output_text == chain[1].output_text
    branch = create(client, input="Where do I live?", previous_response_id=chain[1].id)
    assert branch.usage.input_tokens == prompt_tokens("Where do I live?") and "Oslo" not in branch.output_text
    latest = create(client, input="Where do I live?", previous_response_id=chain[-1].id)
    assert latest.usage.input_tokens == prompt_tokens("Where do I live?")
    result = json.dumps({"city": "Paris", "temperature": 21, "condition": "sunny"})
    answer = create(client, conversation=tools.id, input=[{"type": "function_call_output", "call_id": call.output[0].call_id, "output": result}], tools=WEATHER)
    assert answer.status == "completed" and answer.output[0].type == "message"


def test_a_branch_past_the_kept_snapshots_is_refused(durable):
    client = durable.server.openai("unused")
    chain = [create(client, input="My name is Tomasz.")]
    for text in ("I live in Lisbon.", "I live in Oslo.", "I have a parrot.", "I like tea."):
        chain.append(create(client, input=text, previous_response_id=chain[-1].id))
    # a response's snapshot is taken before the chain's next write: responses 2-4 have one, and with
    # --response-snapshots 2 responses 3 and 4 keep theirs; 5 is the latest; 1 had no memory yet
    with durable.server.http(None) as http:
        refused = http.post("/v1/responses", json={"model": DEMO_MODEL, "input": "Hi", "previous_response_id": chain[1].id})
    error = assert_openai_error(refused, 409, code="snapshot_expired", param="previous_response_id")
    assert "--response-snapshots" in error["message"]
    assert create(client, input="Where do I live?", previous_response_id=chain[2].id).status == "completed"
    assert create(client, input="Where do I live?", previous_response_id=chain[0].id).status == "completed"


def test_an_identical_retry_is_answered_again_not_committed_twice(proxy):
    """The openai SDK resends a request whose answer it did not get (a timeout, a dropped connection), saying so
    (``x-stainless-retry-count``): in a conversation and in a previous_response_id chain the retry gets the same
    response and its turn is in memory once (issue 38: the version went 1 → 4, the turn three times in the items).
    The same input sent again without that header is a new turn."""
    retry = {"x-stainless-retry-count": "1"}
    with proxy.http(KEY_A) as http:
        conversation = http.post("/v1/conversations", json={}).json()["id"]
        body = {"model": MODEL, "input": "Next.", "conversation": conversation, "max_output_tokens": 4, "temperature": 0}
        first = http.post("/v1/responses", json=body).json()
        assert http.post("/v1/responses", json=body, headers=retry).json() == first

        def messages() -> int:
            items = http.get(f"/v1/conversations/{conversation}/items").json()["data"]
            return [item["type"] for item in items].count("message")

        assert messages() == 2  # the input and the answer, once
        said_again = http.post("/v1/responses", json=body).json()  # no retry: the user said "Next." again
        assert said_again["id"] != first["id"] and messages() == 4

        told = http.post("/v1/responses", json={"model": MODEL, "input": "My name is Ann.", "max_output_tokens": 4}).json()
        chained = {"model": MODEL, "input": "And then?", "previous_response_id": told["id"], "max_output_tokens": 4, "temperature": 0}
        first = http.post("/v1/responses", json=chained).json()
        again = http.post("/v1/responses", json=chained, headers=retry).json()
        assert again == first  # not a branch of its own


def test_memory_off_on_a_chain_is_refused_and_the_chain_goes_on(proxy):
    """A chain keeps no transcript to answer from without memory: ``X-MemT-Memory: off`` on it is a 400 naming the header,
    and its session is let go with the refusal: the chain goes on, and once its last commit lands no session is in use."""
    with proxy.http(KEY_A) as http:
        told = http.post("/v1/responses", json={"model": MODEL, "input": "My name is Ann.", "max_output_tokens": 4}).json()
        first = http.post("/v1/responses", json={"model": MODEL, "input": "Go on.", "previous_response_id": told["id"], "max_output_tokens": 4}).json()
        chained = {"model": MODEL, "input": "And then?", "previous_response_id": first["id"], "max_output_tokens": 4}  # the chain's latest
        refused = http.post("/v1/responses", json=chained, headers={"X-MemT-Memory": "off"}, timeout=60)
        error = assert_openai_error(refused, 400, code="unsupported_parameter", param="X-MemT-Memory")
        assert "keeps no transcript" in error["message"]
        answered = http.post("/v1/responses", json=chained, timeout=60)
        assert answered.status_code == 200 and answered.json()["status"] in ("completed", "incomplete")
    deadline = time.monotonic() + 30  # the commit behind the last answer holds the session until it lands
    while (in_use := proxy_metric(proxy, "memt_proxy_sessions_in_use")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert in_use == 0


def test_a_streamed_retry_gets_the_kept_response_as_a_stream(proxy):
    """A streamed request retried (``x-stainless-retry-count``) after its answer was kept: the same response,
    streamed again (its text, then the end event carrying it), and the turn is in the conversation once."""
    with proxy.http(KEY_A) as http:
        conversation = http.post("/v1/conversations", json={}).json()["id"]
        body = {"model": MODEL, "input": "Stream it.", "conversation": conversation, "max_output_tokens": 6, "temperature": 0, "stream": True}

        def events(headers=None) -> list[dict]:
            with http.stream("POST", "/v1/responses", json=body, headers=headers or {}) as response:
                assert response.status_code == 200
                return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]

        first = events()
        again = events({"x-stainless-retry-count": "1"})
        ends = ("response.completed", "response.incomplete")
        done = [e["response"] for e in first if e["type"] in ends]
        replay = [e["response"] for e in again if e["type"] in ends]
        assert done and replay == done
        text = lambda stream: "".join(e["delta"] for e in stream if e["type"] == "response.output_text.delta")  # noqa: E731
        assert text(again) == text(first) == done[0]["output"][0]["content"][0]["text"]
        assert [e["sequence_number"] for e in again] == list(range(len(again)))
        items = http.get(f"/v1/conversations/{conversation}/items").json()["data"]
        assert [item["type"] for item in items].count("message") == 2  # the input and the answer, once
