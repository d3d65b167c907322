"""The spec's instruction for Flash, ``AutoTokenizer.from_pretrained(path, tokenizer_type="deepseek_v4")``, works as documented."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SNIPPET = textwrap.dedent('''
    import sys
    from transformers import AutoTokenizer
    from memt_core.client import load_chat_format, load_tokenizer

    path = sys.argv[1]
    tokenizer = AutoTokenizer.from_pretrained(path, tokenizer_type="deepseek_v4", local_files_only=True, trust_remote_code=False)
    reference = load_tokenizer(path)
    text = "Hello, Flash! 東京 🦐"
    assert tokenizer.encode(text) == reference.encode(text), (tokenizer.encode(text), reference.encode(text))
    chat_format, parser = load_chat_format(path, tokenizer=tokenizer)
    print("ok", type(tokenizer).__name__, len(tokenizer))
''')


def test_the_documented_flash_tokenizer_call_works(flash_checkpoint):
    """The README/spec order: ``from transformers import AutoTokenizer`` first, then the client, then the call."""
    run = subprocess.run([sys.executable, "-c", SNIPPET, str(flash_checkpoint)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("ok ")


def test_without_the_registration_transformers_refuses_the_name(flash_checkpoint):
    """What the registration fixes (and proof this test can fail): plain transformers does not know the name."""
    plain = textwrap.dedent('''
        import sys
        from transformers import AutoTokenizer
        try:
            AutoTokenizer.from_pretrained(sys.argv[1], tokenizer_type="deepseek_v4", local_files_only=True)
        except ValueError as exc:
            print("refused", "deepseek_v4" in str(exc))
    ''')
    run = subprocess.run([sys.executable, "-c", plain, str(flash_checkpoint)], capture_output=True, text=True, timeout=300)
    assert run.stdout.strip() == "refused True", run.stderr[-2000:]
