"""OpenAI wire shapes for the Responses and Conversations APIs: requests, items, response objects, events.

Pydantic models and pure builders only (no sessions, no I/O). ``ResponseRequest.checked`` refuses what
this proxy cannot honour (built-in tools, unknown item types, both ``conversation`` and
``previous_response_id``, …) with a ``ProxyError`` that names the field and says what to send instead.
Input items become chat messages (``InputItems.messages``) in the shape the chat formats take, so the
serving layer reuses the model's chat template; output items are built here from parsed model output.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from memt_proxy.errors import BadRequest
from memt_proxy.protocol import MAX_MESSAGES, StrictBool, StrictFloat, StrictInt, output_schema

ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
#: Accepted request fields that change nothing here (logged when present).
IGNORED = ("include", "truncation", "user", "safety_identifier", "prompt_cache_key", "service_tier", "stream_options", "max_tool_calls")
#: The ``include`` value that asks for the answer's log-probabilities (the others are accepted and change nothing).
LOGPROBS = "message.output_text.logprobs"


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}{uuid.uuid4().hex[:16]}"


class FunctionTool(BaseModel):
    """A function tool as the Responses API declares it (flat: no nested ``function`` object)."""

    model_config = ConfigDict(extra="allow")
    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def for_chat(self) -> dict:
        """The tool as the chat formats take it (Chat Completions shape)."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


class ConversationRef(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str


class ResponseRequest(BaseModel):
    """``POST /v1/responses``."""

    model_config = ConfigDict(extra="allow")
    model: str
    input: Annotated[list[dict[str, Any]], Field(max_length=MAX_MESSAGES)] | str = Field(default_factory=list)
    instructions: str | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: StrictFloat | None = Field(default=None, ge=0, le=2)
    top_p: StrictFloat | None = Field(default=None, gt=0, le=1)
    tools: list[FunctionTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool | None = None
    store: StrictBool | None = None
    metadata: dict[str, str] | None = None
    stream: StrictBool = False
    previous_response_id: str | None = None
    conversation: str | ConversationRef | None = None
    reasoning: dict[str, Any] | None = None
    background: StrictBool | None = None
    text: dict[str, Any] | None = None
    include: list[str] | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)

    @property
    def logprobs(self) -> bool:
        """Whether the answer's tokens come with their log-probabilities (``include``)."""
        return LOGPROBS in (self.include or [])

    @property
    def conversation_id(self) -> str | None:
        return self.conversation.id if isinstance(self.conversation, ConversationRef) else self.conversation

    @property
    def stored(self) -> bool:
        return self.store is not False

    def checked(self) -> list[str]:
        """Refuse what cannot be honoured; returns the names of ignored fields (for the log)."""
        if self.conversation is not None and self.previous_response_id is not None:
            raise BadRequest("send either 'conversation' or 'previous_response_id', not both: a conversation already continues its latest response", param="previous_response_id", code="invalid_request")
        if self.background:
            raise BadRequest("background responses are not supported by this proxy; send 'background': false or leave it out", param="background", code="unsupported_parameter")
        self.output_schema()  # raises on a malformed text.format
        for index, tool in enumerate(self.tools or []):
            if tool.type != "function":
                raise BadRequest(f"tools[{index}]: built-in tool type {tool.type!r} is not supported by this proxy; only function tools ({{'type': 'function', 'name': …, 'parameters': …}})", param=f"tools[{index}].type", code="unsupported_tool")
            if not tool.name:
                raise BadRequest(f"tools[{index}]: a function tool needs a 'name'", param=f"tools[{index}].name")
        self._check_tool_choice()
        InputItems.of(self.input)  # raises on unknown item types or bad content
        extra = set(self.model_extra or {})
        if set(self.include or []) - {LOGPROBS}:  # e.g. reasoning.encrypted_content: nothing to add here
            extra.add("include")
        unknown = sorted(extra - set(IGNORED))
        return sorted(extra & set(IGNORED)) + unknown

    def _check_tool_choice(self) -> None:
        choice = self.tool_choice
        if choice is None or choice in ("none", "auto", "required"):
            return
        names = {t.name for t in self.tools or []}
        if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str) and choice["name"] in names:
            return
        raise BadRequest(f"tool_choice must be 'none', 'auto', 'required' or {{'type': 'function', 'name': <one of the request's function tools>}}; got {choice!r}", param="tool_choice", code="invalid_tool_choice")

    def output_schema(self) -> dict | None:
        """The JSON schema ``text.format`` asks the answer to match (``json_object``: any object), or None."""
        return output_schema((self.text or {}).get("format"), "text.format", flat=True)

    @property
    def text_format(self) -> dict:
        """``text.format`` as the response echoes it."""
        format = (self.text or {}).get("format")
        return format if isinstance(format, dict) and format.get("type") in ("json_schema", "json_object") else {"type": "text"}

    def chat_tools(self) -> list[dict] | None:
        """The function tools for the chat template, or None (no tools, or tool_choice 'none')."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [tool.for_chat() for tool in self.tools]


def _text(content: Any, where: str) -> str:
    """A message's content (a string or text parts) as plain text; other parts are refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content must be a string or a list of input_text parts", param=f"{where}.content")
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise BadRequest(f"{where}.content[{index}]: content part type {kind!r} is not supported; send text parts ({{'type': 'input_text', 'text': …}})", param=f"{where}.content[{index}].type", code="unsupported_content")
        texts.append(part["text"])
    return "".join(texts)


