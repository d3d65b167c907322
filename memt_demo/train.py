"""Training the demo model: a tiny Nano-architecture MemT, on CPU, through the engine's memory paths.

Every training example is an :class:`~memt_demo.episodes.Episode`: its commits go through
:func:`memt_core.inference.commit_batch` (one forward over the commit tokens reading the memory as it
was, then the gated-delta write, with autograd on), and its query through ``model(ids, memory=
memory_batch(...))``, the read path of a query. The loss is next-token cross-entropy on the assistant's
tokens: the query's answer and the replies inside committed turns (the commit forward computes the
same logits as the query that generated them), so gradients reach the writes of earlier commits only
through the memory that the query reads.

:func:`episode_loss` is the reference. With ``TrainConfig.batched`` the same loss is computed by
:func:`memt_demo.batched.batched_episode_loss`, the memory of the whole batch in one tensor and one forward per
commit index (equal within float tolerance: ``tests/demo/test_batched_trainer.py``; timed against this one by
``scripts/bench/trainer.py``).
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from memt_core.checkpoint import read_checkpoint
from memt_demo.config import memory_config
from memt_demo.episodes import EpisodeSampler, Mix, corpus
from memt_demo.format import DemoChatFormat, TokenEpisode
from memt_demo.loss import HiddenStates, StepStats, weighted_loss
from memt_core.inference import commit_batch, memory_batch
from memt_core.memory.state import MemoryState
from memt_core.models.memt import MemTForCausalLM

CHECKPOINT_ID = "memt-tiny-demo"


@dataclass
class ModelShape:
    """The demo model's geometry (Nano architecture: Qwen3.5-MoE backbone + memory)."""

    vocab_size: int = 2048  # tokenizer target; closed-class words are whole tokens, open values split into pieces
    hidden_size: int = 128
    layers: int = 4  # all full_attention: legal for Nano, and faster on CPU than linear attention
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    experts: int = 4
    experts_per_token: int = 2
    expert_size: int = 128
    shared_expert_size: int = 256
    memory_layers: tuple[int, ...] = (1, 2, 3)
    memory_heads: int = 4
    key_dim: int = 64  # a larger memory than the closed-vocabulary model's 32 × 32: values are copied piece by piece
    value_dim: int = 64
    chunk_tokens: int = 128


@dataclass
class TrainConfig:
    steps: int = 5000
    batch_size: int = 16
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 30
    decay_from: float = 0.5  # the learning rate stays at its peak until here, then decays (cosine)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    value_weight: float = 3.0  # loss weight of recalled values / copied arguments in answers
    reply_weight: float = 0.5  # loss weight of the assistant replies inside committed turns
    seed: int = 0
    threads: int = 1
    device: str = "cpu"  # "cuda" trains on a GPU (FP32; not bit-reproducible there); the weights are saved to CPU
    batched: bool = False  # the loss of memt_demo.batched (the batch's memory in one tensor) instead of episode_loss
    log_every: int = 50
    init_std: float = 0.02
    memory_init_std: float = 0.2  # memory projections; larger than usual, so reads matter from the start
    memory_out_std: float = 0.1  # the read's output projection
    decay_a_log: float = -5.0  # initial decay: log α ≈ −exp(A_log)·softplus(dt_bias) per token ≈ −3e-4
    decay_dt_bias: float = -3.0
    shape: ModelShape = field(default_factory=ModelShape)
    #: A converted pretrained backbone (``python -m memt_core.backbones``) to train memory onto, frozen (a memt-smol
    #: checkpoint, :mod:`memt_demo.smol`); only ``shape``'s memory fields apply then. None: the tiny Nano model.
    backbone: str | None = None
    #: LoRA on the frozen backbone's projections (``memt_core.models.lora``) in the layers from the lowest memory layer
    #: up (the backward reaches no lower); rank 0: none, only the memory trains.
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


# ------------------------------------------------------------------------------------------------
# Tokenizer and checkpoint skeleton


def chain_entry(record: dict) -> dict:
    """A checkpoint's ``training.json`` as one entry of the chain a run continuing it records: its command,
    minutes and config, and for an averaged checkpoint the runs it averages (their minutes count too)."""
    entry = {k: record[k] for k in ("command", "minutes", "config")}
    if "averages" in record:
        entry["averages"] = [chain_entry(run) for run in record["averages"]]
    return entry


def run_minutes(entry: dict) -> float:
    """Training minutes of one run or chain entry: its own, or those of the runs it averages."""
    return entry["minutes"] + sum(run_minutes(run) for run in entry.get("averages", []))


