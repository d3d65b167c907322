#!/usr/bin/env python
"""A LlamaIndex conversation with latent memory through a running MemT proxy.

    python -m memt_core.launch --port 30000 &
    python -m memt_proxy --upstream http://127.0.0.1:30000 --port 8000 &
    python examples/llamaindex_chat.py --base-url http://127.0.0.1:8000/v1
"""

import argparse
import os
import uuid

from llama_index.core.llms import ChatMessage
from llama_index.llms.memt import MemT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="the proxy's OpenAI base URL")
    parser.add_argument("--model", default=None, help="model name (default: the first the proxy lists)")
    parser.add_argument("--session", default=f"llamaindex-{uuid.uuid4().hex[:8]}", help="MemT session id")
    args = parser.parse_args()
    key = os.environ.get("MEMT_PROXY_API_KEY", "memt")
    model = args.model
    if model is None:
        import openai

        model = openai.OpenAI(base_url=args.base_url, api_key=key).models.list().data[0].id

    llm = MemT(model=model, api_base=args.base_url, api_key=key, session_id=args.session, memory="auto", temperature=0, max_tokens=64)
    history = [ChatMessage(role="user", content="Hi, my name is Alice and I live in Lisbon.")]
    reply = llm.chat(history)
    print(f"user:  {history[0].content}\nmodel: {reply.message.content}")
    history += [reply.message, ChatMessage(role="user", content="What is my name?")]
    print(f"user:  {history[-1].content}\nmodel: ", end="", flush=True)
    for piece in llm.stream_chat(history):
        print(piece.delta or "", end="", flush=True)
    print()
    state = llm.inspect_session()  # the whole record: llm.inspect_session() holds the proxy's and the core's view
    print(f"memory: {state['committed_messages']} messages committed, version {state['native']['published_version']}")
    llm.close_session()


if __name__ == "__main__":
    main()
