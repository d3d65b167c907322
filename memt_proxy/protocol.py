"""OpenAI wire shapes for chat completions: requests, responses, stream chunks, errors.

Pydantic models only; ``ChatCompletionRequest.validate_semantics`` refuses fields that would change
the meaning of a request this proxy cannot honour (naming the field), and reports harmless unknown
fields so the caller can log them. ``output_schema`` reads ``response_format`` (the JSON schema the
answer must match, or None); ``logprobs_content`` turns the native server's log-probabilities into
OpenAI's ``logprobs.content`` entries.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict

from memt_proxy.errors import BadRequest


#: Bounds of integer fields: Python integers are unbounded, the engine's are not.
MAX_TOKENS_BOUND = 1 << 31
#: messages (or Responses input items) one request may hold: refused before each is validated and templated, as
#: 90,000 one-character messages cost 4 s and 440 MB before (OpenAI's own limit is 2,048; the size check after
#: validation refuses fewer ones that cannot fit the upstream's prefill, from the template's cost per message)
MAX_MESSAGES = 8192
SEED_BOUND = 1 << 63


#: Numbers and booleans as OpenAI types them: "5" is no integer and "yes" no boolean (an int is a float)
StrictInt = Annotated[int, Strict()]
StrictFloat = Annotated[float, Strict()]
StrictBool = Annotated[bool, Strict()]

class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str = "{}"


class ContentPart(BaseModel):
    """One part of a message's content; only ``text`` parts are served (``validate_semantics`` says so)."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: FunctionSpec


class FunctionName(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str


class NamedToolChoice(BaseModel):
    """``{"type": "function", "function": {"name": ...}}``: the model must call that function."""

    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: FunctionName


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


#: Fields that are accepted but change nothing here (logged when present).
HARMLESS = {"user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier", "verbosity", "web_search_options"}


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    temperature: StrictFloat | None = Field(default=None, ge=0, le=2)
    top_p: StrictFloat | None = Field(default=None, gt=0, le=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1, le=MAX_TOKENS_BOUND)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1, le=MAX_TOKENS_BOUND)
    stop: str | list[str] | None = None
    seed: StrictInt | None = Field(default=None, ge=-SEED_BOUND, lt=SEED_BOUND)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None  # its memt_* keys are per-request controls (``route_inputs.CONTROLS``)
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    n: StrictInt | None = Field(default=None, ge=1, le=128)
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    presence_penalty: StrictFloat | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: StrictFloat | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, Any] | None = None
    # SGLang/vLLM sampling extras, accepted in the body as vLLM does
    top_k: StrictInt | None = Field(default=None, ge=-1, le=MAX_TOKENS_BOUND)
    min_p: StrictFloat | None = Field(default=None, ge=0, le=1)
    repetition_penalty: StrictFloat | None = Field(default=None, gt=0, le=2)
    min_tokens: StrictInt | None = Field(default=None, ge=0, le=MAX_TOKENS_BOUND)
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    prediction: dict[str, Any] | None = None

    def validate_semantics(self) -> list[str]:
        """Refuse what cannot be honoured; return the names of ignored unknown fields."""
        if self.top_logprobs and not self.logprobs:
            raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")
        if self.top_k == 0:
            raise BadRequest("top_k must be -1 (no limit) or a positive integer", param="top_k")
        self.output_schema()  # raises on a malformed response_format
        for key, value in (self.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit() and len(key) <= 18):
                raise BadRequest(f"logit_bias keys must be token ids (as strings), got {key[:40]!r}", param="logit_bias")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
                raise BadRequest(f"logit_bias[{key!r}] must be a number in [-100, 100]", param="logit_bias")
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if not all(stops):
            raise BadRequest("stop strings must be nonempty", param="stop")
        if self.modalities and any(m != "text" for m in self.modalities) or self.audio:
            raise BadRequest("audio output is not supported; text only", param="modalities" if self.modalities else "audio", code="unsupported_parameter")
        if self.functions or self.function_call:
            raise BadRequest("legacy 'functions' are not supported; use 'tools'", param="functions", code="unsupported_parameter")
        if self.prediction:
            raise BadRequest("predicted outputs are not supported", param="prediction", code="unsupported_parameter")
        if self.max_tokens is not None and self.max_completion_tokens is not None and self.max_tokens != self.max_completion_tokens:
            raise BadRequest("max_tokens and max_completion_tokens disagree", param="max_completion_tokens")
        for index, message in enumerate(self.messages):
            if isinstance(message.content, list):
                for number, part in enumerate(message.content):
                    if part.type != "text":
                        raise BadRequest(
                            f"content part type {part.type[:100]!r} is not supported; text only",
                            param=f"messages[{index}].content", code="unsupported_content",
                        )
                    if part.text is None:
                        raise BadRequest("a text content part needs its text", param=f"messages[{index}].content[{number}].text")
        if self.tool_choice not in (None, "auto", "none") and not self.tools:
            raise BadRequest("tool_choice needs tools", param="tool_choice")
        if isinstance(self.tool_choice, NamedToolChoice):
            name = self.tool_choice.function.name
            if name not in {t.function.name for t in self.tools or []}:
                raise BadRequest(f"tool_choice names an unknown function {name!r}", param="tool_choice")
        return sorted(set(self.model_extra or {}) | {n for n in HARMLESS if getattr(self, n, None) is not None})

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def output_schema(self) -> dict | None:
        """The JSON schema ``response_format`` asks the answer to match (``json_object``: any object), or None."""
        return output_schema(self.response_format, "response_format")