def build_demo_tokenizer(directory: str | Path, *, vocab_size: int, seed: int = 0):
    """A byte-level BPE trained on the demo corpus (plus rendered prompts), saved with the Nano template."""
    from memt_core.families import NANO
    from memt_core.tiny import build_tokenizer

    texts = corpus(seed)
    first = build_tokenizer(directory, NANO, corpus=texts, vocab_size=vocab_size)
    # Second pass: add the chat template's own text (roles, tool instructions) so it gets merges too.
    sampler, mix = EpisodeSampler(seed + 1), Mix()
    rendered = []
    for _ in range(2000):
        query = sampler.sample(mix).query
        kwargs = {"tools": query.tools} if query.tools else {}
        rendered.append(first.apply_chat_template(query.messages, add_generation_prompt=True, tokenize=False,
                                                  enable_thinking=query.thinking, **kwargs))
    return build_tokenizer(directory, NANO, corpus=texts + rendered, vocab_size=vocab_size)


def demo_config(tokenizer, shape: ModelShape) -> dict:
    """config.json of the demo model."""
    from memt_core import families

    nano = families.get(families.NANO)  # the demo model is of the Nano architecture
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    return {
        "model_type": nano.model_type,
        "architectures": [nano.architecture],
        "memt_checkpoint_id": CHECKPOINT_ID,
        "dtype": "bfloat16",
        "backbone_configs": {
            "model_type": "qwen3_5_moe",
            "text_config": {
                "vocab_size": len(tokenizer),
                "hidden_size": shape.hidden_size,
                "num_hidden_layers": shape.layers,
                "layer_types": ["full_attention"] * shape.layers,
                "num_attention_heads": shape.heads,
                "num_key_value_heads": shape.kv_heads,
                "head_dim": shape.head_dim,
                "linear_num_key_heads": 2,
                "linear_num_value_heads": 4,
                "linear_key_head_dim": 16,
                "linear_value_head_dim": 16,
                "num_experts": shape.experts,
                "num_experts_per_tok": shape.experts_per_token,
                "moe_intermediate_size": shape.expert_size,
                "shared_expert_intermediate_size": shape.shared_expert_size,
                "max_position_embeddings": 4096,
                "tie_word_embeddings": True,
                "initializer_range": 0.02,
                "eos_token_id": im_end,
                "pad_token_id": tokenizer.pad_token_id,
            },
        },
        **memory_config(shape),
    }


