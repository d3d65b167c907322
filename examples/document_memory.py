"""Document ingestion: write a document into a session's latent memory, then ask about it.

The document is committed in chunk_tokens pieces in one transaction; the questions' prompts do not
contain the document, only memory does. Each answered question is committed too, so every prompt
holds just its own question.

    python examples/document_memory.py memt_core/bundled/memt-tiny-demo --url http://127.0.0.1:30000
    python examples/document_memory.py /models/MemT-1.0-Nano --document FILE --question "..." [--question ...]

The built-in document is a short company profile, the kind of document the bundled demo model was
trained on (it answers where the company is based, when it was founded, how many people work there);
with your own --document and --question use a real checkpoint. Replies are greedy (--temperature 0)
unless you say otherwise. Reads MEMT_API_KEY (sent as a Bearer token) when the server requires one.
"""

import argparse
import os
import sys

from memt_core.client import MemTSession, NativeClient, load_chat_format, load_tokenizer

DOCUMENT = (
    "Apex Books is a company based in Marrakesh. The company makes toys. "
    "It was founded in 1962. It has 6396 employees."
)
QUESTIONS = ("Where is Apex Books based?", "When was Apex Books founded?", "How many employees does Apex Books have?")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_path", help="local checkpoint directory of the served model (Nano or Flash)")
    parser.add_argument("--url", default="http://127.0.0.1:30000", help="server address")
    parser.add_argument("--document", default=None, help="a text file to ingest instead of the built-in company profile")
    parser.add_argument("--question", action="append", default=None,
                        help="a question about the document (repeatable; default: three about the built-in profile)")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="most tokens per reply")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    args = parser.parse_args()
    if args.document and not args.question:
        parser.error("with --document, say what to ask with --question")

    document = open(args.document, encoding="utf-8").read() if args.document else DOCUMENT
    questions = args.question or QUESTIONS
    # AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False), also for Flash.
    tokenizer = load_tokenizer(args.model_path)
    # chat_format builds inputs; parser extracts reasoning and tool calls.
    chat_format, parser = load_chat_format(
        args.model_path, tokenizer=tokenizer, chat_template_kwargs={"enable_thinking": False}
    )
    client = NativeClient(args.url, api_key=os.environ.get("MEMT_API_KEY"))
    if args.document and client.identity().get("extra", {}).get("bundled_demo_model"):
        print("note: the server runs the bundled demo model, which only knows short company profiles like the "
              "built-in one; expect nonsense about other documents (serve a real checkpoint for them)", file=sys.stderr)
    sampling = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}

    with MemTSession(client, chat_format, parser) as document_session:
        print(f"session {document_session.session_id}: ingesting a document of {len(document)} characters")
        result = document_session.ingest(document)
        print(f"ingested {result['tokens']} tokens in {result['chunks']} chunk(s) of at most "
              f"{document_session.chunk_tokens} tokens")
        for question in questions:
            print(f"user: {question}")
            print("assistant:", document_session.chat(question, enable_memory=True, **sampling))
    client.close()


if __name__ == "__main__":
    main()