def output_schema(format: Any, param: str, *, flat: bool = False) -> dict | None:
    """The schema of an OpenAI response format: ``{"type": "json_schema", "json_schema": {"name", "schema",
    "strict"}}`` (Responses: ``flat``, the schema beside the type), ``{"type": "json_object"}`` → any
    object, ``{"type": "text"}`` or None → None. A malformed format is a 400 naming ``param``."""
    if format is None:
        return None
    if not isinstance(format, dict):
        raise BadRequest(f"{param} must be an object such as {{'type': 'json_schema', ...}}", param=param)
    kind = format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind != "json_schema":
        raise BadRequest(f"{param} type {str(kind)[:40]!r} is not supported; use 'text', 'json_object' or 'json_schema'", param=param, code="unsupported_parameter")
    spec = format if flat else format.get("json_schema")
    if not isinstance(spec, dict):
        raise BadRequest(f"{param}.json_schema must be an object with 'name' and 'schema'", param=param)
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise BadRequest(f"{param} schema must be a JSON schema object", param=param)
    return schema or {"type": "object"}


def logprobs_sampling(top_logprobs: int | None) -> dict:
    """The native sampling fields that return each output token's log-probability (and ``top_logprobs`` alternatives)."""
    return {"return_logprob": True, "top_logprobs_num": top_logprobs or 0, "return_text_in_logprobs": True}


def logprobs_content(meta: dict, start: int = 0) -> list[dict]:
    """OpenAI ``logprobs.content`` entries for the native ``output_token_logprobs`` /
    ``output_top_logprobs`` (``[logprob, token id, text]`` each) from output token ``start`` on."""
    def entry(item: list) -> dict:
        logprob, _, text = item
        text = text or ""
        return {"token": text, "logprob": logprob if logprob is not None else float("-inf"), "bytes": list(text.encode("utf-8"))}

    tokens = meta.get("output_token_logprobs") or []
    tops = meta.get("output_top_logprobs") or []
    out = []
    for index in range(start, len(tokens)):
        item = entry(tokens[index])
        item["top_logprobs"] = [entry(alt) for alt in tops[index]] if index < len(tops) else []
        out.append(item)
    return out


def text_of(content: str | list[ContentPart] | list[dict] | None) -> str:
    """The text of a message's content (a string or text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = [part if isinstance(part, dict) else part.model_dump() for part in content]
    return "".join(part.get("text") or "" for part in parts if part.get("type") == "text")


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def choice(index: int, message: dict, finish_reason: str, logprobs: list[dict] | None = None) -> dict:
    """One ``choices[i]`` of a chat.completion (``logprobs``: the ``content`` entries, when asked for)."""
    return {"index": index, "message": message, "finish_reason": finish_reason, "logprobs": None if logprobs is None else {"content": logprobs, "refusal": None}}


def response_body(*, id: str, model: str, usage: Usage, message: dict | None = None, finish_reason: str = "stop", choices: list[dict] | None = None) -> dict:
    """A chat.completion: one choice (``message``, ``finish_reason``) or the given ``choices``."""
    return {
        "id": id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices if choices is not None else [choice(0, message, finish_reason)],
        "usage": usage.model_dump(),
    }


def chunk_body(
    *, id: str, model: str, created: int, delta: dict | None, finish_reason: str | None = None, usage: Usage | None = None,
    index: int = 0, logprobs: list[dict] | None = None,
) -> dict:
    body: dict[str, Any] = {"id": id, "object": "chat.completion.chunk", "created": created, "model": model}
    lp = None if logprobs is None else {"content": logprobs, "refusal": None}
    body["choices"] = [] if delta is None else [{"index": index, "delta": delta, "finish_reason": finish_reason, "logprobs": lp}]
    if usage is not None:
        body["usage"] = usage.model_dump()
    return body