def write_skeleton(directory: str | Path, config: TrainConfig):
    """Tokenizer files + config.json in ``directory``; returns the tokenizer."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_demo_tokenizer(directory, vocab_size=config.shape.vocab_size, seed=config.seed)
    text = json.dumps(demo_config(tokenizer, config.shape), indent=2) + "\n"
    (directory / "config.json").write_text(text, encoding="utf-8")
    return tokenizer


def init_model(directory: str | Path, config: TrainConfig) -> MemTForCausalLM:
    """A freshly initialised model for the checkpoint skeleton in ``directory`` (FP32, CPU)."""
    from memt_core.models.weights import build_backbone

    checkpoint = read_checkpoint(directory)
    torch.manual_seed(config.seed)
    model = MemTForCausalLM(checkpoint, build_backbone(checkpoint))
    with torch.no_grad():
        for name, param in model.backbone.named_parameters():
            if not torch.isfinite(param).all():
                param.normal_(0.0, config.init_std)
        for layer in model.memory_layers:
            module = model.memory_module(layer)
            module.reset_parameters(std=config.memory_init_std)
            torch.nn.init.normal_(module.o_proj.weight, std=config.memory_out_std)
            module.A_log.fill_(config.decay_a_log)  # decay close to 1: facts survive many later tokens
            module.dt_bias.fill_(config.decay_dt_bias)
    return model


SKELETON_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def continue_model(source: str | Path, directory: str | Path) -> MemTForCausalLM:
    """The checkpoint in ``source`` (FP32, CPU), its tokenizer and config copied into ``directory`` to train on."""
    import shutil

    from memt_core.models.weights import load_model

    source, directory = Path(source), Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if source.resolve() != directory.resolve():
        for name in SKELETON_FILES:
            if (source / name).exists():
                shutil.copyfile(source / name, directory / name)
    return load_model(source, dtype=torch.float32, lora="train")  # a LoRA stays apart, to train further


# ------------------------------------------------------------------------------------------------
# One training step


def _groups(lengths: list[int], slack: float = 1.5) -> list[list[int]]:
    """Row indices grouped by similar length, so that padding stays small."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and lengths[i] <= slack * lengths[groups[-1][0]] + 8:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def episode_loss(model: MemTForCausalLM, batch: list[TokenEpisode]) -> tuple[torch.Tensor, StepStats]:
    """Run a batch of episodes through commit → write → query-reads-memory; the weighted mean CE."""
    device = next(model.parameters()).device
    memories = [MemoryState() for _ in batch]
    total, weight_sum, tokens = torch.zeros((), device=device), torch.zeros((), device=device), 0
    exact: dict[str, list[bool]] = defaultdict(list)
    values: dict[str, list[bool]] = defaultdict(list)
    with HiddenStates(model) as head:
        for depth in range(max(len(e.commits) for e in batch)):
            rows = [i for i, e in enumerate(batch) if len(e.commits) > depth]
            lengths = [len(batch[i].commits[depth]) for i in rows]
            for group in _groups(lengths):
                members = [rows[g] for g in group]
                segments = [batch[i].commits[depth] for i in members]
                keep = any(w > 0 for s in segments for w in s.weights)
                results = commit_batch(model, [memories[i] for i in members], [s.ids for s in segments], keep_logits=keep)
                for i, segment, result in zip(members, segments, results):
                    memories[i] = result.memory
                    tokens += len(segment)
                    if keep:
                        loss, weight, _, _ = weighted_loss(result.logits, head, segment)
                        total, weight_sum = total + loss, weight_sum + weight
        lengths = [len(e.query) for e in batch]
        pad = model.config.pad_token_id or 0
        for group in _groups(lengths):
            longest = max(lengths[i] for i in group)
            ids = torch.full((len(group), longest), pad, dtype=torch.long)
            for row, i in enumerate(group):
                ids[row, : lengths[i]] = torch.tensor(batch[i].query.ids)
            out = model(ids.to(device), memory=memory_batch(model, [memories[i] for i in group]))
            mask = (torch.arange(longest)[None, :] < torch.tensor([lengths[i] for i in group])[:, None]).to(device)
            hidden = out.logits[mask].split([lengths[i] for i in group])  # one gather: backward stays linear
            for row, i in zip(hidden, group):
                loss, weight, correct, stressed = weighted_loss(row, head, batch[i].query)
                total, weight_sum = total + loss, weight_sum + weight
                exact[batch[i].kind].append(bool(correct.all()))
                values[batch[i].kind] += stressed.tolist()
                tokens += lengths[i]
    mean = total / weight_sum.clamp(min=1.0)
    return mean, StepStats(float(mean.detach()), tokens, exact, values)


# ------------------------------------------------------------------------------------------------
# The loop


class Curve:
    """A ``log`` for :func:`train` that prints every line and keeps the learning curve (the step and time-limit lines)
    that a run's ``training.json`` records."""

    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        if line.startswith(("step ", "time limit")):
            self.lines.append(line)


def lr_at(step: int, config: TrainConfig, progress: float | None = None) -> float:
    """Linear warm-up, constant until ``decay_from`` of training, then cosine down to ``min_lr_ratio``.

    ``progress`` (a fraction of training) replaces ``step / steps`` for the decay when training is
    scheduled by time (see :func:`train`).
    """
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    if progress is None:
        start = max(config.warmup, int(config.decay_from * config.steps))
        progress = max(0.0, (step - start) / max(1, config.steps - start))
    else:
        progress = max(0.0, (progress - config.decay_from) / max(1e-9, 1.0 - config.decay_from))
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine)


