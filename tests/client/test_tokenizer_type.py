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


def test_loading_a_memt_tokenizer_as_the_readme_does_prints_no_warning():
    """transformers used to warn that a ``memt_*`` model was instantiated as a model of type ``""``."""
    from memt_core.bundled import BUNDLED_MODEL

    snippet = textwrap.dedent('''
        import sys
        from transformers import AutoTokenizer
        from memt_core.client import load_chat_format
        tokenizer = AutoTokenizer.from_pretrained(sys.argv[1], local_files_only=True, trust_remote_code=False)
        load_chat_format(sys.argv[1], tokenizer=tokenizer, chat_template_kwargs={"enable_thinking": False})
        print("ok")
    ''')
    run = subprocess.run([sys.executable, "-c", snippet, str(BUNDLED_MODEL)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]
    assert "instantiate a model of type" not in run.stderr and "Warning" not in run.stderr, run.stderr[-2000:]
