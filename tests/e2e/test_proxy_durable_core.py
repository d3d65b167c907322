"""A proxy in front of one core with a durable snapshot store, across a crash of the core.

The core restarts (SIGKILL, new epoch) and restores each session's latest published version from
``--snapshot-store`` when the proxy creates it again (``restored_version``). The proxy must adopt that
version and keep trimming from its record, not take the session for a fresh one (it would resend and
commit the whole transcript, so memory would hold it twice).
"""

from __future__ import annotations


import openai

from e2e.proxies import STOPS, ProxyServer, expected_prompt, unique
from e2e.servers import MemTServer

MODEL = "tiny-random-nano"


class Conversation:
    """An app resending its whole history each turn on one session (completed turns only)."""

    def __init__(self, proxy):
        self.client, self.session, self.messages = proxy.openai(timeout=120), unique("durable"), []

    def turn(self, text: str) -> tuple[list[dict], int]:
        """One turn; returns the messages sent and the prompt's token count."""
        sent = [*self.messages, {"role": "user", "content": text}]
        completion = self.client.chat.completions.create(
            model=MODEL, messages=sent, max_tokens=24, stop=STOPS, seed=len(self.messages), extra_headers={"X-MemT-Session": self.session},
        )
        assert completion.choices[0].finish_reason == "stop"
        self.messages = [*sent, {"role": "assistant", "content": completion.choices[0].message.content}]
        return sent, completion.usage.prompt_tokens


def test_a_crashed_durable_core_comes_back_with_the_session_trimmed(nano_checkpoint, proxy_chat_format, tmp_path):
    core = MemTServer(nano_checkpoint, args=["--snapshot-store", str(tmp_path / "store")]).start()
    try:
        with ProxyServer(core.url, nano_checkpoint, args=["--state-directory", str(tmp_path / "proxy")]) as proxy:
            app = Conversation(proxy)
            turn, session = app.turn, app.session

            turn("My name is Ann.")
            turn("I live in Oslo.")
            assert proxy.inspect(session)["native"]["published_version"] == 2  # inspect waits for the turn's commit
            core.restart(kill=True)
            try:  # the proxy learns of the new epoch from this request (an error it may answer), then starts over
                sent, prompt_tokens = turn("Where do I live?")
            except openai.APIStatusError as exc:
                assert exc.status_code in (409, 503), exc
                sent, prompt_tokens = turn("Where do I live?")
            assert prompt_tokens == len(expected_prompt(proxy_chat_format, sent, len(sent) - 1)), "the transcript was not trimmed"
            seen = proxy.inspect(session)
            assert seen["native"]["published_version"] == 3 and seen["history_known"] and seen["committed_messages"] == 6, seen
    finally:
        core.close()


def test_a_session_its_core_unloaded_while_idle_continues_trimmed(nano_checkpoint, proxy_chat_format, tmp_path):
    """A core with a snapshot store unloads sessions idle without a lease (``--unload-idle``); the proxy's next
    request finds the session gone (a 409 on acquire), creates it again (restored from the store) and goes on
    with what it knew: the same version, the transcript still trimmed. A drain hands sessions off the same way."""
    core = MemTServer(nano_checkpoint, args=["--snapshot-store", str(tmp_path / "store"), "--unload-idle", "1"]).start()
    try:
        with ProxyServer(core.url, nano_checkpoint, args=["--lease-idle", "0"]) as proxy:
            app = Conversation(proxy)
            turn, session = app.turn, app.session

            turn("My name is Ann.")
            core.wait_unloaded(proxy.inspect(session)["native"]["session"], timeout=60)  # a second after the lease went
            sent, prompt_tokens = turn("Where do I live?")
            assert prompt_tokens == len(expected_prompt(proxy_chat_format, sent, len(sent) - 1)), "the transcript was not trimmed"
            seen = proxy.inspect(session)
            assert seen["native"]["published_version"] == 2 and seen["history_known"] and seen["committed_messages"] == 4, seen
    finally:
        core.close()
