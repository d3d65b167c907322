"""Document ingestion: write a document into a session's latent memory, then ask about it.

The document is committed in chunk_tokens pieces in one transaction; the question's prompt does not
contain the document, only memory does.

    python examples/document_memory.py /models/MemT-1.0-Nano [--url http://127.0.0.1:30000] [--document FILE]

Reads MEMT_API_KEY (sent as a Bearer token) when the server requires one.
"""

import argparse
import os

from memt_core.client import MemTSession, NativeClient, load_chat_format, load_tokenizer

DOCUMENT = (
    "I have a three-month-old kitten named memmy who loves eating "
    "small shrimp and is excellent at remembering things."
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_path", help="local checkpoint directory of the served model (Nano or Flash)")
    parser.add_argument("--url", default="http://127.0.0.1:30000", help="server address")
    parser.add_argument("--document", default=None, help="a text file to ingest instead of the built-in example")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="most tokens per reply")
    args = parser.parse_args()

    document = open(args.document, encoding="utf-8").read() if args.document else DOCUMENT
    # AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False), also for Flash.
    tokenizer = load_tokenizer(args.model_path)
    # chat_format builds inputs; parser extracts reasoning and tool calls.
    chat_format, parser = load_chat_format(
        args.model_path, tokenizer=tokenizer, chat_template_kwargs={"enable_thinking": False}
    )
    client = NativeClient(args.url, api_key=os.environ.get("MEMT_API_KEY"))

    with MemTSession(client, chat_format, parser) as document_session:
        print(f"session {document_session.session_id}: ingesting a document of {len(document)} characters")
        result = document_session.ingest(document)
        print(f"ingested {result['tokens']} tokens in {result['chunks']} chunk(s) of at most "
              f"{document_session.chunk_tokens} tokens")
        question = "What are my kitten's name, age, favorite food, and special trait?"
        print(f"user: {question}")
        print("assistant:", document_session.chat(question, max_new_tokens=args.max_new_tokens))
    client.close()


if __name__ == "__main__":
    main()
