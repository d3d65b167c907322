"""What both training losses share (``train.episode_loss``, the reference, and ``batched.batched_episode_loss``):
the backbone's hidden states instead of its logits, the weighted cross-entropy of one row, and a step's statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from memt_core.models.memt import MemTForCausalLM
from memt_demo.format import Segment


class HiddenStates:
    """Within this context the backbone's ``lm_head`` is the identity, so ``logits`` are final hidden states.

    Training needs the output projection only where the loss looks (answer and reply tokens), not at every
    position of every commit and prompt; everything before the head is the unchanged forward pass.
    """

    def __init__(self, model: MemTForCausalLM):
        self.model = model

    def __enter__(self) -> torch.Tensor:
        self.head = self.model.backbone.lm_head
        self.model.backbone.lm_head = torch.nn.Identity()
        return self.head.weight

    def __exit__(self, *exc) -> None:
        self.model.backbone.lm_head = self.head


def weighted_loss(hidden: torch.Tensor, head: torch.Tensor, segment: Segment):
    """Σ w·CE over a row's weighted tokens, Σ w, argmax correctness of every weighted token and of the stressed ones."""
    weights = torch.tensor(segment.weights[1:])
    keep = weights > 0
    if not keep.any():
        empty = torch.ones(0, dtype=torch.bool)
        return hidden.sum() * 0.0, torch.tensor(0.0, device=hidden.device), empty, empty
    positions = keep.nonzero().squeeze(1)
    target, w = torch.tensor(segment.ids[1:])[positions].to(hidden.device), weights[positions].to(hidden.device)
    logits = F.linear(hidden[positions.to(hidden.device)], head)  # hidden state at t predicts token t+1
    correct = logits.argmax(-1) == target
    return (F.cross_entropy(logits.float(), target, reduction="none") * w).sum(), w.sum(), correct, correct[w > 1.0]


@dataclass
class StepStats:
    loss: float
    tokens: int
    exact: dict[str, list[bool]]  # kind → per episode: every answer token argmax-correct (teacher forced)
    values: dict[str, list[bool]]  # kind → per stressed answer token (recalled values, copied arguments)
