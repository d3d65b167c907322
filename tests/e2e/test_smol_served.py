"""The memt-smol family served end to end: the real core and proxy on a tiny random Llama checkpoint, the real
``openai`` SDK with and without ``X-MemT-Session``, streaming, and the native client's memory session.

The family runs on the same engine, proxy and protocol as Nano and Flash; its engine decodes with the model
(the fused step is Nano's), and its prompts carry SmolLM2's default system prompt once, at the start.
"""

from __future__ import annotations

import pytest

from e2e.proxies import ProxyServer
from e2e.servers import MemTServer

MODEL = "tiny-random-smol"
STOPS = [" ", "e"]


@pytest.fixture(scope="module")
def smol_stack(smol_checkpoint, tmp_path_factory):
    core = MemTServer(smol_checkpoint, state_directory=tmp_path_factory.mktemp("smol-state")).start()
    proxy = ProxyServer(core.url, smol_checkpoint).start()
    yield core, proxy
    proxy.stop()
    core.close()


def test_identity_names_the_family(smol_stack):
    core, _ = smol_stack
    with core.client() as http:
        identity = http.get("/memt/identity").json()
    assert identity["model"] == "memt-smol"


def test_openai_sdk_named_session_reads_only_the_new_message(smol_stack):
    _, proxy = smol_stack
    from openai import OpenAI

    client = OpenAI(base_url=proxy.base_url, api_key="unused")
    header = {"X-MemT-Session": "smol-alice"}
    history = [{"role": "user", "content": "Hi, my name is Alice."}]
    # stop strings frequent in the random model's text end the answer ("stop"): a named session commits a finished turn
    first = client.chat.completions.create(model=MODEL, messages=history, max_tokens=24, temperature=0, stop=STOPS,
                                           extra_headers=header)
    assert first.choices[0].finish_reason == "stop"
    history += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "Who am I?"}]
    second = client.chat.completions.create(model=MODEL, messages=history, max_tokens=8, temperature=0, extra_headers=header)
    stateless = client.chat.completions.create(model=MODEL, messages=history, max_tokens=8, temperature=0,
                                               extra_headers={"X-MemT-Memory": "off"})
    # the trimmed prompt holds the system block and the new question only: fewer tokens than the whole transcript
    assert second.usage.prompt_tokens < stateless.usage.prompt_tokens
    assert second.choices[0].finish_reason in ("stop", "length")


def test_openai_sdk_without_a_header_and_streaming(smol_stack):
    _, proxy = smol_stack
    from openai import OpenAI

    client = OpenAI(base_url=proxy.base_url, api_key="unused")
    messages = [{"role": "user", "content": "Tell me about the sea."}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    pieces = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0, stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in pieces if chunk.choices)
    assert streamed == whole.choices[0].message.content


def test_native_memory_session(smol_stack, smol_checkpoint):
    core, _ = smol_stack
    from memt_core.client import MemTSession, NativeClient, load_chat_format
    from memt_core.tokenizer import load_tokenizer

    chat_format, parser = load_chat_format(smol_checkpoint, tokenizer=load_tokenizer(smol_checkpoint))
    with MemTSession(NativeClient(core.url), chat_format, parser) as session:
        session.chat("My kitten is called Memmy.", enable_memory=True, temperature=0, max_new_tokens=6)
        answer = session.chat("What is my kitten called?", temperature=0, max_new_tokens=6)
    assert isinstance(answer, str)
