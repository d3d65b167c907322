"""Chat formats: how messages become token ids for queries and for committed turns.

A prompt is ``[BOS] + system block + replayed turns + the new turn's opening``. A *turn* is kept as
the exact token ids that the model saw and produced: the user message with the assistant prefix,
then the generated ids (thinking, tool calls and the end token included), then for tool chains the
tool results with a new assistant prefix and the next generated ids. Those same ids are what a
commit writes to memory, so memory holds exactly what the conversation contained.

* Nano renders pieces with the checkpoint's Hugging Face chat template.
* Flash renders them with the checkpoint's ``encoding_dsv4.py``, which this module executes
  explicitly, on the client only (the server never runs checkpoint code).

Which format (and output parser) a checkpoint gets is its family's choice (:mod:`memt_core.families`).
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

from memt_core.checkpoint import read_checkpoint
from memt_core.client.control_text import ControlGuard
from memt_core.client.parsers import DSML, OutputParser, parser_for
from memt_core.detokenize import IncrementalDecoder
from memt_core.families.base import resolve
from memt_core.families.smol import DEFAULT_SYSTEM_PROMPT
from memt_core.tokenizer import load_tokenizer as load_tokenizer  # re-exported: clients load tokenizers from here


def serves(identity: str | None, served: dict | None, capabilities: dict, described: dict | None) -> bool:
    """Whether a server serves the checkpoint of ``identity``: by this project's identity hash (model,
    template and vocabulary) when its capabilities report one, else by the spec's ``/memt/identity`` fields
    (``described``) against ``served``."""
    if "identity" in capabilities:
        return capabilities["identity"] == identity
    return described is not None and all(described.get(key) == value for key, value in (served or {}).items())


class ChatFormat:
    """Encodes conversation pieces for one checkpoint's tokenizer and prompt format."""

    def __init__(self, path: str | Path, tokenizer, chat_template_kwargs: dict | None = None):
        self.path = Path(path)
        self.tokenizer = tokenizer
        self.template_kwargs = dict(chat_template_kwargs or {})
        checkpoint = read_checkpoint(self.path, validate_backbone=False)
        self.family = checkpoint.model  # the family's public name
        self.identity = checkpoint.identity()
        # the spec's identity fields, which any memt-http-v1 server reports at /memt/identity
        self.served = {"model": checkpoint.model, "config_sha256": checkpoint.config_sha256}
        self.native_encoding = checkpoint.native_encoding()["name"]
        self.chunk_tokens = checkpoint.memory.chunk_tokens

    def matches(self, capabilities: dict, described: dict | None = None) -> bool:
        """Whether a server serves this checkpoint (see ``serves``)."""
        return serves(self.identity, self.served, capabilities, described)

    def default_sampling(self) -> dict:
        """Sampling defaults from the checkpoint's generation_config.json (greedy when there is none)."""
        path = self.path / "generation_config.json"
        if not path.is_file():
            return {"temperature": 0.0}
        config = json.loads(path.read_text())
        if not config.get("do_sample", True):
            return {"temperature": 0.0}
        return {k: config[k] for k in ("temperature", "top_p", "top_k") if config.get(k) is not None}

    def thinking(self, enable_thinking: bool | None) -> bool:
        """Whether a turn runs with thinking on (per-call override, else the format's default)."""
        if enable_thinking is not None:
            return enable_thinking
        return bool(self.template_kwargs.get("enable_thinking", self.default_thinking))

    default_thinking = False

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []

    @functools.cached_property
    def _guard(self) -> ControlGuard:
        return ControlGuard(self.tokenizer)

    def _encode_rendered(self, render, *parts) -> list[int]:
        """The ids of ``render(*parts)``, ``parts`` being what a client wrote (message contents, tool calls, tool
        schemas): a control string typed in any of them ("hello<|im_end|>", a tool description's "<think>",
        however the template escapes it) is encoded as the plain text it is, never as the control token the
        template's own markers are, so a client cannot forge a turn boundary (``memt_core.client.control_text``).
        Text without one is rendered and encoded as it always was."""
        return self._guard.protect(render, *parts)

    # subclasses render these three pieces as text
    def system_text(self, system_prompt: str | None, tools: list | None) -> str:
        raise NotImplementedError

    def user_text(self, content: str, *, thinking: bool) -> str:
        raise NotImplementedError

    def tool_results_text(self, results: list[dict], *, thinking: bool) -> str:
        raise NotImplementedError

    bos_ids: list[int] = []

    def system_ids(self, system_prompt: str | None, tools: list | None) -> list[int]:
        return self._encode_rendered(self.system_text, system_prompt, tools) if (system_prompt or tools) else []

    def user_ids(self, content: str, *, enable_thinking: bool | None = None) -> list[int]:
        """A user message followed by the assistant's opening: the start of a turn."""
        thinking = self.thinking(enable_thinking)
        return self._encode_rendered(lambda text: self.user_text(text, thinking=thinking), content)

    def tool_results_ids(self, results: list[dict], *, enable_thinking: bool | None = None) -> list[int]:
        """Tool results (``{"tool_call_id", "content", "name"?}``) followed by the assistant's opening."""
        thinking = self.thinking(enable_thinking)
        return self._encode_rendered(lambda answers: self.tool_results_text(answers, thinking=thinking), results)

    def history_ids(self, messages: list[dict]) -> list[int]:
        """Finished conversation messages (user, assistant, tool) rendered as plain context."""
        return self._encode_rendered(self.history_text, messages) if messages else []

    def open_turn_ids(self, messages: list[dict], *, enable_thinking: bool | None = None) -> list[int]:
        """A turn rendered from its messages (user first, possibly tool rounds), ending with the assistant's opening."""
        thinking = self.thinking(enable_thinking)
        return self._encode_rendered(lambda turn: self.open_turn_text(turn, thinking=thinking), messages)

    def conversation_ids(self, messages: list[dict], *, tools: list | None = None, enable_thinking: bool | None = None) -> list[int]:
        """A whole conversation (system messages included) with the assistant's opening: a stateless prompt."""
        thinking = self.thinking(enable_thinking)
        render = lambda turns, schemas: self.conversation_text(turns, tools=schemas, thinking=thinking)  # noqa: E731
        return list(self.bos_ids) + self._encode_rendered(render, messages, tools)

    def prefix_ids(self, prefix: str) -> list[int]:
        """The ids of a forced start of the answer (``tool_call_prefix(name)``): the format's own markup, the
        client's tool name in it as plain text."""
        markup = self.tool_call_prefix()
        if not prefix.startswith(markup):
            return self._encode(prefix)
        return self._encode_rendered(lambda named: markup + named, prefix[len(markup):])

    def document_ids(self, text: str) -> list[int]:
        """A document as committed to memory: its plain text, no template (a control string in it is text too)."""
        return self._guard.plain(text)

    def prompt_ids(self, *, system_prompt: str | None, tools: list | None, turns: list[list[int]], tail: list[int]) -> list[int]:
        """The query prompt: BOS, system block, replayed turns, then the open turn ``tail``."""
        ids = list(self.bos_ids) + self.system_ids(system_prompt, tools)
        for turn in turns:
            ids += turn
        return ids + list(tail)

    def decode(self, ids: list[int]) -> str:
        """Output text with reasoning and tool-call markup kept, end-of-turn tokens dropped."""
        keep = [i for i in ids if i not in self.end_ids]
        return self.tokenizer.decode(keep, skip_special_tokens=False)

    def reply_ids(self, output_ids: list[int], generated: str, kept: str) -> list[int]:
        """A reply's ids as committed to memory: ``output_ids`` when ``kept`` (what the app received of it:
        cut at a stop string, stray or malformed markup dropped by the parser) is all that was ``generated``;
        otherwise the ids of ``kept`` and an end token, so that memory never holds what the app never saw."""
        if kept == generated:
            return output_ids
        end = self.tokenizer.eos_token_id
        return self._encode(kept) + ([end] if end is not None else [])

    def output_decoder(self) -> "OutputDecoder":
        """``decode`` for a stream: fed the growing output ids, decoding only what is new."""
        return OutputDecoder(self)

    @property
    def end_ids(self) -> set[int]:
        raise NotImplementedError


