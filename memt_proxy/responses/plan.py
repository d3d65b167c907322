"""A Responses request read into a ``Prompt``: the system block (instructions, tools), the context memory lacks, the open
turn (a pending function round continued from the model's exact tokens), the grammar and the sampling params; and
``ResponseTurn``, the session layer's ``Turn`` with what only the Responses surface knows of it."""

from __future__ import annotations

from dataclasses import dataclass

from memt_core.client.chat_format import ChatFormat
from memt_proxy.errors import BadRequest
from memt_proxy.protocol import logprobs_sampling, text_of
from memt_proxy.responses.protocol import ResponseRequest, item_messages
from memt_proxy.responses.records import Thread
from memt_proxy.session.state import PendingTurn
from memt_proxy.session.turn import Prompt, Turn
from memt_proxy.structured import structure
from memt_proxy.prompt import check_prefill, check_text_fits, encode, fit_output, forced_prefix, prompt_ids
from memt_proxy.session.transcript import continued_turn_ids


@dataclass(frozen=True)
class ResponseTurn:
    """A Responses request's turn: the session layer's ``Turn`` and what the surface keeps beside it, built once."""

    turn: Turn
    thread: Thread | None = None  # the thread the response lands in (None: no memory)
    items: list[dict] | None = None  # the request's input items (stored form)
    base_version: int = 0  # the memory version the prompt reads
    as_text: int = 0  # memory off: the leading messages sent as text that the conversation holds already


class ResponsesPlanner:
    """Makes the ``Prompt`` of a Responses request for one chat format and upstream (``sessions``: its limits)."""

    def __init__(self, chat_format: ChatFormat, sessions, *, default_thinking: bool = False):
        self.chat_format = chat_format
        self.sessions = sessions  # memt_proxy.session.sessions.Sessions: max_prefill_tokens, context_length
        self.default_thinking = default_thinking

    def plan(self, request: ResponseRequest, items: list[dict], uncommitted: list[dict], calls: list[str], pending: PendingTurn | None, *,
             held: int = 0, lift: bool = False) -> Prompt:
        """Decide the prompt: the system block, the context memory lacks, and the open turn (``held``: the
        number of leading messages memory holds already, header-less; ``lift``: system/developer items join the
        instructions)."""
        tools = request.chat_tools()
        thinking, raw = self.thinking(request), False
        named = request.tool_choice["name"] if tools and isinstance(request.tool_choice, dict) else None
        prefix = forced_prefix(self.chat_format, tools, required=request.tool_choice == "required", named=named)
        grammar = structure(
            self.chat_format, schema=request.output_schema(), schema_param="text.format", tools=tools, tools_param="tools",
            forced=bool(tools) and (request.tool_choice == "required" or named is not None), name=named,
        )
        if grammar is not None:
            thinking, raw = False, grammar.raw  # the grammar starts at the answer
        echoed = set(calls)  # an app may resend the function calls it answers (the Agents SDK may): already known
        new = item_messages([item for item in items if not (item["type"] == "function_call" and item["call_id"] in echoed)])
        answered = {m["tool_call_id"] for m in new if m["role"] == "tool"}
        if calls and not set(calls) <= answered:
            raise BadRequest(f"the previous response called functions and waits for their results: send a function_call_output item for each of call_id(s) {sorted(set(calls) - answered)} first", param="input", code="tool_results_missing")
        messages, instructions = list(uncommitted) + new, request.instructions
        if lift:  # system/developer items as instructions (a header-less input carries them each time)
            lifted = [text_of(m["content"]) for m in messages if m["role"] in ("system", "developer")]
            instructions = "\n\n".join(text for text in (instructions, *lifted) if text) or None
            messages = [m for m in messages if m["role"] not in ("system", "developer")]
        messages = messages[held:]
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
        if last_user is None:
            raise BadRequest("input must hold a user message (or function_call_output items answering the previous response's function calls)", param="input", code="invalid_input")
        context, turn = messages[:last_user], messages[last_user:]
        check_text_fits(self.chat_format, messages, instructions, self.sessions.upstream.max_prefill_tokens, "input")
        turn_ids = continued_turn_ids(self.chat_format, pending if calls else None, turn)
        if turn_ids is not None:  # function results continue the pending turn from the model's exact tokens
            thinking = pending.thinking and grammar is None
        else:
            turn_ids = self.chat_format.open_turn_ids(turn, enable_thinking=thinking)
        turn_ids = turn_ids + encode(self.chat_format, prefix)
        context_ids = self.chat_format.history_ids(context)
        prompt = prompt_ids(self.chat_format, instructions, tools, context_ids, turn_ids)
        check_prefill(prompt, self.sessions.upstream.max_prefill_tokens, "input")
        sampling = dict(self.chat_format.default_sampling())
        fit_output(sampling, prompt, request.max_output_tokens, self.sessions.upstream.context_length, param="max_output_tokens", prompt_param="input")
        for name in ("temperature", "top_p"):
            if getattr(request, name) is not None:
                sampling[name] = getattr(request, name)
        if grammar is not None:
            sampling[grammar.field] = grammar.source
        if request.logprobs:
            sampling.update(logprobs_sampling(request.top_logprobs))
        return Prompt(prompt, turn_ids, context_ids, context, turn, thinking=thinking, sampling=sampling, prefix=prefix,
                      parallel_tools=request.parallel_tool_calls is not False, raw=raw)

    def thinking(self, request: ResponseRequest) -> bool:
        effort = (request.reasoning or {}).get("effort")
        return self.default_thinking if effort is None else effort not in ("none", "minimal")
