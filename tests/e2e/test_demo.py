"""The bundled demo model end to end: official ``openai`` SDK → proxy → core, and the demo script.

Values no training list holds — the issue's "Belkavo", names with held-out letters, real names and
cities of the held-out lists — are told in turn 1 and recalled in turn 3 while the app resends its whole
transcript: the proxy trims the committed turns, so the model's prompt is exactly that of a fresh
one-message request and the answer can only come from latent memory. After a session reset they are
gone. A tool round trip answers from a plain-text tool result ("17 degrees and sunny") as well as from
JSON. Greedy decoding throughout, so every outcome is deterministic for a given checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from e2e.proxies import DEMO_MODEL, DEMO_PATH, unique
from e2e.servers import REPO_ROOT

from memt_demo import pools, values
from memt_demo.tool_turns import TOOLS

pytestmark = pytest.mark.timeout(600)

#: (turn 1, question in turn 3, the value): none of the values is in a training list.
NEVER_SEEN = [
    ("I have a parrot named Belkavo.", "What is my parrot's name?", "Belkavo"),
    ("I have a three-month-old kitten named Jaxomir who loves eating small shrimp.", "What is my kitten's name?", "Jaxomir"),
    ("Hi, my name is Siobhan and I live in Valparaiso.", "What is my name?", "Siobhan"),
    ("Hi, my name is Siobhan and I live in Valparaiso.", "Where do I live?", "Valparaiso"),
]


def test_the_values_are_outside_every_training_list():
    training_words = set(pools.NAMES + pools.CITIES + pools.FOODS + pools.ORG_WORDS + pools.COMMON_WORDS)
    for _, _, value in NEVER_SEEN:
        assert value not in training_words
    assert "Siobhan" in pools.HELDOUT_NAMES and "Valparaiso" in pools.HELDOUT_CITIES
    assert values.HELDOUT_LETTERS & set("jaxomir")  # no training generator draws a j or an x


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


@pytest.mark.parametrize(("statement", "question", "value"), NEVER_SEEN)
def test_a_never_seen_value_is_recalled_in_turn_3_with_the_transcript_trimmed(demo_proxy, client, statement, question, value):
    app = Conversation(client, unique("demo-recall"))
    app.say(statement)
    app.say("How are you?")
    reply = app.say(question)
    answer = reply.choices[0].message.content
    assert value in answer, (question, answer)
    # the model saw only the question: the same prompt as a fresh stateless request, which cannot know
    fresh = ask(client, [{"role": "user", "content": question}])
    assert reply.usage.prompt_tokens == fresh.usage.prompt_tokens
    assert value not in fresh.choices[0].message.content
    assert demo_proxy.inspect(app.session, None)["committed_messages"] == len(app.history)


def test_reset_forgets(demo_proxy, client):
    app = Conversation(client, unique("demo-reset"))
    app.say("Hi, my name is Siobhan and I live in Valparaiso.")
    assert "Siobhan" in app.say("What is my name?").choices[0].message.content
    with demo_proxy.http(None) as http:
        assert http.post(f"/v1/memt/sessions/{app.session}/reset").status_code == 200
    assert demo_proxy.inspect(app.session, None)["committed_messages"] == 0
    app.history.clear()
    after = app.say("What is my name?").choices[0].message.content
    assert "Siobhan" not in after, after
    assert "don't know" in after  # the trained "unknown" answer, not a wrong name


#: Issue 41's case: a pet's never-seen name told in turn 1, eight turns of chatter, then the question.
PETS = list(zip(pools.HELDOUT_NAMES[:10], ("dog", "kitten", "parrot", "rabbit", "hamster") * 2))
MEASURED_AFTER_CHATTER = 8  # of 10 recalled by the bundled model; a broken memory path recalls none


def test_a_pet_name_is_recalled_after_eight_turns_of_chatter(client):
    """Every turn of chatter is answered and committed to memory on top of the fact; the question's prompt
    holds only the question, so the name comes from memory through the whole conversation."""
    missed = []
    for name, animal in PETS:
        app = Conversation(client, unique("demo-long"))
        app.say(f"I have a {animal} named {name}.")
        for number in range(1, 9):
            app.say(f"Tell me something, number {number}.")
        question = f"What is my {animal}'s name?"
        reply = app.say(question)
        assert reply.usage.prompt_tokens == ask(client, [{"role": "user", "content": question}]).usage.prompt_tokens
        answer = reply.choices[0].message.content
        if name not in answer:
            missed.append((name, answer))
    recalled = len(PETS) - len(missed)
    print(f"recalled after 8 turns of chatter: {recalled}/{len(PETS)}; missed {missed}")
    assert recalled >= MEASURED_AFTER_CHATTER - 2, missed


@pytest.mark.parametrize(("city", "result", "expected"), [
    ("Lisbon", json.dumps({"city": "Lisbon", "temperature": 21, "condition": "sunny"}), ("21", "sunny")),
    ("Thessaloniki", "17 degrees and sunny", ("17", "sunny")),
    ("Paris", "rainy, 14 degrees", ("14", "rainy")),
])
def test_tool_round_trip_answers_from_the_result(client, city, result, expected):
    """The call names the city (a held-out one too); the answer uses a JSON or a plain-text result."""
    tools = [TOOLS["get_weather"]]
    question = {"role": "user", "content": f"What is the weather in {city}?"}
    first = ask(client, [question], tools=tools)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": city}
    messages = [question, choice.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": result}]
    final = ask(client, messages, tools=tools).choices[0]
    assert final.finish_reason == "stop" and not final.message.tool_calls
    assert "<tool_call>" not in final.message.content
    assert all(value in final.message.content for value in expected), final.message.content


def test_demo_script_recalls_a_name_the_user_passes():
    """The README's main job (scripts/demo.py, what scripts/demo.sh runs after installing), with --name."""
    done = subprocess.run([sys.executable, "scripts/demo.py", "--model-path", str(DEMO_PATH), "--name", "Quillon"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the name Quillon was recalled from memory" in done.stdout, done.stdout
    assert "the name is no longer known" in done.stdout, done.stdout
    assert "calls get_weather" in done.stdout, done.stdout


def test_the_demo_model_has_one_listed_name_and_answers_to_its_aliases(demo_proxy):
    """/v1/models lists the checkpoint's id alone; its family's name (the CLI's --model) and its directory's are
    accepted too, so 'memt-nano' is no 404 (issue 39); anything else is."""
    client = demo_proxy.openai()
    assert [m.id for m in client.models.list().data] == [DEMO_MODEL]
    for name in ("memt-nano", DEMO_PATH.name):
        reply = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi!"}], max_tokens=4)
        assert reply.choices[0].message.content is not None
    import openai

    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="memt-flash", messages=[{"role": "user", "content": "Hi!"}], max_tokens=4)


#: (what the user says, the value the answer must hold or None): facts, chatter, and questions right after questions
RECALL_CONVERSATION = [
    ("Hi, my name is Siobhan and I live in Valparaiso.", None), ("I have a parrot named Belkavo.", None),
    ("Tell me something, number 1.", None), ("What is my name?", "Siobhan"), ("Where do I live?", "Valparaiso"),
    ("Tell me something, number 2.", None), ("What is my parrot's name?", "Belkavo"), ("What is my name?", "Siobhan"),
    ("Tell me something, number 3.", None), ("Where do I live?", "Valparaiso"), ("What is my parrot's name?", "Belkavo"),
    ("What is my name?", "Siobhan"),
]


def test_a_conversation_without_a_header_recalls_as_well_as_a_named_session(client):
    """Issue 45: the same 12-turn conversation played without any header and with X-MemT-Session: each turn from the
    third on reads only its new message in both (the header-less one from the state its answer forked), and the
    header-less one recalls at least as many of the 7 answers less one. Played header-less first: a named session's
    kept states would otherwise serve the same transcript."""
    recalled, prompts = {}, {}
    for mode in ("no header", "header"):
        app = Conversation(client, unique("demo-recall") if mode == "header" else None)
        replies = [app.say(text) for text, _ in RECALL_CONVERSATION]
        recalled[mode] = sum(value in reply.choices[0].message.content for (_, value), reply in zip(RECALL_CONVERSATION, replies) if value)
        prompts[mode] = [reply.usage.prompt_tokens for reply in replies]
    print(f"recalled of 7: {recalled}; prompt tokens per turn: {prompts}")
    assert prompts["no header"][2:] == prompts["header"][2:], prompts
    assert recalled["no header"] >= recalled["header"] - 1, recalled
