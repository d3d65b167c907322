#!/usr/bin/env python
"""The OpenAI-compatible proxy against the native client, side by side in one run.

Starts a memt_core server and ``python -m memt_proxy`` in front of it (a tiny random Nano checkpoint
unless ``--model-path``), then plays one multi-turn conversation three ways, interleaved turn by turn
(rotating which goes first):

* through the proxy with the official ``openai`` SDK, as an unchanged app does: the whole history is
  resent every turn, ``X-MemT-Session`` + ``X-MemT-Memory: auto``;
* through the proxy with the same requests posted as JSON by ``httpx`` (a second proxy session): the
  proxy's own cost without the SDK's client-side request building, which grows with the history;
* directly through the native client (``NativeClient`` raw calls: acquire, query, begin, commit,
  publish, release), with the same user messages, sampling (temperature, seed per turn, stop strings)
  and max tokens, and the same transcript handling as the proxy (committed messages leave the prompt,
  uncommitted earlier ones are sent as context and committed with the next completed turn, a reply
  cut by a stop string is committed as the text returned plus the end token). All paths therefore
  send the model the same prompt ids, write the same memory and get the same replies, so the
  differences are the proxy's own cost (the extra HTTP hop, validation, hashing, templating, and its
  upstream calls made with ``AsyncNativeClient`` where the native path uses ``NativeClient``) and,
  for the first path, the SDK's.

Prints the median latency per request of each and the added latency per request (median of the
per-turn differences); the overhead at the median is that added latency over the native median,
against the target (≤ 5 %); the ratio of the medians is printed beside it. Then the prompt tokens
per turn over the conversation for the app resending its full history, with memory (the session) and
without (no session header), against the target (flat with memory).

    PYTHONPATH=. python scripts/bench/proxy.py                        # 40 turns on a tiny random Nano
    PYTHONPATH=. python scripts/bench/proxy.py --turns 12 --max-tokens 256 --no-stop   # longer replies
    PYTHONPATH=. python scripts/bench/proxy.py --turns 50 --max-tokens 64 --model-path CHECKPOINT --device cuda
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
TARGET_OVERHEAD = 0.05
FLAT_FACTOR = 1.5  # "flat": no turn's prompt exceeds FLAT_FACTOR x the first turn's (truncated turns add their context once)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def start(command: list[str], url: str, log: Path, timeout: float = 300.0) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    with open(log, "ab") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise SystemExit(f"{command[2]} exited with {process.returncode}; log: {log}\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise SystemExit(f"{command[2]} did not come up within {timeout:.0f} s; log: {log}")
        time.sleep(0.1)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()


def user_message(turn: int) -> str:
    return f"Turn {turn}: tell me something about item number {turn * 7 + 3}, please."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model-path", default=None, help="checkpoint to serve (default: a tiny random Nano checkpoint made in a temp dir)")
    parser.add_argument("--device", default="cpu", help="memt_core --device")
    parser.add_argument("--turns", type=int, default=40, help="turns of the conversation")
    parser.add_argument("--max-tokens", type=int, default=32, help="max tokens per reply")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (seed = turn number)")
    parser.add_argument("--stop", action="append", default=None, help="stop string(s) ending a reply (default: ' ' and 'e', so a random model completes its turns)")
    parser.add_argument("--plain-requests", type=int, default=60, help="also time this many stateless requests (no session) each way: native generate, proxy over HTTP, proxy through the SDK")
    parser.add_argument("--no-stop", action="store_true", help="no stop strings: replies run to the end token or --max-tokens (truncated turns are not committed)")
    args = parser.parse_args(argv)
    stops = [] if args.no_stop else (args.stop if args.stop is not None else [" ", "e"])

    from openai import OpenAI

    from memt_core.client.chat_format import load_chat_format, load_tokenizer
    from memt_core.client.native import NativeClient

    work = Path(tempfile.mkdtemp(prefix="memt-bench-proxy-"))
    if args.model_path:
        model_path = Path(args.model_path)
    else:
        from memt_core.tiny import make_tiny_checkpoint

        model_path = make_tiny_checkpoint(work / "nano", "memt-nano")
    core_port, proxy_port = free_port(), free_port()
    core_url, proxy_url = f"http://{HOST}:{core_port}", f"http://{HOST}:{proxy_port}"
    core = start([sys.executable, "-m", "memt_core.launch", "--model-path", str(model_path), "--host", HOST, "--port", str(core_port),
                  "--state-directory", str(work / "state"), "--device", args.device, "--log-level", "warning"], core_url, work / "core.log")
    proxy = raw = None
    try:
        proxy = start([sys.executable, "-m", "memt_proxy", "--upstream", core_url, "--model-path", str(model_path), "--host", HOST,
                       "--port", str(proxy_port), "--log-level", "warning"], proxy_url, work / "proxy.log")
        openai = OpenAI(base_url=proxy_url + "/v1", api_key="unused", max_retries=0)
        model = openai.models.list().data[0].id
        chat_format, output_parser = load_chat_format(model_path, tokenizer=load_tokenizer(model_path))
        native = NativeClient(core_url)
        native_session = native.control("create", "bench-native", memory_read=True)["session"]
        native_state = {"history": [], "committed": 0}
        eos = chat_format.tokenizer.eos_token_id
        print(f"MemT proxy benchmark: {model} ({model_path}), device {args.device}, {args.turns} turns, "
              f"max_tokens {args.max_tokens}, temperature {args.temperature}, stop {stops!r}")

        def via_proxy(history: list[dict], turn: int, headers: dict) -> tuple[float, object]:
            started = time.perf_counter()
            response = openai.chat.completions.create(
                model=model, messages=history, max_tokens=args.max_tokens, temperature=args.temperature, seed=turn,
                stop=stops or None, extra_headers=headers,
            )
            return time.perf_counter() - started, response

        raw = httpx.Client(base_url=proxy_url, timeout=600)

        def via_proxy_http(history: list[dict], turn: int, headers: dict) -> tuple[float, dict]:
            """The same request as raw JSON over HTTP: the proxy's cost without the SDK's own request building."""
            body = {"model": model, "messages": history, "max_tokens": args.max_tokens, "temperature": args.temperature, "seed": turn}
            if stops:
                body["stop"] = stops
            started = time.perf_counter()
            response = raw.post("/v1/chat/completions", json=body, headers=headers)
            elapsed = time.perf_counter() - started
            response.raise_for_status()
            return elapsed, response.json()

        def via_native(turn: int) -> tuple[float, dict]:
            """One turn with the native client, handling the transcript as the proxy does."""
            started = time.perf_counter()
            history = native_state["history"] + [{"role": "user", "content": user_message(turn)}]
            context_ids = chat_format.history_ids(history[native_state["committed"]:-1])
            turn_ids = chat_format.open_turn_ids(history[-1:], enable_thinking=False)
            prompt = list(chat_format.bos_ids) + chat_format.system_ids(None, None) + context_ids + turn_ids
            sampling = {"max_new_tokens": args.max_tokens, "temperature": args.temperature, "seed": turn}
            if stops:
                sampling["stop"] = stops
            lease = native.control("acquire", native_session, ttl=600)["lease"]
            try:
                body = native.query(native_session, lease, prompt, sampling_params=sampling)
                output = body["output_ids"]
                text = chat_format.decode(output)
                cut = min((at for at in (text.find(stop) for stop in stops) if at >= 0), default=-1)
                stopped = cut >= 0
                if stopped:
                    text = text[:cut]
                finish = "stop" if stopped or (body["meta_info"].get("finish_reason") or {}).get("type") == "stop" else "length"
                content = output_parser.parse(text).content
                if finish == "stop":
                    reply = output if not stopped or (output and output[-1] in chat_format.end_ids) else chat_format._encode(text) + [eos]
                    transaction = f"t-{turn}"
                    native.control("begin", native_session, lease=lease, transaction=transaction)
                    if context_ids:
                        native.commit(native_session, lease, transaction, context_ids)
                    native.commit(native_session, lease, transaction, turn_ids + reply)
                    native.control("publish", native_session, lease=lease, transaction=transaction)
            finally:
                native.control("release", native_session, lease=lease)
            native_state["history"] = history + [{"role": "assistant", "content": content}]
            if finish == "stop":
                native_state["committed"] = len(native_state["history"])
            elapsed = time.perf_counter() - started
            return elapsed, {"prompt_tokens": len(prompt), "completion_tokens": len(output), "finish_reason": finish, "content": content}

        # ---- one conversation, three ways (two proxy sessions), interleaved in rotating order
        headers = {"X-MemT-Session": "bench-proxy", "X-MemT-Memory": "auto"}
        http_headers = {"X-MemT-Session": "bench-proxy-http", "X-MemT-Memory": "auto"}
        history: list[dict] = []
        http_history: list[dict] = []
        rows = []
        for turn in range(args.turns):
            history.append({"role": "user", "content": user_message(turn)})
            http_history.append(history[-1])
            for which in ("sdk", "http", "native")[turn % 3:] + ("sdk", "http", "native")[: turn % 3]:
                if which == "sdk":
                    proxy_s, response = via_proxy(history, turn, headers)
                elif which == "http":
                    http_s, http_body = via_proxy_http(http_history, turn, http_headers)
                else:
                    native_s, result = via_native(turn)
            history.append({"role": "assistant", "content": response.choices[0].message.content})
            http_history.append({"role": "assistant", "content": http_body["choices"][0]["message"]["content"]})
            rows.append({
                "turn": turn, "proxy_s": proxy_s, "native_s": native_s, "http_s": http_s,
                "same_http": http_body["choices"][0]["message"]["content"] == response.choices[0].message.content,
                "proxy_prompt": response.usage.prompt_tokens, "native_prompt": result["prompt_tokens"],
                "proxy_out": response.usage.completion_tokens, "native_out": result["completion_tokens"],
                "proxy_finish": response.choices[0].finish_reason, "native_finish": result["finish_reason"],
                "same_reply": (response.choices[0].message.content or "") == result["content"],
            })
        native.control("close", native_session, lease=native.control("acquire", native_session, ttl=60)["lease"])

        # ---- plain chat without a session, many times each way: the proxy's fixed cost per request
        plain_pairs = []
        messages = [{"role": "user", "content": user_message(1)}]
        order = ("proxy", "sdk", "native")
        for index in range(args.plain_requests):
            sampling = {"max_new_tokens": args.max_tokens, "temperature": args.temperature, "seed": index, **({"stop": stops} if stops else {})}
            timings = {}
            for which in order[index % 3:] + order[: index % 3]:
                started = time.perf_counter()
                if which == "proxy":
                    via_proxy_http(messages, index, {})
                elif which == "sdk":
                    via_proxy(messages, index, {})
                else:
                    native.generate(chat_format.conversation_ids(messages, enable_thinking=False), sampling_params=sampling)
                timings[which] = time.perf_counter() - started
            plain_pairs.append(timings)

        # ---- the same app without a session: the whole history reaches the model every turn
        plain: list[dict] = []
        stateless_prompts = []
        for turn in range(args.turns):
            plain.append({"role": "user", "content": user_message(turn)})
            _, response = via_proxy(plain, turn, {})
            stateless_prompts.append(response.usage.prompt_tokens)
            plain.append({"role": "assistant", "content": response.choices[0].message.content})
    finally:
        if raw is not None:
            raw.close()
        if proxy is not None:
            stop(proxy)
        stop(core)

    # ---- report
    timed = rows[1:]  # turn 0 includes session creation and first-use costs on both sides
    proxy_ms = statistics.median(r["proxy_s"] for r in timed) * 1000
    native_ms = statistics.median(r["native_s"] for r in timed) * 1000
    http_ms = statistics.median(r["http_s"] for r in timed) * 1000
    added_ms = statistics.median((r["proxy_s"] - r["native_s"]) for r in timed) * 1000
    http_added_ms = statistics.median((r["http_s"] - r["native_s"]) for r in timed) * 1000
    same_prompt = sum(r["proxy_prompt"] == r["native_prompt"] for r in rows)
    same_output = sum(r["same_reply"] and r["proxy_out"] == r["native_out"] for r in rows)
    sdk_share_ms = statistics.median((r["proxy_s"] - r["http_s"]) for r in timed) * 1000
    # the verdict uses the paired estimate: each turn's three requests ran back to back, so their
    # differences cancel the machine's drift, which the ratio of two separate medians does not
    overhead = http_added_ms / native_ms
    sdk_overhead = added_ms / native_ms
    print()
    print(f"latency per request, median over turns 1..{args.turns - 1} (interleaved, rotating order):")
    print(f"  native client (raw calls, memory on)               {native_ms:8.1f} ms")
    print(f"  proxy, the request as JSON over HTTP (httpx)       {http_ms:8.1f} ms   added {http_added_ms:+.1f} ms (median of per-turn differences)")
    print(f"  proxy, the same through the openai SDK             {proxy_ms:8.1f} ms   added {added_ms:+.1f} ms, of which the SDK's own {sdk_share_ms:+.1f} ms")
    print(f"  the proxy's overhead at the median (added / native): {100 * overhead:+.1f} %"
          f"  (ratio of the medians {http_ms / native_ms:.3f}); through the SDK {100 * sdk_overhead:+.1f} % (ratio {proxy_ms / native_ms:.3f})")
    print("  (the SDK's share is its client-side request building, which grows with the history it is given:"
          " an app pays it against any OpenAI-compatible server; 'SDK − HTTP' above, the same proxy both times)")
    print(f"  target: the proxy's overhead <= {100 * TARGET_OVERHEAD:.0f} % at the median -> {'MET' if overhead <= TARGET_OVERHEAD else 'NOT MET'}"
          f" (through the SDK, its own cost included: {'within' if sdk_overhead <= TARGET_OVERHEAD else 'over'} {100 * TARGET_OVERHEAD:.0f} %)")
    print(f"  the HTTP and SDK sessions gave the same reply in {sum(r['same_http'] for r in rows)}/{len(rows)} turns")
    print(f"  same prompt size on both paths in {same_prompt}/{len(rows)} turns, same reply in {same_output}/{len(rows)};"
          f" mean completion {statistics.mean(r['proxy_out'] for r in rows):.1f} tokens;"
          f" completed turns (finish stop) proxy {sum(r['proxy_finish'] == 'stop' for r in rows)}, native {sum(r['native_finish'] == 'stop' for r in rows)}")
    if plain_pairs:
        n_ms = statistics.median(t["native"] for t in plain_pairs) * 1000
        p_ms = statistics.median(t["proxy"] for t in plain_pairs) * 1000
        d_ms = statistics.median(t["proxy"] - t["native"] for t in plain_pairs) * 1000
        s_ms = statistics.median(t["sdk"] - t["native"] for t in plain_pairs) * 1000
        print(f"stateless chat (no session, one message), median of {len(plain_pairs)} interleaved triples: native generate {n_ms:.1f} ms,"
              f" proxy over HTTP {p_ms:.1f} ms, added {d_ms:+.1f} ms ({100 * d_ms / n_ms:+.1f} %); through the SDK added {s_ms:+.1f} ms")
    print()
    print("prompt tokens per turn, app resending its full history:")
    print("  turn  with memory  without memory   proxy ms  native ms")
    for r, plain_tokens in zip(rows, stateless_prompts):
        print(f"  {r['turn']:4d}  {r['proxy_prompt']:11d}  {plain_tokens:14d}   {r['proxy_s'] * 1000:8.1f}  {r['native_s'] * 1000:9.1f}")
    memory = [r["proxy_prompt"] for r in rows]
    flat = max(memory) <= FLAT_FACTOR * memory[0]
    print(f"  with memory: first {memory[0]}, max {max(memory)}, last {memory[-1]}, median {statistics.median(memory):.0f}")
    print(f"  without memory: first {stateless_prompts[0]}, last {stateless_prompts[-1]} (x{stateless_prompts[-1] / stateless_prompts[0]:.1f})")
    print(f"  target: flat with memory (every turn <= {FLAT_FACTOR} x the first) -> {'MET' if flat else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