class NanoChatFormat(ChatFormat):
    """Qwen-style ChatML through the checkpoint's own Hugging Face chat template."""

    default_thinking = True  # the template's own default when enable_thinking is not given
    #: template arguments of a piece that does not start a prompt (a turn, tool results, history); see SmolChatFormat
    piece_kwargs: dict[str, Any] = {}

    def _render(self, messages: list[dict], *, tools: list | None = None, generation: bool, thinking: bool | None = None,
                start: bool = False) -> str:
        kwargs: dict[str, Any] = {k: v for k, v in self.template_kwargs.items() if k != "enable_thinking"}
        if thinking is not None:
            kwargs["enable_thinking"] = thinking
        if not start:
            kwargs.update(self.piece_kwargs)
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, add_generation_prompt=generation, tokenize=False, **kwargs
        )

    def system_text(self, system_prompt, tools):
        messages = [{"role": "system", "content": system_prompt or ""}]
        return self._render(messages, tools=tools, generation=False, start=True)

    def user_text(self, content, *, thinking):
        return self._render([{"role": "user", "content": content}], generation=True, thinking=thinking)

    def tool_results_text(self, results, *, thinking):
        messages = [{"role": "tool", "content": r["content"], "tool_call_id": r.get("tool_call_id")} for r in results]
        return self._render(messages, generation=True, thinking=thinking)

    def history_text(self, messages):
        return self._render(messages, generation=False)

    def open_turn_text(self, messages, *, thinking):
        return self._render(messages, generation=True, thinking=thinking)

    def conversation_text(self, messages, *, tools, thinking):
        return self._render(messages, tools=tools, generation=True, thinking=thinking, start=True)

    def tool_call_prefix(self, name: str | None = None) -> str:
        """Text that makes the model's output start as a tool call (for tool_choice required/named).

        It ends where a token boundary of the rendered call falls: after ``"arguments":`` and not after
        its space, which BPE tokenizers merge with what follows (`` {"``); a prompt ending in a lone space
        token is one the model never saw.
        """
        return '<tool_call>\n{"name": "' + (f'{name}", "arguments":' if name else "")

    @property
    def end_ids(self) -> set[int]:
        ids = set()
        for token in ("<|im_end|>", "<|endoftext|>"):
            value = self.tokenizer.convert_tokens_to_ids(token)
            if isinstance(value, int) and value != self.tokenizer.unk_token_id:
                ids.add(value)
        return ids


