"""Chat completion chunks that need no generation: a kept answer replayed, parser deltas as OpenAI ``delta`` objects."""

from __future__ import annotations

import logging
import time
from typing import AsyncIterator

from memt_proxy.protocol import ChatCompletionRequest, Usage, chunk_body, completion_id, response_body

log = logging.getLogger("memt.proxy")


def replayed(request: ChatCompletionRequest, last: dict) -> dict | AsyncIterator[dict]:
    """The kept answer ``last`` again, for a client's retry of its request (e.g. the openai SDK after the answer was
    lost): nothing is generated or committed again."""
    log.info("a client's retry of an answered request: answered again, not committed twice")
    usage = Usage(**last["usage"])
    if request.stream:
        return replayed_stream(request, last["message"], last["finish"], usage)
    return response_body(id=completion_id(), model=request.model, message=last["message"], finish_reason=last["finish"], usage=usage)


async def replayed_stream(request: ChatCompletionRequest, message: dict, finish: str, usage: Usage) -> AsyncIterator[dict]:
    """A kept answer as chunks: role, reasoning, content, tool calls, finish, usage when asked."""
    cid, created = completion_id(), int(time.time())
    yield chunk_body(id=cid, model=request.model, created=created, delta={"role": "assistant", "content": ""})
    for key in ("reasoning_content", "content"):
        if message.get(key):
            yield chunk_body(id=cid, model=request.model, created=created, delta={key: message[key]})
    for index, call in enumerate(message.get("tool_calls") or []):
        yield chunk_body(id=cid, model=request.model, created=created, delta={"tool_calls": [{"index": index, **call}]})
    yield chunk_body(id=cid, model=request.model, created=created, delta={}, finish_reason=finish)
    if request.stream_options and request.stream_options.include_usage:
        yield chunk_body(id=cid, model=request.model, created=created, delta=None, usage=usage)


def deltas(parsed, parallel_tools: bool):
    """Parser deltas as OpenAI ``delta`` objects (tool calls carry their ``index``)."""
    for delta in parsed:
        if delta.kind == "content":
            yield {"content": delta.text}
        elif delta.kind == "reasoning":
            yield {"reasoning_content": delta.text}
        elif parallel_tools or delta.index == 0:
            yield {"tool_calls": [{"index": delta.index, **delta.call.to_openai()}]}
