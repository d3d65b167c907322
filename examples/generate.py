"""Standard chat: two ordinary turns with memory reading and automatic memory writes disabled.

The second turn sees the first through the conversation transcript, as with any chat model.

    python examples/generate.py memt_core/bundled/memt-tiny-demo --url http://127.0.0.1:30000

The model path is a local copy of the checkpoint the server serves (its tokenizer and chat template);
the bundled demo model answers these turns (it was trained on facts told and asked like them). Replies
are greedy (--temperature 0) unless you say otherwise. Reads MEMT_API_KEY (sent as a Bearer token) when
the server requires one.
"""

import argparse
import os

from memt_core.client import MemTSession, NativeClient, load_chat_format, load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_path", help="local checkpoint directory of the served model (Nano or Flash)")
    parser.add_argument("--url", default="http://127.0.0.1:30000", help="server address")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="most tokens per reply")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    args = parser.parse_args()

    # AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False), also for Flash.
    tokenizer = load_tokenizer(args.model_path)
    # chat_format builds inputs; parser extracts reasoning and tool calls.
    chat_format, parser = load_chat_format(
        args.model_path, tokenizer=tokenizer, chat_template_kwargs={"enable_thinking": False}
    )
    client = NativeClient(args.url, api_key=os.environ.get("MEMT_API_KEY"))
    sampling = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}

    with MemTSession(client, chat_format, parser) as chat:
        print(f"session {chat.session_id}: memory reading off, automatic writes off")
        chat.set_memory_read(False)
        for question in ("Hi, my name is Alice and I live in Lisbon.", "Where do I live?"):
            print(f"user: {question}")
            print("assistant:", chat.chat(question, enable_memory=False, **sampling))
        print(f"the transcript holds {len(chat.messages)} messages; nothing was written to memory")
    client.close()


if __name__ == "__main__":
    main()
