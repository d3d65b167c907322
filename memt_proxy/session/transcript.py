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

**What a hash keys on.** Two messages hash alike exactly when a chat format is given the same text for them, so a
kept memory state is reused only for the text the model would read: the role, the content as the template gets it
(text parts joined, ``None`` as ""), *verbatim* — no template of this project trims it (the Nano and demo
templates write it as it is, Flash's ``encoding_dsv4.py`` too), so " hi" and "hi" are different messages — and each
tool call's name and arguments string, verbatim: the Nano and demo templates write a string of arguments as it is
(no ``tojson``), so reordered keys, a duplicate key or other spacing are other text the model reads. What no format
renders is not hashed: call ids, a tool result's ``tool_call_id`` and ``name`` (its content is what the model
reads), a user's ``name``, reasoning (never given back to the template). Flash's encoder parses the arguments and
writes them again (spacing and a duplicate key then vanish from its text): there two messages the model reads alike
may hash apart, which only lengthens a prompt; never the other way round. A format that rendered one of the fields
left out would need it here.

**Hash schemes on disk.** The hashes are kept in session records (``memt_proxy.session.store``) and name kept states
(``memt_proxy.session.prefix_index`` chains). ``message_hash`` is scheme ``HASH_SCHEME`` (2); records carry the scheme they
were written under. Scheme 1, records without one (proxies before this rule), hashed content stripped and
arguments parsed as JSON: ``legacy_message_hash``, kept for them. Its canonical text is a JSON object, scheme 2's a
JSON array, so no hash of one scheme equals one of the other. A scheme-1 record is read back with each hash
tagged ``LEGACY`` + hash; a tagged entry matches a message whose ``legacy_message_hash`` it is (``matches``), and
``split_transcript`` rewrites the entries a request matched as the request's own scheme-2 hashes, in the
session's list, which the session's next record write keeps (a lazy migration: a session's memory is kept across
the upgrade, and from its first continued turn on it is matched exactly). A state named by a scheme-1 chain is not
found by scheme-2 chains: that conversation's next prompt is longer once, and the state is bounded and closed as
any other.
"""

from __future__ import annotations

import hashlib
import json
from json.encoder import encode_basestring as _string  # a JSON string literal, as json.dumps(ensure_ascii=False) writes it
from dataclasses import dataclass, field

from memt_core.client.chat_format import ChatFormat
from memt_proxy.errors import BadRequest, Conflict
from memt_proxy.protocol import Message, text_of
from memt_proxy.session.state import PendingTurn


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


HASH_SCHEME = 2  # the scheme of ``message_hash``; records carry it (``memt_proxy.session.store``), 1 when they do not
LEGACY = "legacy:"  # a scheme-1 hash as read from a record: matched with ``legacy_message_hash``


def message_hash(message: Message | dict) -> str:
    """SHA-256 of what a chat format renders of a message (see the module docstring): role, text, each tool call's
    name and arguments string, all verbatim. A lone surrogate (JSON arguments may escape one) is hashed as its code
    point, never refused here."""
    data = as_dict(message) if isinstance(message, Message) else message
    return hashlib.sha256(_rendered(data).encode("utf-8", "surrogatepass")).hexdigest()


def _rendered(data: dict) -> str:
    """The text ``message_hash`` hashes: ``json.dumps([role, content, [[name, arguments], …]], ensure_ascii=False)``
    (a JSON array: scheme 1 hashed an object). A message without tool calls, most of a transcript, is written
    directly, the same text at a fraction of the cost (every resent message is hashed each turn)."""
    role, content = data["role"], data.get("content")
    if not isinstance(content, str):
        content = text_of(content)
    calls = data.get("tool_calls")
    if not calls and isinstance(role, str):
        return f'[{_string(role)}, {_string(content)}, []]'
    written = [[c["function"]["name"], c["function"]["arguments"]] for c in calls or []]
    return json.dumps([role, content, written], ensure_ascii=False)


def matches(key: str, message: Message | dict, hashed: str | None = None) -> bool:
    """Whether a recorded hash ``key`` is ``message``'s: its ``message_hash`` (``hashed``, when the caller has it), or
    for a ``LEGACY`` key, of a scheme-1 record, its ``legacy_message_hash``."""
    if key.startswith(LEGACY):
        return key == LEGACY + legacy_message_hash(message)
    return key == (hashed if hashed is not None else message_hash(message))


# ---------------------------------------------------------------------- scheme 1 (records written before scheme 2)


def _arguments(text: str) -> object:
    """Tool-call arguments as scheme 1 compared them: parsed JSON, or the text itself when it is not JSON, or JSON
    this proxy does not read back (nested past the recursion limit, a number of more digits than Python converts)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError, TypeError):
        return text


