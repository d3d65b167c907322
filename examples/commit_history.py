"""Commit complete turns to memory, save a snapshot, and restore it into a fresh session.

The snapshot holds memory only: the restored session starts with an empty transcript and answers
from memory.

    python examples/commit_history.py /models/MemT-1.0-Nano [--url http://127.0.0.1:30000] [--snapshot NAME.safetensors]

Snapshots live in the server's --state-directory. Reads MEMT_API_KEY (sent as a Bearer token) when
the server requires one.
"""

import argparse
import os

from memt_core.client import MemTSession, NativeClient, load_chat_format, load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_path", help="local checkpoint directory of the served model (Nano or Flash)")
    parser.add_argument("--url", default="http://127.0.0.1:30000", help="server address")
    parser.add_argument("--snapshot", default=None,
                        help="snapshot file name (a simple .safetensors name); default: a new ID chosen by the server")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing snapshot of that name")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="most tokens per reply")
    args = parser.parse_args()

    # AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False), also for Flash.
    tokenizer = load_tokenizer(args.model_path)
    # chat_format builds inputs; parser extracts reasoning and tool calls.
    chat_format, parser = load_chat_format(
        args.model_path, tokenizer=tokenizer, chat_template_kwargs={"enable_thinking": False}
    )
    client = NativeClient(args.url, api_key=os.environ.get("MEMT_API_KEY"))

    session = MemTSession(client, chat_format, parser)
    print(f"session {session.session_id}")
    for question in (
        "I have a three-month-old kitten named memmy who loves eating small shrimp.",
        "She is excellent at remembering things.",
    ):
        print(f"user: {question}")
        print("assistant:", session.chat(question, max_new_tokens=args.max_new_tokens))
    committed = session.commit_history()
    print(f"committed turns {committed['committed_turns']} to memory; "
          f"{len(session.messages)} messages remain in the transcript")

    # Save local memory, including any unsaved conversation turns.
    snapshot = session.save_state(args.snapshot, overwrite=args.overwrite)
    print(f"saved memory as {snapshot['path']} on the server")
    session.close()

    with MemTSession(client, chat_format, parser, state=snapshot["path"]) as restored:
        print(f"restored {snapshot['path']} into session {restored.session_id}")
        print(f"messages in the restored session: {len(restored.messages)}")  # 0: the transcript is not restored.
        question = "How old is my kitten?"
        print(f"user: {question}")
        print("assistant:", restored.chat(question, max_new_tokens=args.max_new_tokens))
    client.close()


if __name__ == "__main__":
    main()
