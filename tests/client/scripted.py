"""Tiny checkpoints whose greedy replies to known prompts are fixed in advance ("scripted").

Why: a random tiny model never writes a tool call, so a live test of multi-round tool chains (or of
a reply that completes within a few tokens) needs a model that does. The trick, and why it is honest:

1. The checkpoint is an ordinary random tiny checkpoint built like ``memt_core.tiny``'s, with a
   wider hidden size (256, so that the 84 (Nano) or 162 (Flash) scripted positions have linearly
   independent hidden states) and the scripted replies added to the BPE training corpus. Tool-call
   markup stays real text with the family's real special tokens; nothing is a single magic token.
2. The scripted contexts are the prompts a correct session sends, assembled here from the client's
   chat-format pieces (system/tools block, replayed turns, the user message or tool results with
   the assistant opening). The real model is run over ``context + reply`` and the inputs of
   ``lm_head`` (the final normed hidden states, which depend on the whole context) are collected.
3. Only ``lm_head`` is edited: the least-norm change ``ΔW = D·H⁺`` makes each scripted next token
   lead the best other token by a margin *at those positions*. Everything else is untouched; other
   prompts still meet the random model (which now favours the scripted tokens somewhat).

At test time the server really decodes greedily, and the client really parses the output. If a
session assembled a prompt differently (dropped or reordered a replayed turn, re-encoded generated
ids instead of replaying them), the hidden states would differ and the model would not follow the
script, so these tests also pin the session's prompt assembly. (The rendering of each piece is
checked against the templates in ``test_client_formats``.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from memt_core.families import NANO

MARGIN = 12.0  # logit lead of every scripted token over the best other token
HIDDEN = 256  # hidden size: more dimensions than scripted positions

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a fact about the user's kitten.",
            "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
        },
    }
]

TOOL_QUESTION = "Look up the requested item."
PLAIN_FIRST = "I have a kitten named Memmy."
PLAIN_SECOND = "What game can we play?"
ANSWERS = {"first": "Memmy is a lovely name.", "second": "Play fetch with shrimp.", "final": "Memmy loves shrimp."}
TOOL_RESULTS = [
    [{"content": "three months old"}],
    [{"content": "small shrimp"}, {"content": "remembering things"}],
]
CALL_ITEMS = [["age"], ["food", "trait"]]  # round 1: one call; round 2: two calls in one reply
TRUNCATE = 3  # max_new_tokens that cuts the first plain reply short


def tool_call_text(family: str, items: list[str]) -> str:
    """How a model of ``family`` writes calls of ``lookup`` for ``items`` in one reply."""
    if family == NANO:
        return "\n".join(
            '<tool_call>\n{"name": "lookup", "arguments": {"item": "%s"}}\n</tool_call>' % item for item in items
        )
    dsml = "｜DSML｜"
    invokes = "\n".join(
        f'<{dsml}invoke name="lookup">\n<{dsml}parameter name="item" string="true">{item}</{dsml}parameter>\n</{dsml}invoke>'
        for item in items
    )
    return f"\n\n<{dsml}tool_calls>\n{invokes}\n</{dsml}tool_calls>"


def scripted_texts(family: str) -> list[str]:
    return [tool_call_text(family, items) for items in CALL_ITEMS] + list(ANSWERS.values())


@dataclass
class Script:
    """One scripted generation: after ``context`` the model emits ``reply`` (ending with EOS)."""

    name: str
    context: list[int]
    reply: list[int]


def scripts(chat_format, tokenizer) -> list[Script]:
    """The conversations the live tests hold, as a correct client encodes them (thinking off)."""
    family = chat_format.family
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>") if family == NANO else tokenizer.eos_token_id

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False) + [eos]

    out: list[Script] = []
    # A plain conversation: two completed turns.
    first = chat_format.user_ids(PLAIN_FIRST, enable_thinking=False)
    prompt = chat_format.prompt_ids(system_prompt=None, tools=None, turns=[], tail=first)
    reply = encode(ANSWERS["first"])
    out.append(Script("first", prompt, reply))
    second = chat_format.user_ids(PLAIN_SECOND, enable_thinking=False)
    prompt = chat_format.prompt_ids(system_prompt=None, tools=None, turns=[first + reply], tail=second)
    out.append(Script("second", prompt, encode(ANSWERS["second"])))
    # The same second question after the first reply was cut off at TRUNCATE tokens.
    prompt = chat_format.prompt_ids(system_prompt=None, tools=None, turns=[first + reply[:TRUNCATE]], tail=second)
    out.append(Script("second-after-truncated", prompt, encode(ANSWERS["second"])))
    # A tool chain: one call, then two calls, then the final answer.
    turn = chat_format.user_ids(TOOL_QUESTION, enable_thinking=False)
    for number, items in enumerate(CALL_ITEMS):
        prompt = chat_format.prompt_ids(system_prompt=None, tools=TOOLS, turns=[], tail=turn)
        reply = encode(tool_call_text(family, items))
        out.append(Script(f"tools-{number + 1}", prompt, reply))
        results = [{"tool_call_id": f"call-{i}", **r} for i, r in enumerate(TOOL_RESULTS[number])]
        turn = turn + reply + chat_format.tool_results_ids(results, enable_thinking=False)
    prompt = chat_format.prompt_ids(system_prompt=None, tools=TOOLS, turns=[], tail=turn)
    out.append(Script("tools-final", prompt, encode(ANSWERS["final"])))
    return out


def make_scripted_checkpoint(directory: str | Path, family: str, *, seed: int = 1) -> Path:
    """A tiny ``family`` checkpoint in ``directory`` whose greedy replies follow ``scripts()``."""
    import torch
    from safetensors.torch import load_file, save_file

    from memt_core.checkpoint import read_checkpoint
    from memt_core.client import load_chat_format, load_tokenizer
    from memt_core.models.memt import MemTForCausalLM
    from memt_core.models.weights import build_backbone, load_model, save_weights
    from memt_core import families
    from memt_core.tiny import CORPUS, build_tokenizer

    # memt_core.tiny.make_tiny_checkpoint, with a wider hidden size (room for every scripted position
    # to get its own direction) and the scripted replies in the tokenizer's corpus.
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(directory, family, corpus=list(CORPUS) + scripted_texts(family) * 20)
    config = families.get(family).tiny_config(tokenizer, hidden_size=HIDDEN)
    config["memt_checkpoint_id"] = f"scripted-{family}"
    (directory / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    torch.manual_seed(seed)
    model = MemTForCausalLM(read_checkpoint(directory), build_backbone(read_checkpoint(directory)))
    with torch.no_grad():
        for name, param in model.backbone.named_parameters():
            if not torch.isfinite(param).all() or name.endswith("sinks"):
                param.normal_(0.0, 0.2)
        for layer in model.memory_layers:
            model.memory_module(layer).reset_parameters(std=0.3)
    save_weights(model, directory)
    del model
    tokenizer = load_tokenizer(directory)
    chat_format, _ = load_chat_format(directory, tokenizer=tokenizer, chat_template_kwargs={"enable_thinking": False})
    plan = scripts(chat_format, tokenizer)

    model = load_model(directory)  # FP32 on CPU, as the server computes
    lm_head = model.backbone.lm_head
    captured: list = []
    hook = lm_head.register_forward_hook(lambda module, args, output: captured.append(args[0].detach()))
    features, targets = [], []
    try:
        with torch.no_grad():
            for script in plan:
                ids = script.context + script.reply[:-1]
                captured.clear()
                model(torch.tensor([ids]))
                hidden = captured[-1][0]  # [T, hidden]
                start = len(script.context) - 1
                for offset, token in enumerate(script.reply):
                    features.append(hidden[start + offset])
                    targets.append(token)
    finally:
        hook.remove()
    H = torch.stack(features).double().T  # [hidden, n]
    W = lm_head.weight.detach().double()  # [vocab, hidden]
    logits = W @ H
    D = torch.zeros_like(logits)
    for column, token in enumerate(targets):
        others = logits[:, column].clone()
        others[token] = float("-inf")
        D[token, column] = others.max() + MARGIN - logits[token, column]
    new_weight = (W + D @ torch.linalg.pinv(H)).to(torch.bfloat16)
    # Check the scripted tokens still lead by a safe margin after rounding to BF16.
    check = new_weight.double() @ H
    for column, token in enumerate(targets):
        lead = check[token, column] - torch.cat([check[:token, column], check[token + 1:, column]]).max()
        if lead < MARGIN / 2:
            raise RuntimeError(f"scripted position {column} leads by only {float(lead):.2f}")
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    tensors["lm_head.weight"] = new_weight.contiguous()
    save_file(tensors, str(path), metadata={"format": "pt"})
    return directory


