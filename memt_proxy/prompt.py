"""What the model reads for one turn, for every surface (Chat Completions, Responses): pure functions over a ``ChatFormat``.

The forced start of a tool call (``tool_choice`` required or named), the prompt (BOS, system block, the context memory
lacks, the open turn, the forced start), the checks that it fits the upstream's prefill and context, and the least a
template costs. No I/O and nothing of the session layer: each surface reads its own request shape into these and keeps
only what is its own; a turn that continues one waiting for tool results is ``session.transcript.continued_turn_ids``.
"""

from __future__ import annotations

from dataclasses import dataclass

from memt_core.client.chat_format import ChatFormat
from memt_core.client.control_text import ControlGuard
from memt_core.sampling_params import DEFAULT_MAX_NEW_TOKENS
from memt_proxy.errors import BadRequest


def encode(chat_format: ChatFormat, text: str) -> list[int]:
    """The ids of a forced start (``forced_prefix``): a tool name in it is plain text, never a control token."""
    return chat_format.prefix_ids(text) if text else []


def forced_prefix(chat_format: ChatFormat, tools: list[dict] | None, *, required: bool, named: str | None) -> str:
    """The start the answer is forced to: a tool call (``tool_choice`` required), or a call of ``named``; else ""."""
    if not tools:
        return ""
    if required:
        return chat_format.tool_call_prefix()
    return chat_format.tool_call_prefix(named) if named is not None else ""


def prompt_ids(chat_format: ChatFormat, instructions: str | None, tools: list[dict] | None, context_ids: list[int], turn_ids: list[int]) -> list[int]:
    """BOS, the system block (instructions and tools), the context memory lacks, the open turn."""
    return list(chat_format.bos_ids) + chat_format.system_ids(instructions, tools) + context_ids + turn_ids


@dataclass(frozen=True)
class TemplateCost:
    """What a chat format's template costs at least, in tokens, whatever the text: the characters of its
    longest vocabulary entry (no token covers more), and per role the control tokens and the characters of
    other template text that one more message of that role adds (measured on empty messages in a run)."""

    longest: int
    controls: dict[str, int]
    chars: dict[str, int]

    def least_tokens(self, messages: list[dict], instructions: str | None) -> int:
        """A lower bound on the tokens of a prompt holding ``messages``: control tokens are counted exactly,
        every other character needs ``1 / longest`` of a token at least."""
        controls = sum(self.controls.get(m.get("role"), 0) for m in messages)
        chars = len(instructions or "") + sum(_characters(m.get("content")) + self.chars.get(m.get("role"), 0) for m in messages)
        return controls + chars // self.longest


_COSTS: dict[int, tuple[ChatFormat, TemplateCost]] = {}  # id(chat_format) → (the format, its cost)
ROLES = ("system", "developer", "user", "assistant", "tool")


def template_cost(chat_format: ChatFormat) -> TemplateCost:
    """The ``TemplateCost`` of ``chat_format`` (measured once per format)."""
    known = _COSTS.get(id(chat_format))
    if known is not None and known[0] is chat_format:
        return known[1]
    guard = ControlGuard(chat_format.tokenizer)
    longest = max(map(len, chat_format.tokenizer.get_vocab()), default=1) or 1
    controls, chars = {}, {}
    for role in ROLES:
        def run(count: int, role=role) -> tuple[int, int]:
            messages = [{"role": "user", "content": ""}] + [{"role": role, "content": "", "tool_call_id": "c"} for _ in range(count)]
            text = chat_format.history_text(messages)
            found = guard.pattern.findall(text) if guard.pattern is not None else []
            return len(found), len(text) - sum(map(len, found))
        (controls_2, chars_2), (controls_3, chars_3) = run(2), run(3)
        controls[role], chars[role] = max(0, controls_3 - controls_2), max(0, chars_3 - chars_2)
    cost = TemplateCost(longest, controls, chars)
    _COSTS[id(chat_format)] = (chat_format, cost)
    return cost


def check_text_fits(chat_format: ChatFormat, messages: list[dict], instructions: str | None, limit: int | None, param: str) -> None:
    """Refuse (400 ``context_length_exceeded``), before templating and tokenizing, messages that cannot fit
    ``limit`` tokens: more messages than ``limit``, or more tokens than ``limit`` at least by ``TemplateCost``
    (the template's control tokens and text per message, and no token covering more characters than the
    longest vocabulary entry). A multi-megabyte message, or 90,000 tiny ones, then costs no templating and
    no tokenization (a 3.9 MB message took 0.8 GB; 90,000 one-character ones 4 s and 440 MB)."""
    if not limit:
        return
    if len(messages) > limit:
        raise BadRequest(
            f"the request has {len(messages)} messages, more than the {limit} tokens the upstream accepts in a prompt",
            param=param, code="context_length_exceeded",
        )
    least = template_cost(chat_format).least_tokens(messages, instructions)
    if least > limit:
        raise BadRequest(
            f"the prompt has at least {least} tokens ({len(messages)} messages and their text); the upstream accepts at most {limit}",
            param=param, code="context_length_exceeded",
        )


def _characters(content) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(part.get("text") or "") for part in content if isinstance(part, dict))
    return 0


def fit_output(sampling: dict, prompt: list[int], requested: int | None, context: int | None, *, param: str, prompt_param: str) -> None:
    """Set ``sampling``'s ``max_new_tokens`` to what fits the upstream's ``context`` length beside ``prompt``: a request
    that sets no limit (``requested`` None) gets ``min(DEFAULT_MAX_NEW_TOKENS, context - prompt)``, as vLLM does, and
    never fails for a limit it did not set; one whose own limit cannot fit, or whose prompt leaves no room, is refused
    (400 ``context_length_exceeded``, naming both counts) before anything runs."""
    wanted = requested or DEFAULT_MAX_NEW_TOKENS
    if context:
        room = context - len(prompt)
        if room < 1 or requested is not None and requested > room:
            asked = f" + {param} {requested}" if requested is not None else ""
            raise BadRequest(
                f"this model's context length is {context} tokens; the request has {len(prompt)} prompt tokens{asked}. "
                f"Send fewer or shorter messages or tools{', or a smaller ' + param if requested is not None else ''}",
                param=prompt_param if requested is None else param, code="context_length_exceeded",
            )
        wanted = min(wanted, room)
    sampling["max_new_tokens"] = wanted
    if "min_new_tokens" in sampling:
        sampling["min_new_tokens"] = min(sampling["min_new_tokens"], wanted)


def check_prefill(prompt: list[int], limit: int | None, param: str) -> None:
    """Refuse (400 ``context_length_exceeded``) a prompt longer than the upstream's ``max_prefill_tokens``."""
    if limit and len(prompt) > limit:
        raise BadRequest(f"the prompt has {len(prompt)} tokens; the upstream accepts at most {limit}", param=param, code="context_length_exceeded")
