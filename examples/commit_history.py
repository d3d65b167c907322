"""Commit complete turns to memory, save a snapshot, and restore it into a fresh session.

The snapshot holds memory only: the restored session starts with an empty transcript and answers
from memory.

    python examples/commit_history.py memt_core/bundled/memt-tiny-demo --url http://127.0.0.1:30000 [--snapshot NAME.safetensors]

Snapshots live in the server's --state-directory: start the server with one (the README's start line
does). The bundled demo model answers these turns (it was trained on facts told and asked like them).
Replies are greedy (--temperature 0) unless you say otherwise. Reads MEMT_API_KEY (sent as a Bearer
token) when the server requires one.
"""

import argparse
import os

from memt_core.client import MemTSession, NativeClient, load_chat_format, load_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_path", help="local checkpoint directory of the served model (Nano or Flash)")
    parser.add_argument("--url", default="http://127.0.0.1:30000", help="server address")
    parser.add_argument("--snapshot", default=None,
                        help="snapshot file name (a simple .safetensors name); default: named by the server after its content")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing snapshot of that name")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="most tokens per reply")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    args = parser.parse_args()

    client = NativeClient(args.url, api_key=os.environ.get("MEMT_API_KEY"))
    if not client.capabilities().get("snapshots"):
        raise SystemExit(f"the server at {args.url} keeps no snapshots: start it with --state-directory DIR "
                         "(python -m memt_core.launch ... --state-directory ./memt-state)")
    # AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False), also for Flash.
    tokenizer = load_tokenizer(args.model_path)
    # chat_format builds inputs; parser extracts reasoning and tool calls.
    chat_format, parser = load_chat_format(
        args.model_path, tokenizer=tokenizer, chat_template_kwargs={"enable_thinking": False}
    )
    sampling = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}

    session = MemTSession(client, chat_format, parser)
    print(f"session {session.session_id}")
    for message in (
        "I have a three-month-old kitten named Memmy who loves eating small shrimp.",
        "My favourite colour is green.",
    ):
        print(f"user: {message}")
        print("assistant:", session.chat(message, **sampling))
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
        for question in ("What is my kitten's name?", "What is my favourite colour?"):
            print(f"user: {question}")
            print("assistant:", restored.chat(question, **sampling))
    client.close()


if __name__ == "__main__":
    main()
