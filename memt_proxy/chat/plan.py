"""A chat completion request read into a ``Prompt``: what the model sees and how it samples.

Thinking on or off, the tools in the template, the forced start of a call (``tool_choice``), the structured-output
grammar, the native sampling params, and the prompt: the whole transcript for a stateless request, or the part
memory lacks (``transcript.split_transcript``) for one on a session or a kept state. Nothing here runs anything.
"""

from __future__ import annotations

from memt_core.client.chat_format import ChatFormat
from memt_proxy.errors import BadRequest
from memt_proxy.protocol import ChatCompletionRequest, NamedToolChoice, logprobs_sampling
from memt_proxy.session.state import SessionState
from memt_proxy.session.turn import Prompt
from memt_proxy.structured import structure
from memt_proxy.session.transcript import as_dict, check_turn, matches, split_transcript
from memt_proxy.prompt import check_prefill, check_text_fits, encode, fit_output, forced_prefix, prompt_ids
from memt_proxy.session.transcript import continued_turn_ids

SEED_MODULUS = 1 << 63  # native seeds are in [0, 2**63); OpenAI's may be negative


class ChatPlanner:
    """Makes the ``Prompt`` of a chat completion request for one chat format and upstream (``sessions``: its limits)."""

    def __init__(self, chat_format: ChatFormat, sessions, *, default_thinking: bool = False):
        self.chat_format = chat_format
        self.sessions = sessions  # memt_proxy.session.sessions.Sessions: max_prefill_tokens, context_length, memory_tokens
        self.default_thinking = default_thinking

    def options(self, request: ChatCompletionRequest) -> tuple[bool, list | None, str, bool]:
        """Thinking, the tools the template shows, the forced start of the answer, parallel tool calls."""
        thinking = self.default_thinking
        if request.reasoning_effort is not None:
            thinking = request.reasoning_effort not in ("none", "minimal")
        if request.chat_template_kwargs and "enable_thinking" in request.chat_template_kwargs:
            thinking = bool(request.chat_template_kwargs["enable_thinking"])
        tools = [t.model_dump(exclude_none=True) for t in request.tools] if request.tools and request.tool_choice != "none" else None
        named = request.tool_choice.function.name if isinstance(request.tool_choice, NamedToolChoice) else None
        prefix = forced_prefix(self.chat_format, tools, required=request.tool_choice == "required", named=named)
        if structured(request, prefix):
            thinking = False  # the grammar (or forced call) starts at the answer
        return thinking, tools, prefix, request.parallel_tool_calls is not False

    def sampling(self, request: ChatCompletionRequest, prompt: list[int], tools: list[dict] | None = None) -> dict:
        """The native sampling params (log-probability fields included; a ``json_schema`` grammar means the answer is
        the JSON itself, see ``memt_proxy.structured``); the output's limit what fits beside ``prompt`` (``fit_output``)."""
        sampling = dict(self.chat_format.default_sampling())
        for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            if getattr(request, name) is not None:
                sampling[name] = getattr(request, name)
        if request.seed is not None:
            sampling["seed"] = request.seed % SEED_MODULUS
        if request.min_tokens:
            sampling["min_new_tokens"] = request.min_tokens
        limit = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
        fit_output(sampling, prompt, request.max_new_tokens, self.sessions.upstream.context_length, param=limit, prompt_param="messages")
        if request.logit_bias:
            vocab = len(self.chat_format.tokenizer)
            for key in request.logit_bias:
                if int(key) >= vocab:
                    raise BadRequest(f"logit_bias key {key[:40]!r} is not a token id of this model (its vocabulary has {vocab})", param="logit_bias")
            sampling["logit_bias"] = {str(int(key)): float(value) for key, value in request.logit_bias.items()}
        if request.logprobs:
            sampling.update(logprobs_sampling(request.top_logprobs))
        stops = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
        if stops:
            sampling["stop"] = stops
        named = request.tool_choice.function.name if isinstance(request.tool_choice, NamedToolChoice) else None
        grammar = structure(
            self.chat_format, schema=request.output_schema(), schema_param="response_format", tools=tools, tools_param="tools",
            forced=bool(tools) and (request.tool_choice == "required" or named is not None), name=named,
        )
        if grammar is not None:
            sampling[grammar.field] = grammar.source
        return sampling

    def stateless(self, request: ChatCompletionRequest) -> Prompt:
        """The whole transcript as the prompt; no memory."""
        thinking, tools, prefix, parallel = self.options(request)
        check_turn([m for m in request.messages if m.role not in ("system", "developer")])  # as with a session
        messages = [as_dict(m) for m in request.messages]
        check_text_fits(self.chat_format, messages, None, self.sessions.upstream.max_prefill_tokens, "messages")
        prompt = self.chat_format.conversation_ids(messages, tools=tools, enable_thinking=thinking) + encode(self.chat_format, prefix)
        check_prefill(prompt, self.sessions.upstream.max_prefill_tokens, "messages")
        sampling = self.sampling(request, prompt, tools)
        return Prompt(prompt, thinking=thinking, sampling=sampling, prefix=prefix, stops=sampling.get("stop", []), parallel_tools=parallel,
                      raw="json_schema" in sampling)

    def opening_ids(self, earlier: list[dict], turn: list[dict], thinking: bool, prefix: str) -> list[int]:
        """A conversation's history and open turn as a session would commit them (its answer's ids follow)."""
        return self.chat_format.history_ids(earlier) + self.chat_format.open_turn_ids(turn, enable_thinking=thinking) + encode(self.chat_format, prefix)

    def on_memory(self, request: ChatCompletionRequest, state: SessionState, hashes: list[str] | None = None) -> Prompt:
        """The part of the transcript memory (``state``) lacks as the prompt; ``hashes``: the earlier messages' hashes
        when the caller has them (a header-less plan). A turn continuing one that waits for tool results continues it
        from the model's exact tokens; any other abandons it."""
        thinking, tools, prefix, parallel = self.options(request)
        split = split_transcript(request.messages, state.committed, history_known=state.history_known, hashes=hashes)
        turn = [as_dict(m) for m in split.turn]
        context = [as_dict(m) for m in split.context]
        check_text_fits(self.chat_format, context + turn, split.instructions, self.sessions.upstream.max_prefill_tokens, "messages")
        turn_ids = continued_turn_ids(self.chat_format, state.pending, turn)
        continues = turn_ids is not None
        if continues:
            thinking = state.pending.thinking and not structured(request, prefix)  # a grammar starts at the answer
        else:
            turn_ids = self.chat_format.open_turn_ids(turn, enable_thinking=thinking)
        context_ids = self.chat_format.history_ids(context)
        forced = encode(self.chat_format, prefix)
        prompt = prompt_ids(self.chat_format, split.instructions, tools, context_ids, turn_ids + forced)
        check_prefill(prompt, self.sessions.upstream.max_prefill_tokens, "messages")
        sampling = self.sampling(request, prompt, tools)
        if not continues:
            # a continued turn stays pending until this request ends it (or calls tools again), so that a retry after
            # a failure, here or in a restarted proxy, continues it too
            self.sessions.writes.set_pending(state, None)
        return Prompt(
            prompt, turn_ids + forced, context_ids, context, turn, split.context_hashes, thinking, sampling, prefix, sampling.get("stop", []),
            parallel, "json_schema" in sampling,
        )


def structured(request: ChatCompletionRequest, prefix: str) -> bool:
    """Whether the answer is constrained from its first token: a JSON response format, or a forced call."""
    return bool(prefix) or request.output_schema() is not None


def regenerates(request: ChatCompletionRequest, state: SessionState) -> bool:
    """Whether a request sending only its turn asks again the one turn memory holds (a regenerate of a first answer):
    then memory starts over from it. With more in memory, the same message is a new turn (an app that sends only
    new messages may well say "Next." twice)."""
    conversation = [m for m in request.messages if m.role not in ("system", "developer")]
    if len(conversation) != 1 or not state.history_known or len(state.committed) != 2:
        return False
    return matches(state.committed[0], conversation[0])  # a record of an older hash scheme included
