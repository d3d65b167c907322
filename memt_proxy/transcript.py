"""Transcript trimming: which of the messages an app resends are already in memory.

OpenAI apps resend the whole conversation each turn. For every session the proxy remembers a content
hash of each message it committed, in order. An incoming transcript is split into

* *instructions*: system/developer messages (sent with every query, never committed);
* *committed*: a leading run of messages whose hashes equal the most recent committed hashes
  (matched by content, never by position alone; an app that dropped old messages still matches);
* *context*: earlier messages that are not in memory (sent as plain text, committed with the turn);
* *turn*: the last user message and any tool rounds after it — what the model answers now.

If earlier messages exist but do not line up with what was committed (an edited or foreign history),
the transcript has *diverged*: ``split_transcript`` refuses it (409 ``transcript_diverged``) rather than
mix that history with memory; the chat surface then forks from a kept state, or starts over, unless the
session asks for the 409 (docs/proxy.md, "Edits, regenerates and retries").
"""

from __future__ import annotations

import hashlib
import json
from json.encoder import encode_basestring as _string  # a JSON string literal, as json.dumps(ensure_ascii=False) writes it
from dataclasses import dataclass, field

from memt_proxy.errors import BadRequest, Conflict
from memt_proxy.protocol import Message, text_of


def as_dict(message: Message) -> dict:
    """A message as the chat formats take it (text content, OpenAI-shaped tool calls)."""
    out: dict = {"role": message.role, "content": text_of(message.content)}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None and message.role == "tool":
        out["name"] = message.name
    return out


def _arguments(text: str) -> object:
    """Tool-call arguments as compared: parsed JSON, or the text itself when it is not JSON, or JSON this proxy
    does not read back (nested past the recursion limit, a number of more digits than Python converts)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError, TypeError):
        return text


def message_hash(message: Message | dict) -> str:
    """SHA-256 of a message's meaning: role, text, tool calls (name + parsed arguments), tool_call_id. A lone
    surrogate (JSON arguments may escape one) is hashed as its code point, never refused here."""
    data = as_dict(message) if isinstance(message, Message) else message
    return hashlib.sha256(_canonical(data).encode("utf-8", "surrogatepass")).hexdigest()


def _canonical(data: dict) -> str:
    """The canonical JSON that ``message_hash`` hashes; a message without tool calls is written directly, the
    same text ``json.dumps(sort_keys=True, ensure_ascii=False)`` writes, at a third of its cost (every
    resent message is hashed each turn)."""
    role, content = data["role"], data.get("content") or ""
    call_id = data.get("tool_call_id") if role == "tool" else None
    if not data.get("tool_calls") and isinstance(role, str) and isinstance(content, str) and isinstance(call_id, (str, type(None))):
        call = "null" if call_id is None else _string(call_id)
        return f'{{"content": {_string(content.strip())}, "role": {_string(role)}, "tool_call_id": {call}, "tool_calls": []}}'
    calls = [[c["function"]["name"], c["function"]["arguments"]] for c in data.get("tool_calls") or []]
    canonical = {"role": role, "content": content.strip(), "tool_calls": [[name, _arguments(text)] for name, text in calls], "tool_call_id": call_id}
    try:
        return json.dumps(canonical, sort_keys=True, ensure_ascii=False)
    except (RecursionError, ValueError):  # parsed arguments too deep to write again: compared as their text
        return json.dumps({**canonical, "tool_calls": calls}, sort_keys=True, ensure_ascii=False)


@dataclass
class Split:
    instructions: str | None
    committed: int  # leading conversation messages already in memory
    context: list[Message]
    turn: list[Message]
    context_hashes: list[str] = field(default_factory=list)  # the context's message hashes, in order


def split_transcript(messages: list[Message], committed: list[str], *, history_known: bool = True, hashes: list[str] | None = None) -> Split:
    """Split a request's messages (see the module docstring); raises ProxyError on bad structure or divergence.
    ``hashes``: the earlier messages' hashes, when the caller computed them already."""
    instructions = "\n\n".join(text_of(m.content) for m in messages if m.role in ("system", "developer")) or None
    conversation = [m for m in messages if m.role not in ("system", "developer")]
    last_user = check_turn(conversation)
    earlier, turn = conversation[:last_user], conversation[last_user:]
    if hashes is None or len(hashes) != len(earlier):
        hashes = [message_hash(m) for m in earlier]
    held = overlap(hashes, committed)
    if earlier and held == 0 and (committed or not history_known):
        raise Conflict(
            "the transcript does not continue this session's memory: its earlier messages differ from what was "
            "committed (edited history, or another conversation on the same session). Reset the session "
            "(POST /v1/memt/sessions/{id}/reset), use a new X-MemT-Session, or send only the new messages.",
            param="messages",
            code="transcript_diverged",
        )
    return Split(instructions=instructions, committed=held, context=earlier[held:], turn=turn, context_hashes=hashes[held:])


def overlap(hashes: list[str], committed: list[str]) -> int:
    """Largest j such that the first j incoming messages equal the last j committed ones. Only the places
    where the first incoming message was committed can start a match, so a resent transcript costs one
    comparison per such place (usually one), not one per possible length."""
    total = len(committed)
    place = max(0, total - len(hashes))  # j is at most len(hashes); the earliest place gives the largest j
    while hashes and place < total:
        try:
            place = committed.index(hashes[0], place)
        except ValueError:
            return 0
        if hashes[: total - place] == committed[place:]:
            return total - place
        place += 1
    return 0


def check_turn(conversation: list[Message]) -> int:
    """Refuse (400) a conversation (system/developer messages left out) that asks the model nothing: no user
    message, the assistant speaking last, a tool round out of order (``check_tool_rounds``). Returns the
    index of the last user message."""
    last_user = max((i for i, m in enumerate(conversation) if m.role == "user"), default=None)
    if last_user is None:
        raise BadRequest("messages must contain a user message", param="messages")
    if conversation[-1].role == "assistant":
        raise BadRequest("the last message must come from the user or a tool", param="messages")
    check_tool_rounds(conversation)
    return last_user


def check_tool_rounds(conversation: list[Message]) -> None:
    """Every assistant tool call must be answered by a tool message before the conversation moves on, and
    every tool message must answer a call of the assistant message its round follows."""
    called: set = set()
    for index, message in enumerate(conversation):
        if message.role == "tool" and message.tool_call_id not in called:
            raise BadRequest(
                f"messages[{index}] is a tool result for tool_call_id {str(message.tool_call_id)[:80]!r}, which no assistant "
                "message before it called", param="messages", code="invalid_tool_result",
            )
        if message.role != "tool":
            called = {c.id for c in message.tool_calls or []} if message.role == "assistant" else set()
    for index, message in enumerate(conversation):
        if message.role != "assistant" or not message.tool_calls:
            continue
        expected = {c.id for c in message.tool_calls}
        answered = set()
        for following in conversation[index + 1:]:
            if following.role != "tool":
                break
            answered.add(following.tool_call_id)
        missing = expected - answered
        if missing:
            raise BadRequest(
                "an assistant message with 'tool_calls' must be followed by tool messages answering each call; "
                f"no result for tool_call_id(s) {sorted(missing)}. A pending tool call cannot be skipped by a new "
                "user message: send the tool results (or drop the tool-call message) first.",
                param="messages",
                code="tool_results_missing",
            )
