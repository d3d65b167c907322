"""The native MemT client: ``NativeClient`` (HTTP), ``MemTSession`` (conversations with memory),
``load_chat_format`` (prompt encoding and output parsing per model family) and the interactive CLI
(``python -m memt_core.client``), ``ProxySessions`` for the OpenAI-compatible proxy's session admin
routes, and ``MemoryWrite``, the steps of a memory write without I/O (driven by ``MemTSession`` and the
proxy). Needs no PyTorch.
"""

import sys

from memt_core.client.chat_format import ChatFormat, FlashChatFormat, NanoChatFormat, load_chat_format, load_tokenizer
from memt_core.client.errors import MemTClientError
from memt_core.client.native import NativeClient
from memt_core.client.parsers import OutputParser, Parsed, ToolCall, parser_for
from memt_core.client.proxy_sessions import ProxySessions
from memt_core.client.session import MemTSession, TurnRecord
from memt_core.client.turns import MemoryWrite

if "transformers.models.auto.tokenization_auto" in sys.modules:
    # AutoTokenizer is already imported (the documented order): make tokenizer_type="deepseek_v4" work now;
    # otherwise load_tokenizer / load_chat_format register it when first used, without importing transformers here
    from memt_core.tokenizer import register_with_transformers

    register_with_transformers()

__all__ = [
    "ChatFormat", "FlashChatFormat", "MemTClientError", "MemTSession", "MemoryWrite", "NanoChatFormat", "NativeClient",
    "OutputParser", "Parsed", "ProxySessions", "ToolCall", "TurnRecord", "load_chat_format", "load_tokenizer", "parser_for",
]