def legacy_message_hash(message: Message | dict) -> str:
    """Scheme 1's hash, kept to match records written under it: role, stripped text, tool calls (name + parsed
    arguments), tool_call_id. Looser than what the model reads (see the module docstring)."""
    data = as_dict(message) if isinstance(message, Message) else message
    return hashlib.sha256(_legacy_canonical(data).encode("utf-8", "surrogatepass")).hexdigest()


def _legacy_canonical(data: dict) -> str:
    """The canonical JSON that ``legacy_message_hash`` hashes; a message without tool calls is written directly, the
    same text ``json.dumps(sort_keys=True, ensure_ascii=False)`` writes."""
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
    ``hashes``: the earlier messages' hashes, when the caller computed them already.

    ``committed`` is the session's own list: ``LEGACY`` entries (a scheme-1 record's) that the request's messages
    match are rewritten in it, in place, as those messages' hashes (the lazy migration of the module docstring)."""
    instructions = "\n\n".join(text_of(m.content) for m in messages if m.role in ("system", "developer")) or None
    conversation = [m for m in messages if m.role not in ("system", "developer")]
    last_user = check_turn(conversation)
    earlier, turn = conversation[:last_user], conversation[last_user:]
    if hashes is None or len(hashes) != len(earlier):
        hashes = [message_hash(m) for m in earlier]
    if any(key.startswith(LEGACY) for key in committed):
        held = overlap(hashes, committed, legacy=[LEGACY + legacy_message_hash(m) for m in earlier])
        committed[len(committed) - held:] = hashes[:held]
    else:
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


def overlap(hashes: list[str], committed: list[str], *, legacy: list[str] | None = None) -> int:
    """Largest j such that the first j incoming messages equal the last j committed ones. Only the places
    where the first incoming message was committed can start a match, so a resent transcript costs one
    comparison per such place (usually one), not one per possible length. ``legacy``: the incoming messages'
    ``LEGACY`` keys, when ``committed`` holds some (a scheme-1 record's): an entry matches either key."""
    total = len(committed)
    place = max(0, total - len(hashes))  # j is at most len(hashes); the earliest place gives the largest j
    if legacy is not None:
        for place in range(place, total):
            if all(key == new or key == old for key, new, old in zip(committed[place:], hashes, legacy)):
                return total - place
        return 0
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


def continued_turn_ids(chat_format: ChatFormat, pending: PendingTurn | None, turn: list[dict]) -> list[int] | None:
    """The ids of ``turn`` when it continues ``pending`` (its messages so far, then the tool results answering
    it): the model's exact tokens and the results after them; None when it does not continue it."""
    if pending is None:
        return None
    last = max((i for i, m in enumerate(turn) if m["role"] == "assistant"), default=None)
    if last is None or len(pending.hashes) != last + 1 or not all(map(matches, pending.hashes, turn[: last + 1])):
        return None  # (a pending turn of a scheme-1 record is matched by its scheme: ``transcript.matches``)
    results = turn[last + 1:]
    if not results or any(m["role"] != "tool" for m in results):
        return None
    answers = [{"tool_call_id": m.get("tool_call_id"), "content": m["content"]} for m in results]
    return pending.ids + chat_format.tool_results_ids(answers, enable_thinking=pending.thinking)
