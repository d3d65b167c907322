"""The Responses API's streamed output: items built from the parser's deltas, with the events announcing them."""

from __future__ import annotations

from typing import AsyncIterator

from memt_proxy.protocol import logprobs_content
from memt_proxy.responses.protocol import Events, function_call_item, message_item, reasoning_item


class StreamedItems:
    """Output items built from the parser's stream deltas, with the events that announce them.

    Order as in a non-streamed response: reasoning first, then the message, then function calls; a
    response with neither text nor calls still gets an (empty) message item.
    """

    def __init__(self, events: Events, *, one_call: bool, logprobs: bool = False):
        self.events = events
        self.one_call = one_call
        self.logprobs: list[dict] | None = [] if logprobs else None  # every generated token's, when asked for
        self.given = 0  # how many of them text deltas carried
        self.output: list[dict] = []
        self.reasoning: list[str] = []
        self.text: dict | None = None  # the message item being streamed
        self.texts: list[str] = []
        self.calls = 0

    def tokens(self, meta: dict) -> None:
        """Take the log-probabilities of the tokens generated since the last call (when asked for)."""
        if self.logprobs is not None:
            self.logprobs += logprobs_content(meta, len(self.logprobs))

    def feed(self, deltas) -> list[dict]:
        out: list[dict] = []
        for delta in deltas:
            if delta.kind == "reasoning":
                self.reasoning.append(delta.text)
                continue
            out += self._reasoning_done()
            if delta.kind == "content":
                if self.text is None:
                    self.text = message_item("", status="in_progress")
                    self.output.append(self.text)
                    out += self.events.text_opened(len(self.output) - 1, self.text)
                self.texts.append(delta.text)
                fresh = None
                if self.logprobs is not None:  # a delta carries the tokens generated since the previous one
                    fresh, self.given = self.logprobs[self.given:], len(self.logprobs)
                out.append(self.events.text_delta(self.output.index(self.text), self.text["id"], delta.text, fresh))
            elif not (self.one_call and self.calls):
                out += self._text_done()
                self.calls += 1
                item = function_call_item(delta.call.to_openai())
                self.output.append(item)
                out += self.events.call(len(self.output) - 1, item)
        return out

    def close(self) -> list[dict]:
        out = self._reasoning_done()
        if self.text is None and not self.calls:
            self.text = message_item("", status="in_progress")
            self.output.append(self.text)
            out += self.events.text_opened(len(self.output) - 1, self.text)
        return out + self._text_done()

    def _reasoning_done(self) -> list[dict]:
        if not self.reasoning:
            return []
        item = reasoning_item("".join(self.reasoning))
        self.reasoning = []
        self.output.append(item)
        return self.events.item(len(self.output) - 1, item)

    def _text_done(self) -> list[dict]:
        if self.text is None or self.text["status"] != "in_progress":
            return []
        index = self.output.index(self.text)
        # the list itself: tokens generated after the text (a call) still join it, as in a non-streamed response
        done = message_item("".join(self.texts), item_id=self.text["id"], logprobs=self.logprobs)
        self.output[index] = self.text = done
        return self.events.text_closed(index, done)


async def replayed(body: dict) -> AsyncIterator[dict]:
    """A settled response (``body``) as the stream events that announced it: what a client's retry of a streamed
    request gets when its answer is kept (nothing is generated or committed again)."""
    events = Events()
    opening = {**body, "status": "in_progress", "output": [], "usage": None}
    yield events.event("response.created", response=opening)
    yield events.event("response.in_progress", response=opening)
    for index, item in enumerate(body["output"]):
        if item["type"] == "message":
            for event in events.text_opened(index, {**item, "status": "in_progress", "content": []}):
                yield event
            text = "".join(part.get("text", "") for part in item["content"])
            yield events.text_delta(index, item["id"], text)
            for event in events.text_closed(index, item):
                yield event
        else:
            for event in events.call(index, item) if item["type"] == "function_call" else events.item(index, item):
                yield event
    yield events.event("response.completed" if body["status"] == "completed" else "response.incomplete", response=body)