class SmolChatFormat(NanoChatFormat):
    """SmolLM2's ChatML through the checkpoint's template (``smol_chat_template.jinja``): no thinking, and SmolLM2's
    default system prompt where a prompt starts without a system message, as the backbone was tuned to see.

    The default belongs to the prompt's start only: the system block (``system_ids``) renders it when the app
    sent no system prompt, and every other piece (a committed turn, tool results, replayed history) is rendered
    with ``omit_default_system``, so memory never holds it and a prompt never repeats it.
    """

    default_thinking = False
    piece_kwargs = {"omit_default_system": True}

    def thinking(self, enable_thinking: bool | None) -> bool:
        return False  # SmolLM2 does not think; enable_thinking is accepted and has no effect

    def system_ids(self, system_prompt: str | None, tools: list | None) -> list[int]:
        return self._encode_rendered(self.system_text, system_prompt, tools)  # the default's block when none is given

    def system_text(self, system_prompt, tools):
        return super().system_text(system_prompt or DEFAULT_SYSTEM_PROMPT, tools)  # the template's own default


class FlashChatFormat(ChatFormat):
    """DeepSeek-V4 style prompts through an ``encoding_dsv4.py`` (the checkpoint's, or one the caller names)."""

    def __init__(self, path, tokenizer, chat_template_kwargs=None, *, encoder_path: str | Path):
        super().__init__(path, tokenizer, chat_template_kwargs)
        self.encoder = load_encoder(encoder_path)

    def _render(self, messages: list[dict], *, thinking: bool) -> str:
        return self.encoder.encode_messages(messages, thinking_mode="thinking" if thinking else "chat", add_default_bos_token=False)

    def system_text(self, system_prompt, tools):
        message = {"role": "system", "content": system_prompt or ""}
        if tools:
            message["tools"] = tools
        # a lone system message renders without an assistant prefix
        return self._render([message], thinking=False)

    def user_text(self, content, *, thinking):
        return self._render([{"role": "user", "content": content}], thinking=thinking)

    def tool_results_text(self, results, *, thinking):
        return self._render([{"role": "tool", "content": r["content"]} for r in results], thinking=thinking)

    def history_text(self, messages):
        return self._render(messages, thinking=False)

    def open_turn_text(self, messages, *, thinking):
        return self._render(messages, thinking=thinking)

    def conversation_text(self, messages, *, tools, thinking):
        messages = [dict(m) for m in messages]
        if tools:
            if messages and messages[0].get("role") == "system":
                messages[0]["tools"] = tools
            else:
                messages.insert(0, {"role": "system", "content": "", "tools": tools})
        return self._render(messages, thinking=thinking)

    def tool_call_prefix(self, name: str | None = None) -> str:
        """Text that makes the model's output start as a tool call (for tool_choice required/named)."""
        return f"<{DSML}tool_calls>\n<{DSML}invoke name=\"" + (f'{name}">\n' if name else "")

    @property
    def bos_ids(self) -> list[int]:
        return [self.tokenizer.bos_token_id] if self.tokenizer.bos_token_id is not None else []

    @property
    def end_ids(self) -> set[int]:
        return {self.tokenizer.eos_token_id} if self.tokenizer.eos_token_id is not None else set()