class InputItems:
    """A request's ``input`` as stored items (each with an id) and as chat messages for the template."""

    def __init__(self, items: list[dict]):
        self.items = items

    @classmethod
    def of(cls, value: str | list[dict]) -> "InputItems":
        if isinstance(value, str):
            value = [{"type": "message", "role": "user", "content": value}]
        items = []
        for index, raw in enumerate(value):
            where = f"input[{index}]"
            kind = raw.get("type", "message" if "role" in raw else None)
            if kind not in ITEM_TYPES:
                raise BadRequest(f"{where}: item type {kind!r} is not supported; this proxy accepts {', '.join(ITEM_TYPES)}", param=f"{where}.type", code="unsupported_item_type")
            items.append(_stored_item(kind, raw, where))
        return cls(items)

    def messages(self) -> list[dict]:
        return item_messages(self.items)


def _stored_item(kind: str, raw: dict, where: str) -> dict:
    """One input item normalised as the API lists it back (``input_items``, conversation items)."""
    def need(field: str) -> Any:
        if not isinstance(raw.get(field), str):
            raise BadRequest(f"{where}: a {kind} item needs a string {field!r}", param=f"{where}.{field}")
        return raw[field]

    if kind == "message":
        role = raw.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise BadRequest(f"{where}: message role must be user, assistant, system or developer; got {role!r}", param=f"{where}.role")
        part = "output_text" if role == "assistant" else "input_text"
        text = _text(raw.get("content"), where)
        content = {"type": part, "text": text, **({"annotations": []} if part == "output_text" else {})}
        return {"id": _id(raw, "msg"), "type": "message", "role": role, "status": "completed", "content": [content]}
    if kind == "function_call":
        return {"id": _id(raw, "fc"), "type": "function_call", "call_id": need("call_id"), "name": need("name"), "arguments": need("arguments"), "status": "completed"}
    if kind == "function_call_output":
        output = raw.get("output")
        text = output if isinstance(output, str) else _text(output, where)
        return {"id": _id(raw, "fco"), "type": "function_call_output", "call_id": need("call_id"), "output": text, "status": "completed"}
    return {"id": _id(raw, "rs"), "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": _text(raw.get("content") or [], where)}]}


def _id(raw: dict, prefix: str) -> str:
    """The item's own id if it has one (a string), else a new one."""
    return raw["id"] if isinstance(raw.get("id"), str) and raw["id"] else new_id(prefix)


def item_messages(items: list[dict]) -> list[dict]:
    """Stored items (input or output) as chat messages: consecutive function calls join one assistant
    message (with the assistant text before them); reasoning items are not sent back to the model."""
    messages: list[dict] = []
    for item in items:
        kind = item["type"]
        if kind == "message":
            messages.append({"role": item["role"], "content": "".join(p.get("text", "") for p in item["content"])})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return messages


# ---------------------------------------------------------------------- output


def message_item(text: str, *, status: str = "completed", item_id: str | None = None, logprobs: list[dict] | None = None) -> dict:
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs if logprobs is not None else []}] if status != "in_progress" else []
    return {"id": item_id or new_id("msg"), "type": "message", "role": "assistant", "status": status, "content": content}


def function_call_item(call: dict, *, status: str = "completed", item_id: str | None = None) -> dict:
    """A parsed tool call (Chat Completions shape) as a ``function_call`` output item."""
    arguments = call["function"]["arguments"] if status != "in_progress" else ""
    return {"id": item_id or new_id("fc"), "type": "function_call", "call_id": call["id"], "name": call["function"]["name"], "arguments": arguments, "status": status}


