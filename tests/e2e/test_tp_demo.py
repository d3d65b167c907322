"""The bundled demo model served with ``--tp-size 2`` on the CPU, behind the unchanged proxy and OpenAI SDK: the same
greedy answers as one rank, turn after turn of a session whose memory is written between turns. (Snapshots moving
between TP 2 and TP 1: tests/parallel/test_tp_engine.py.)"""

from __future__ import annotations

import pytest
from e2e.proxies import DEMO_PATH, ProxyServer
from e2e.servers import MemTServer

pytestmark = pytest.mark.timeout(600)

TURNS = ["My name is Ada.", "What is my name?", "Say hello."]


def conversation(proxy: ProxyServer, session: str) -> list[str]:
    client = proxy.openai(key="none")
    history, answers = [], []
    for text in TURNS:
        history.append({"role": "user", "content": text})
        reply = client.chat.completions.create(model=client.models.list().data[0].id, messages=history, max_tokens=16, temperature=0,
                                               extra_headers={"X-MemT-Session": session})
        answers.append(reply.choices[0].message.content)
        history.append({"role": "assistant", "content": answers[-1]})
    return answers


def test_the_demo_on_two_ranks_answers_as_on_one_behind_the_proxy(tmp_path):
    cores = {tp: MemTServer(DEMO_PATH, state_directory=tmp_path / f"tp{tp}", args=["--tp-size", str(tp)]).start() for tp in (1, 2)}
    try:
        answers = {}
        for tp, core in cores.items():
            with ProxyServer(core.url, DEMO_PATH) as proxy:
                answers[tp] = conversation(proxy, "ada")
        assert answers[2] == answers[1] and all(answers[1]), answers
    finally:
        for core in cores.values():
            core.close()