def train(
    config: TrainConfig,
    directory: str | Path,
    *,
    log: Callable[[str], None] = print,
    mix_for: Callable[[float], Mix] = Mix.curriculum,
    time_limit_s: float | None = None,
    schedule_by_time: bool = False,
    init_from: str | Path | None = None,
    save_every: int | None = None,
) -> MemTForCausalLM:
    """Train a demo model into ``directory`` (tokenizer + config.json + BF16 weights); returns it (FP32).

    ``mix_for(progress)`` gives the data mix at each fraction of training: by default
    :meth:`Mix.curriculum`, a warm-up on single facts, then a blend to the full mix. Training stops
    after ``config.steps`` or, with ``time_limit_s``, when that many seconds have passed. With
    ``schedule_by_time`` the progress that drives the mix and the learning-rate decay is the larger of
    the step fraction and the time fraction, so a machine slower than expected still completes the
    curriculum and the decay before the time limit (on a fast machine the steps bind and the run is
    reproducible step for step; on a slow one it depends on its speed: the log records the steps reached).
    ``init_from`` continues training a checkpoint (its tokenizer, config and weights) instead of starting
    from a fresh tokenizer and random weights; ``config.shape`` is then ignored.
    ``save_every`` saves the weights every that many steps as well, so a long run killed midway can be continued.
    """
    from transformers import PreTrainedTokenizerFast

    from memt_core.models.weights import save_weights

    torch.set_num_threads(config.threads)
    directory = Path(directory)
    started = time.time()
    if init_from is None and config.backbone:
        from memt_demo import smol

        smol.write_skeleton(directory, config.backbone, config.shape, lora_rank=config.lora_rank, lora_alpha=config.lora_alpha)
        model = smol.init_model(directory, config)
    elif init_from is None:
        write_skeleton(directory, config)
        model = init_model(directory, config)
    else:
        model = continue_model(init_from, directory)
        if model.checkpoint.family.backbone_weights(model.checkpoint.path, model.checkpoint.config):
            from memt_demo.smol import freeze_backbone

            freeze_backbone(model)  # a checkpoint on an external backbone trains its memory only
    model.to(config.device)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(directory))
    model.train()
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log(f"model: {params / 1e6:.2f}M parameters ({trainable / 1e6:.2f}M trained), vocabulary {len(tokenizer)}, "
        f"memory layers {list(model.memory_layers)}")
    fmt = DemoChatFormat(tokenizer, value_weight=config.value_weight)
    sampler = EpisodeSampler(config.seed)
    if config.batched:
        from memt_demo.batched import batched_episode_loss as loss_of
    else:
        loss_of = episode_loss
    chunk = model.checkpoint.memory.chunk_tokens
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.dim() < 2 or "A_log" in name or "dt_bias" in name else decay).append(p)
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr, betas=(0.9, 0.98),
    )
    window_loss, window_tokens, window_exact, window_values = [], 0, defaultdict(list), defaultdict(list)
    window_start = loop_start = time.time()
    budget = None if time_limit_s is None else max(1.0, time_limit_s - (loop_start - started))

    def progress_at(step: int) -> float:
        fraction = step / config.steps
        if schedule_by_time and budget is not None:
            fraction = max(fraction, (time.time() - loop_start) / budget)
        return min(1.0, fraction)

    from tqdm.auto import tqdm

    # a progress bar on a terminal only (the log lines stay the record); shown once training takes a while
    bar = tqdm(total=config.steps, desc="training", unit="step", disable=None, delay=2, leave=False)
    for step in range(config.steps):
        bar.update(1)
        progress = progress_at(step)
        mix = mix_for(progress)
        batch = [fmt.episode(sampler.sample(mix), chunk, reply_weight=config.reply_weight) for _ in range(config.batch_size)]
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config, progress if schedule_by_time else None)
        loss, stats = loss_of(model, batch)
        optimizer.zero_grad(set_to_none=True)
        if loss.requires_grad:  # a batch whose answers no trained weight reaches (a frozen backbone, memory unread) teaches nothing
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
        window_loss.append(stats.loss)
        window_tokens += stats.tokens
        for kind, flags in stats.exact.items():
            window_exact[kind] += flags
        for kind, flags in stats.values.items():
            window_values[kind] += flags
        if (step + 1) % config.log_every == 0 or step + 1 == config.steps:
            elapsed = time.time() - window_start
            kinds = " ".join(
                f"{k}={sum(v) / len(v):.2f}" + (f"/{sum(window_values[k]) / len(window_values[k]):.2f}" if window_values[k] else "")
                for k, v in sorted(window_exact.items())
            )
            log(
                f"step {step + 1}/{config.steps} loss {sum(window_loss) / len(window_loss):.3f} "
                f"lr {lr_at(step, config, progress if schedule_by_time else None):.2e} {window_tokens / elapsed:.0f} tok/s "
                f"t={time.time() - started:.0f}s | exact/values {kinds}"
            )
            window_loss, window_tokens, window_exact, window_values = [], 0, defaultdict(list), defaultdict(list)
            window_start = time.time()
        if save_every and (step + 1) % save_every == 0 and step + 1 < config.steps:
            save_weights(model, directory)
            log(f"saved the weights at step {step + 1}")
        if time_limit_s is not None and time.time() - started > time_limit_s:
            log(f"time limit reached at step {step + 1}" + (" (schedule by time: curriculum and decay completed)" if schedule_by_time else ""))
            break
    bar.close()
    model.eval()
    save_weights(model, directory)
    return model