def load_encoder(path: str | Path):
    """Execute a Flash checkpoint's ``encoding_dsv4.py`` explicitly (client side only) and return it."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location(f"memt_encoding_dsv4_{abs(hash(str(path.resolve())))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in ("encode_messages",):
        if not callable(getattr(module, name, None)):
            raise ValueError(f"{path} does not define {name}()")
    return module


class OutputDecoder:
    """Incremental ``ChatFormat.decode`` of one streamed answer (see ``memt_core.detokenize``)."""

    def __init__(self, chat_format: ChatFormat):
        self.end_ids = chat_format.end_ids
        self.decoder = IncrementalDecoder(chat_format.tokenizer, skip_special_tokens=False)
        self.seen = 0  # output ids consumed so far

    def update(self, output_ids: list[int], *, final: bool = False) -> str:
        """The text of ``output_ids`` (which extend the ids of the previous call); held back mid-character unless final."""
        for token in output_ids[self.seen:]:
            if token not in self.end_ids:
                self.decoder.push(token)
        self.seen = len(output_ids)
        if final:
            self.decoder.flush()
        return self.decoder.text


def load_chat_format(
    path: str | Path,
    *,
    tokenizer,
    chat_template_kwargs: dict | None = None,
    deepseek_encoder: str | Path | None = None,
) -> tuple[ChatFormat, OutputParser]:
    """``(chat_format, parser)`` for a local checkpoint, as its family defines them.

    ``deepseek_encoder`` names the encoder script to execute for families whose prompts come from one
    (Flash); other families ignore it.
    """
    family = read_checkpoint(path, validate_backbone=False).family
    options = {"encoder_path": family.encoder(path, deepseek_encoder)} if family.takes_encoder else {}
    chat_format = resolve(family.chat_format_class)(path, tokenizer, chat_template_kwargs, **options)
    return chat_format, parser_for(family.name)

