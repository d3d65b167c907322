"""Token ids of conversations, exactly as the client and the proxy encode them for a Nano model.

* A query's prompt is ``apply_chat_template(messages, add_generation_prompt=True, enable_thinking=…,
  tools=…)``; with memory, committed turns are not in ``messages``.
* A committed turn is the prompt of its user message alone (no system prompt, thinking off) followed by
  the assistant's generated ids, ending with ``<|im_end|>``. A tool-calling turn continues with the tool
  results as the template renders them after the assistant's call, and the next generated ids.
* A document is its raw text tokens (no template), one commit per ``chunk_tokens`` piece.

:class:`Segment` pairs ids with per-token loss weights (``weights[i]`` weighs predicting ``ids[i]``), which
is what training needs; evaluation uses the same functions to build prompts and commits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memt_demo.episodes import Document, Episode, EpisodeQuestion, EpisodeTurn, ToolTurn, tool_call_text, tool_messages

THINK_EMPTY = "<think>\n\n</think>\n\n"


@dataclass
class Segment:
    ids: list[int]
    weights: list[float]

    def __add__(self, other: "Segment") -> "Segment":
        return Segment(self.ids + other.ids, self.weights + other.weights)

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class TokenEpisode:
    kind: str
    commits: list[Segment]
    query: Segment


class DemoChatFormat:
    """Encodes prompts, committed turns, documents and answers with a Nano tokenizer."""

    def __init__(self, tokenizer, *, value_weight: float = 1.0):
        self.tokenizer = tokenizer
        self.im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.value_weight = value_weight

    # -- the conventions ---------------------------------------------------------------------------

    def prompt(self, messages: list[dict], *, tools: list[dict] | None = None, thinking: bool = False, start: bool = True) -> list[int]:
        """Prompt ids of a query (generation prompt included); ``start=False`` renders a piece that follows others
        (a committed turn): a template with a default system prompt (memt-smol's) leaves it out there."""
        kwargs = {"tools": tools} if tools else {}
        if not start:
            kwargs["omit_default_system"] = True
        return list(
            self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, enable_thinking=thinking, tokenize=True, return_dict=False, **kwargs
            )
        )

    def turn_prompt(self, user: str) -> list[int]:
        """The start of a committed turn: its user message alone, as a prompt."""
        return self.prompt([{"role": "user", "content": user}], start=False)

    def text(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def reply(self, text: str) -> list[int]:
        """What the model generates for ``text``: its tokens, then ``<|im_end|>``."""
        return self.text(text) + [self.im_end]

    def tool_results(self, turn: ToolTurn) -> list[int]:
        """What follows the assistant's tool call in a committed turn: the rendered results + generation prompt."""
        messages = tool_messages(turn)
        full = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, enable_thinking=False, tokenize=False)
        head = self.tokenizer.apply_chat_template(messages[:-1], tokenize=False)
        if not full.startswith(head):
            raise ValueError("the chat template does not render tool results after the assistant's call")
        return self.text(full[len(head):])

    def document_pieces(self, text: str, chunk_tokens: int) -> list[list[int]]:
        ids = self.text(text)
        return [ids[i : i + chunk_tokens] for i in range(0, len(ids), chunk_tokens)]

    # -- weighted segments for training --------------------------------------------------------------

    def weighted(self, text: str, values: tuple[str, ...] = (), *, weight: float = 1.0) -> Segment:
        """Tokens of ``text`` + ``<|im_end|>``, weight ``weight``; the ``values`` words weigh ``value_weight`` more."""
        ids = self.text(text)
        weights = [weight] * len(ids)
        if values and self.value_weight != 1.0:
            pieces, start = [], 0
            for value in values:
                match = re.compile(r"(?<![\w])" + re.escape(value) + r"(?![\w])").search(text, start)
                if match is None:
                    continue
                cut = match.start() - 1 if match.start() > 0 and text[match.start() - 1] == " " else match.start()
                pieces += [(text[start:cut], weight), (text[cut : match.end()], weight * self.value_weight)]
                start = match.end()
            pieces.append((text[start:], weight))
            split_ids, split_weights = [], []
            for piece, w in pieces:
                piece_ids = self.text(piece) if piece else []
                split_ids += piece_ids
                split_weights += [w] * len(piece_ids)
            if split_ids == ids:  # split only where the tokenizer splits anyway
                weights = split_weights
        return Segment(ids + [self.im_end], weights + [weight])

    def turn(self, turn: EpisodeTurn | ToolTurn, *, reply_weight: float = 1.0) -> Segment:
        """A committed turn; the reply is weighted only for plain turns (a tool turn's prompt had the tools)."""
        prompt = self.turn_prompt(turn.user)
        segment = Segment(prompt, [0.0] * len(prompt))
        if isinstance(turn, ToolTurn):
            call = self.reply(tool_call_text(turn.call))
            results = self.tool_results(turn)
            final = self.reply(turn.reply)
            rest = call + results + final
            return segment + Segment(rest, [0.0] * len(rest))
        return segment + self.weighted(turn.reply, turn.values, weight=reply_weight)

    def query(self, query: EpisodeQuestion) -> Segment:
        if query.meta.get("replayed") and not query.thinking:  # user/assistant pairs, then the question: each pair as a committed turn
            *history, question = query.messages
            prompt = [i for user, reply in zip(history[::2], history[1::2]) for i in self.turn(EpisodeTurn(user["content"], reply["content"])).ids]
            prompt += self.turn_prompt(question["content"])
        else:
            prompt = self.prompt(query.messages, tools=query.tools, thinking=query.thinking)
        answer = self.weighted(query.answer, query.values)
        if query.thinking:
            think = self.text(THINK_EMPTY)
            answer = Segment(think, [1.0] * len(think)) + answer
        return Segment(prompt, [0.0] * len(prompt)) + answer

    def episode(self, episode: Episode, chunk_tokens: int, *, reply_weight: float = 1.0) -> TokenEpisode:
        commits: list[Segment] = []
        for commit in episode.commits:
            if isinstance(commit, Document):
                commits += [Segment(piece, [0.0] * len(piece)) for piece in self.document_pieces(commit.text, chunk_tokens)]
            else:
                segment = Segment([], [])
                for turn in commit:
                    segment = segment + self.turn(turn, reply_weight=reply_weight)
                commits.append(segment)
        return TokenEpisode(episode.kind, commits, self.query(episode.query))
