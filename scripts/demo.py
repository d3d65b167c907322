#!/usr/bin/env python
"""The MemT serve demo: latent memory for an unchanged OpenAI SDK app, on a laptop CPU.

Starts the OpenAI-compatible proxy with the MemT core (engine and memt-http-v1 server) inside it, on the
bundled tiny demo model (one process, ``python -m memt_proxy --embedded``; with ``--two-process`` the
core and the proxy run as two processes talking HTTP, the deployment that scales out), then holds a short conversation through the official ``openai`` SDK. The app resends its whole
history each turn, as chat apps do; the proxy commits each completed turn to the session's latent
memory and sends the model only what memory does not hold. The model then answers questions about
earlier turns from memory alone — and no longer can once the session's memory is reset. Finally a tool
call round trip. Everything runs on 127.0.0.1 and stops at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from openai import OpenAI

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(args: list[str], url: str, log: Path, what: str, timeout: float = 180.0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    process = subprocess.Popen([sys.executable, *args], stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"{what} exited early; its log:\n{log.read_text()}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    process.kill()
    raise SystemExit(f"{what} did not become healthy in time; its log:\n{log.read_text()}")


def say(text: str = "") -> None:
    print(text, flush=True)


def weather(city: str) -> str:
    """The demo's tool: a made-up forecast, as plain text (the model also reads JSON results)."""
    return "21 degrees and sunny"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-path", default=None, help="checkpoint to serve (default: the bundled tiny demo model)")
    parser.add_argument("--name", default="Belkavo", help="the name the user tells the model (any name: it is copied through memory)")
    parser.add_argument("--city", default="Lisbon", help="the city the user tells the model")
    parser.add_argument("--food", default="sushi", help="the favourite food the user tells the model")
    parser.add_argument("--two-process", action="store_true", help="run the core and the proxy as two processes (the scale-out deployment) instead of one")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="memt-demo-"))
    core_port, proxy_port = free_port(), free_port()
    core_url, proxy_url = f"http://127.0.0.1:{core_port}", f"http://127.0.0.1:{proxy_port}"
    model = ["--model-path", args.model_path] if args.model_path else []
    processes = []
    try:
        snapshots = ["--state-directory", str(work / "state")]
        if args.two_process:
            say("1. Starting the MemT core server (memt-http-v1) on the bundled tiny model, CPU only ...")
            processes.append(start(["-m", "memt_core.launch", *model, "--port", str(core_port), *snapshots], core_url, work / "core.log", "the core server"))
            identity = httpx.get(core_url + "/memt/identity").json()
            say(f"   serving {identity['model']} (checkpoint {identity['checkpoint_id']}) at {core_url}")
            say("2. Starting the OpenAI-compatible proxy in front of it ...")
            processes.append(start(["-m", "memt_proxy", "--upstream", core_url, *model, "--port", str(proxy_port)], proxy_url, work / "proxy.log", "the proxy"))
        else:
            say("1-2. Starting the OpenAI-compatible proxy with the MemT core inside it (one process, --embedded), CPU only ...")
            processes.append(start(["-m", "memt_proxy", "--embedded", "--core-args", shlex.join(snapshots), *model, "--port", str(proxy_port)],
                                   proxy_url, work / "proxy.log", "the proxy"))
        say(f"   OpenAI base_url = {proxy_url}/v1")

        client = OpenAI(base_url=proxy_url + "/v1", api_key="demo")
        model_name = client.models.list().data[0].id
        session = f"demo-{uuid.uuid4().hex[:8]}"
        headers = {"X-MemT-Session": session}
        history: list[dict] = []

        def turn(text: str, **extra) -> str:
            history.append({"role": "user", "content": text})
            reply = client.chat.completions.create(model=model_name, messages=history, temperature=0, max_tokens=64, extra_headers=headers, **extra)
            answer = reply.choices[0].message.content
            history.append({"role": "assistant", "content": answer})
            say(f"   user:  {text}")
            say(f"   model: {answer}")
            say(f"          (the app sent {len(history) - 1} messages; the model's prompt held {reply.usage.prompt_tokens} tokens)")
            return answer

        say(f"\n3. A conversation through the OpenAI SDK, session {session!r}, memory policy 'auto' (the proxy's default).")
        say("   The app resends its whole history every turn; each completed turn is committed to latent memory.")
        turn(f"Hi, my name is {args.name} and I live in {args.city}. My favourite food is {args.food}.")
        turn("How are you?")
        say("\n4. Questions about turn 1. The app still sends the full history, but the proxy trims every message that is")
        say("   already in memory, so the model sees only the new question: the answers come from latent memory.")
        answers = [turn("What is my name?"), turn("Where do I live?"), turn("What is my favourite food?")]
        recalled = sum(value.lower() in answer.lower() for value, answer in zip((args.name, args.city, args.food), answers))
        say(f"   -> recalled {recalled} of 3 facts from memory")
        name_known = args.name.lower() in answers[0].lower()
        say(f"   -> the name {args.name} was {'recalled' if name_known else 'NOT recalled'} from memory")
        state = httpx.get(f"{proxy_url}/v1/memt/sessions/{session}").json()
        say(f"   the session holds {state['committed_messages']} committed messages; published memory version {state['native']['published_version']}")

        say("\n5. Resetting the session's memory (POST /v1/memt/sessions/{id}/reset) and asking again, with a fresh transcript:")
        httpx.post(f"{proxy_url}/v1/memt/sessions/{session}/reset").raise_for_status()
        history.clear()
        after = turn("What is my name?")
        say(f"   -> the name is {'STILL' if args.name.lower() in after.lower() else 'no longer'} known: memory, not the weights, carried it")

        say("\n6. A tool call round trip (stateless, no session): the model calls get_weather, the app runs it, the model answers.")
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in a city.",
                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
        messages = [{"role": "user", "content": f"What is the weather in {args.city}?"}]
        first = client.chat.completions.create(model=model_name, messages=messages, tools=tools, temperature=0, max_tokens=64)
        choice = first.choices[0]
        say(f"   user:  {messages[0]['content']}")
        if choice.message.tool_calls:
            call = choice.message.tool_calls[0]
            say(f"   model: calls {call.function.name}({call.function.arguments})   finish_reason={choice.finish_reason}")
            result = weather(json.loads(call.function.arguments).get("city", args.city))
            say(f"   tool:  {result}")
            messages += [choice.message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": result}]
            final = client.chat.completions.create(model=model_name, messages=messages, tools=tools, temperature=0, max_tokens=64)
            say(f"   model: {final.choices[0].message.content}")
        else:
            say(f"   model: {choice.message.content}  (no tool call this time)")
        say("\nDone. The bundled model is a tiny test model trained for these skills only; it is not a general assistant.")
        return 0
    finally:
        for process in reversed(processes):
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    sys.exit(main())
