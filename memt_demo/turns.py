"""What an episode is made of: conversation turns, tool-calling turns, documents, and the question after them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union


@dataclass(frozen=True)
class EpisodeToolCall:
    name: str
    arguments: dict


@dataclass
class EpisodeTurn:
    """A conversation turn: the user's message and the assistant's reply (``values``: words to stress)."""

    user: str
    reply: str
    values: tuple[str, ...] = ()


@dataclass
class ToolTurn:
    """A turn that calls a tool: user message, the call, the tool's result (JSON or plain text), the final reply."""

    user: str
    tools: list[dict]
    call: EpisodeToolCall
    result: str
    reply: str
    values: tuple[str, ...] = ()


@dataclass
class Document:
    """Raw text ingested through memory, split into ``chunk_tokens`` pieces (one commit each)."""

    text: str


#: One commit: several turns concatenated, or a document (which becomes one commit per piece).
Commit = Union[list[Union[EpisodeTurn, ToolTurn]], Document]


@dataclass
class EpisodeQuestion:
    """The request after the commits: chat messages (+ tools) and the expected answer text."""

    messages: list[dict]
    answer: str
    tools: list[dict] | None = None
    thinking: bool = False
    values: tuple[str, ...] = ()  # words of the answer that carry the skill (recalled values, copied args)
    meta: dict = field(default_factory=dict)


@dataclass
class Episode:
    kind: str
    commits: list[Commit]
    query: EpisodeQuestion
