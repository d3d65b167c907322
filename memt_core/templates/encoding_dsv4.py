"""Prompt encoder and completion parser for MemT Flash test checkpoints (DeepSeek-V4 style).

MemT serve writes this file into the tiny Flash checkpoints it generates; real Flash checkpoints ship
their own ``encoding_dsv4.py`` with the same two entry points:

* ``encode_messages(messages, thinking_mode, ...) -> str``
* ``parse_message_from_completion_text(text, thinking_mode) -> dict``

Only the client executes this file, explicitly; the server never runs checkpoint Python code.
Tools are given on a system message (``"tools"``, OpenAI format); tool results (role ``tool``) are
folded into the following user turn as ``<tool_result>`` blocks; assistant tool calls use DSML.
"""

import json
import re

bos_token = "<｜begin▁of▁sentence｜>"
eos_token = "<｜end▁of▁sentence｜>"
user_token = "<｜User｜>"
assistant_token = "<｜Assistant｜>"
thinking_start_token = "<think>"
thinking_end_token = "</think>"
dsml_token = "｜DSML｜"

CALLS_OPEN = f"<{dsml_token}tool_calls>"
CALLS_CLOSE = f"</{dsml_token}tool_calls>"
INVOKE = re.compile(rf'<{dsml_token}invoke name="([^"]+)">\n?(.*?)</{dsml_token}invoke>', re.S)
PARAMETER = re.compile(rf'<{dsml_token}parameter name="([^"]+)" string="(true|false)">(.*?)</{dsml_token}parameter>', re.S)


def _text(content):
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def _tools_block(tools):
    schemas = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
    return (
        "## Tools\nCall tools with a tool_calls block:\n"
        f"{CALLS_OPEN}\n<{dsml_token}invoke name=\"NAME\">\n"
        f"<{dsml_token}parameter name=\"ARG\" string=\"true|false\">VALUE</{dsml_token}parameter>\n"
        f"</{dsml_token}invoke>\n{CALLS_CLOSE}\n"
        "String values are written as is with string=\"true\"; other values as JSON with string=\"false\".\n"
        f"### Available tools\n{schemas}\n"
    )


def _arguments(arguments):
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = {"arguments": arguments}
    lines = []
    for key, value in arguments.items():
        is_string = isinstance(value, str)
        body = value if is_string else json.dumps(value, ensure_ascii=False)
        lines.append(f'<{dsml_token}parameter name="{key}" string="{"true" if is_string else "false"}">{body}</{dsml_token}parameter>')
    return "\n".join(lines)


def _tool_calls(calls):
    invokes = []
    for call in calls:
        fn = call.get("function", call)
        invokes.append(f'<{dsml_token}invoke name="{fn["name"]}">\n{_arguments(fn.get("arguments", {}))}\n</{dsml_token}invoke>')
    return f"\n\n{CALLS_OPEN}\n" + "\n".join(invokes) + f"\n{CALLS_CLOSE}"


def _merge_tool_results(messages):
    merged = []
    for message in messages:
        if message.get("role") == "tool":
            block = f"<tool_result>{_text(message.get('content'))}</tool_result>"
            if merged and merged[-1].get("_tool_results"):
                merged[-1]["content"] += "\n\n" + block
            else:
                merged.append({"role": "user", "content": block, "_tool_results": True})
        else:
            merged.append(dict(message))
    return merged


def encode_messages(messages, thinking_mode="chat", context=None, drop_thinking=True, add_default_bos_token=True, reasoning_effort=None):
    """Render ``messages`` as one prompt string; ends with the assistant prefix when the last message is not an assistant's."""
    if thinking_mode not in ("chat", "thinking"):
        raise ValueError(f"thinking_mode must be 'chat' or 'thinking', got {thinking_mode!r}")
    messages = _merge_tool_results(messages)
    last_user = max((i for i, m in enumerate(messages) if m.get("role") in ("user", "developer")), default=-1)
    prompt = bos_token if add_default_bos_token and not context else ""
    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "system":
            prompt += _text(message.get("content"))
            if message.get("tools"):
                prompt += "\n\n" + _tools_block(message["tools"])
        elif role in ("user", "developer"):
            prompt += user_token + _text(message.get("content"))
            if message.get("tools"):
                prompt += "\n\n" + _tools_block(message["tools"])
            nxt = messages[index + 1] if index + 1 < len(messages) else None
            if nxt is None or nxt.get("role") == "assistant":
                prompt += assistant_token
                reasoning = nxt.get("reasoning_content") if nxt else None
                keep = thinking_mode == "thinking" and (not drop_thinking or index == last_user)
                if nxt is None:
                    prompt += thinking_start_token if thinking_mode == "thinking" else thinking_end_token
                elif keep and reasoning:
                    prompt += thinking_start_token + reasoning + thinking_end_token
                else:
                    prompt += thinking_end_token
        elif role == "assistant":
            body = _text(message.get("content"))
            if message.get("tool_calls"):
                body += _tool_calls(message["tool_calls"])
            prompt += body + ("" if message.get("wo_eos") else eos_token)
        else:
            raise ValueError(f"unsupported role {role!r}")
    return prompt


def parse_message_from_completion_text(text, thinking_mode="chat"):
    """Split a completion into reasoning, content and tool calls (OpenAI-shaped)."""
    text = text.replace(eos_token, "")
    reasoning = None
    if thinking_mode == "thinking":
        text = text[len(thinking_start_token):] if text.startswith(thinking_start_token) else text
        if thinking_end_token in text:
            reasoning, text = text.split(thinking_end_token, 1)
        else:
            reasoning, text = text, ""
    calls = []
    if CALLS_OPEN in text:
        text, block = text.split(CALLS_OPEN, 1)
        block = block.split(CALLS_CLOSE, 1)[0]
        for name, body in INVOKE.findall(block):
            arguments = {}
            for key, is_string, value in PARAMETER.findall(body):
                arguments[key] = value if is_string == "true" else json.loads(value)
            calls.append({"type": "function", "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
    return {"role": "assistant", "content": text.strip(), "reasoning_content": reasoning, "tool_calls": calls}
