"""The bundled demo model end to end: official ``openai`` SDK → proxy → core, and the demo script.

Facts told in turn 1 are recalled in turn 3 while the app resends its whole transcript: the proxy trims
the committed turns, so the model's prompt is exactly that of a fresh one-message request and the
answer can only come from latent memory. After a session reset they are gone. A tool call round trip
gives a parseable ``tool_calls`` entry and a final answer built from the tool's result. Greedy decoding
throughout, so every outcome is deterministic for a given checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from e2e.proxies import DEMO_MODEL, DEMO_PATH, unique
from e2e.servers import REPO_ROOT

from memt_core.demo.episodes import TOOLS

pytestmark = pytest.mark.timeout(600)

PEOPLE = [("Alice", "Lisbon"), ("Omar", "Oslo"), ("Maria", "Tokyo")]


@pytest.fixture(scope="module")
def client(demo_proxy):
    return demo_proxy.openai("unused")


def ask(client, messages, session=None, **kwargs):
    headers = {"X-MemT-Session": session} if session else {}
    return client.chat.completions.create(model=DEMO_MODEL, messages=messages, temperature=0.0, max_tokens=48, extra_headers=headers, **kwargs)


class Conversation:
    """An app that keeps the whole transcript and resends it every turn, as OpenAI apps do."""

    def __init__(self, client, session: str):
        self.client, self.session, self.history = client, session, []

    def say(self, text: str):
        self.history.append({"role": "user", "content": text})
        reply = ask(self.client, self.history, self.session)
        self.history.append({"role": "assistant", "content": reply.choices[0].message.content})
        return reply


@pytest.mark.parametrize(("name", "city"), PEOPLE)
def test_facts_recalled_from_memory_with_the_transcript_trimmed(demo_proxy, client, name, city):
    app = Conversation(client, unique("demo-facts"))
    app.say(f"Hi, my name is {name} and I live in {city}.")
    app.say("How are you?")
    for question, value in (("What is my name?", name), ("Where do I live?", city)):
        reply = app.say(question)
        answer = reply.choices[0].message.content
        assert value in answer, (question, answer)
        # the model saw only the question: the same prompt as a fresh stateless request, which cannot know
        fresh = ask(client, [{"role": "user", "content": question}])
        assert reply.usage.prompt_tokens == fresh.usage.prompt_tokens
        assert value not in fresh.choices[0].message.content
    info = demo_proxy.inspect(app.session, None)
    assert info["committed_messages"] == len(app.history)


def test_reset_forgets(demo_proxy, client):
    name, city = PEOPLE[0]
    app = Conversation(client, unique("demo-reset"))
    app.say(f"Hi, my name is {name} and I live in {city}.")
    assert name in app.say("What is my name?").choices[0].message.content
    with demo_proxy.http(None) as http:
        assert http.post(f"/v1/memt/sessions/{app.session}/reset").status_code == 200
    assert demo_proxy.inspect(app.session, None)["committed_messages"] == 0
    app.history.clear()
    after = app.say("What is my name?").choices[0].message.content
    assert name not in after, after
    assert "don't know" in after  # the trained "unknown" answer, not a wrong name


@pytest.mark.parametrize(("city", "temperature", "condition"), [("Lisbon", 21, "sunny"), ("Paris", 14, "rainy")])
def test_tool_round_trip_answers_from_the_result(client, city, temperature, condition):
    tools = [TOOLS["get_weather"]]
    question = {"role": "user", "content": f"What is the weather in {city}?"}
    first = ask(client, [question], tools=tools)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert arguments == {"city": city}  # right name and arguments in 96% of fresh eval cases (eval.json)
    result = json.dumps({"city": arguments["city"], "temperature": temperature, "condition": condition})
    messages = [question, choice.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": result}]
    final = ask(client, messages, tools=tools).choices[0]
    assert final.finish_reason == "stop" and not final.message.tool_calls
    assert str(temperature) in final.message.content and condition in final.message.content, final.message.content


def test_demo_script_runs():
    """The README's main job (scripts/demo.py, what scripts/demo.sh runs after installing)."""
    done = subprocess.run([sys.executable, "scripts/demo.py", "--model-path", str(DEMO_PATH)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "recalled 3 of 3 facts from memory" in done.stdout, done.stdout
    assert "the name is no longer known" in done.stdout, done.stdout
    assert "calls get_weather" in done.stdout, done.stdout