def reasoning_item(text: str) -> dict:
    return {"id": new_id("rs"), "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": text}]}


def usage(input_tokens: int, output_tokens: int) -> dict:
    """``input_tokens`` is what the model read this time: with memory, only what memory did not hold."""
    return {
        "input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def response_object(request: ResponseRequest, *, response_id: str, created_at: int, status: str, output: list[dict], usage: dict | None, incomplete: str | None = None) -> dict:
    """The ``response`` object, echoing the request's settings as OpenAI does."""
    conversation = request.conversation_id
    return {
        "id": response_id, "object": "response", "created_at": created_at, "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": None, "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": request.instructions, "max_output_tokens": request.max_output_tokens,
        "model": request.model, "output": output, "parallel_tool_calls": request.parallel_tool_calls is not False,
        "previous_response_id": request.previous_response_id, "conversation": {"id": conversation} if conversation else None,
        "reasoning": {"effort": None, "summary": None}, "store": request.stored,
        "temperature": request.temperature if request.temperature is not None else 1.0,
        "top_p": request.top_p if request.top_p is not None else 1.0, "top_logprobs": request.top_logprobs or 0,
        "text": {"format": request.text_format}, "tool_choice": request.tool_choice or "auto",
        "tools": [tool.model_dump(exclude_none=True) for tool in request.tools or []],
        "truncation": "disabled", "usage": usage, "metadata": request.metadata or {}, "user": None,
    }


def output_text(output: list[dict]) -> str:
    return "".join(p["text"] for item in output if item["type"] == "message" for p in item["content"] if p["type"] == "output_text")


def item_list(items: list[dict], *, after: str | None, limit: int, order: str) -> dict:
    """A cursor page of items (``input_items``, conversation items)."""
    ordered = list(items) if order == "asc" else list(reversed(items))
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise BadRequest(f"'after' must be the id of an item in this list; {after!r} is not", param="after")
        ordered = ordered[ids.index(after) + 1:]
    page = ordered[:limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None, "last_id": page[-1]["id"] if page else None, "has_more": len(ordered) > limit}


# ---------------------------------------------------------------------- conversations


class ConversationRequest(BaseModel):
    """``POST /v1/conversations``: initial items are kept and sent with the first response (then committed)."""

    model_config = ConfigDict(extra="forbid")
    metadata: dict[str, str] | None = None
    items: list[dict[str, Any]] | None = None


class ItemsRequest(BaseModel):
    """``POST /v1/conversations/{id}/items``."""

    model_config = ConfigDict(extra="forbid")
    items: list[dict[str, Any]]


def conversation_object(conversation_id: str, created_at: int, metadata: dict | None) -> dict:
    return {"id": conversation_id, "object": "conversation", "created_at": created_at, "metadata": metadata or {}}


# ---------------------------------------------------------------------- streaming events


class Events:
    """Builds one response's SSE events in order, numbering them (``sequence_number``) as OpenAI does."""

    def __init__(self):
        self.sequence = 0

    def event(self, kind: str, **fields: Any) -> dict:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return body

    def text_opened(self, index: int, item: dict) -> list[dict]:
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self.event("response.output_item.added", output_index=index, item=item),
            self.event("response.content_part.added", item_id=item["id"], output_index=index, content_index=0, part=part),
        ]

    def text_delta(self, index: int, item_id: str, delta: str, logprobs: list[dict] | None = None) -> dict:
        return self.event("response.output_text.delta", item_id=item_id, output_index=index, content_index=0, delta=delta, logprobs=logprobs or [])

    def text_closed(self, index: int, item: dict) -> list[dict]:
        part = item["content"][0]
        return [
            self.event("response.output_text.done", item_id=item["id"], output_index=index, content_index=0, text=part["text"], logprobs=part["logprobs"]),
            self.event("response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def call(self, index: int, item: dict) -> list[dict]:
        """A whole function call: added, its arguments (one delta), done."""
        opened = {**item, "arguments": "", "status": "in_progress"}
        return [
            self.event("response.output_item.added", output_index=index, item=opened),
            self.event("response.function_call_arguments.delta", item_id=item["id"], output_index=index, delta=item["arguments"]),
            self.event("response.function_call_arguments.done", item_id=item["id"], output_index=index, name=item["name"], arguments=item["arguments"]),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def item(self, index: int, item: dict) -> list[dict]:
        """An item sent whole (reasoning)."""
        return [self.event("response.output_item.added", output_index=index, item=item), self.event("response.output_item.done", output_index=index, item=item)]
