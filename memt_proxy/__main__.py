"""``python -m memt_proxy``: an OpenAI-compatible server that gives chat apps latent memory."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
from pathlib import Path

from memt_core.checkpoint import read_checkpoint
from memt_core.errors import CheckpointError
from memt_core.help_format import DefaultsOnce
from memt_proxy.http.route_inputs import DEFAULT_BODY_TIMEOUT, DEFAULT_MAX_REQUEST_BYTES
from memt_proxy.responses.records import SNAPSHOTS_PER_CHAIN
from memt_proxy.session.sessions import LEASE_IDLE, MAX_SESSIONS
from memt_proxy.session.state import MEMORY_STATES_BUDGET_MIB, state_bytes, states_within


def lease_ttl(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole seconds, got {text!r}") from None
    if not 3 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"must be between 3 and 3600 seconds, got {value}")
    return value


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m memt_proxy",
        description=(
            "Serve the OpenAI API (chat completions, responses, conversations, models) over a memt_core server, "
            "with latent memory: a request naming 'X-MemT-Session: <id>' uses that session, one without it is "
            "recognised by its transcript (--headerless-memory); completed turns are committed to memory and later "
            "requests only send the model what memory does not hold yet."
        ),
        formatter_class=DefaultsOnce,
    )
    upstream = parser.add_argument_group("the upstream and its model")
    upstream.add_argument("--upstream", default="http://127.0.0.1:30000", help="base URL of the memt_core server (python -m memt_core.launch)")
    upstream.add_argument("--upstream-api-key", default=os.environ.get("MEMT_API_KEY"), help="Bearer key of the upstream server (default: $MEMT_API_KEY)")
    upstream.add_argument("--model-path", default=None, help="the checkpoint the upstream serves (its tokenizer and chat format are used here); default: the bundled demo model")
    upstream.add_argument("--served-model-name", action="append", default=[], help="model name(s) accepted in requests and listed by /v1/models (default: the checkpoint id, or the directory name; the directory and family names, e.g. memt-nano, are accepted too)")
    upstream.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the upstream server")
    upstream.add_argument("--embedded", action="store_true", help="one process: run the core (engine and memt-http-v1 server) inside the proxy, called in process instead of over HTTP; --upstream is then unused. The two-process deployment (no --embedded) is the one that scales out")
    upstream.add_argument("--core-args", default="", help="with --embedded: flags of python -m memt_core.launch for the embedded core, as one string (e.g. \"--device cpu --max-sessions-per-rank 64 --state-directory /var/memt/snapshots\"); --model-path is shared")
    access = parser.add_argument_group("network and access")
    access.add_argument("--host", default="127.0.0.1", help="address to bind")
    access.add_argument("--port", type=int, default=8000, help="port to bind")
    access.add_argument("--api-key", action="append", default=[], help="accept this Bearer key (tenant 'default'); repeatable")
    access.add_argument("--api-keys-file", default=None, help="JSON object {key: tenant} or lines 'KEY TENANT'; each tenant's sessions are separate")
    access.add_argument("--admin-key", action="append", default=[k for k in [os.environ.get("MEMT_ADMIN_KEY")] if k], help="operator key (Bearer) for node-wide admin: POST /admin/drain and /admin/undrain (--cluster) and, once set, GET /metrics, which no tenant's API key may do (403); repeatable (default: $MEMT_ADMIN_KEY). Without it and without API keys, anyone who reaches the proxy may drain it")
    memory = parser.add_argument_group("memory behaviour")
    memory.add_argument("--default-memory", choices=["auto", "read", "off"], default="auto", help="memory policy when a request has no X-MemT-Memory header: auto = read memory and commit each completed turn, read = read only, off = neither")
    memory.add_argument("--headerless-memory", choices=["on", "off"], default="on", help="on: a request without X-MemT-Session gets memory too, its conversation identified by its own transcript (a resent history resumes from the deepest memory state it matches; nothing is committed until the conversation comes back); off: such requests are plain stateless chat. X-MemT-Memory: off makes one request stateless either way")
    memory.add_argument("--on-divergence", choices=["fork", "error", "branch", "reset", "reject"], default="fork", help="when a named session's request does not continue its memory (a regenerate, an edit, another conversation sent under the same name): fork = answer from the deepest kept state its history reaches (the session keeps the state before each turn) and let the session follow it, or start over from the request's history where none is kept; error = refuse with 409 transcript_diverged. branch, reset and reject are older names (of fork, fork and error)")
    memory.add_argument("--thinking", choices=["on", "off"], default="off", help="thinking mode when a request sets neither reasoning_effort nor chat_template_kwargs.enable_thinking")
    state = parser.add_argument_group("state, records and scale-out")
    state.add_argument("--state-directory", default=None, help="keep each session's record of what its memory holds here, so that a restarted proxy still trims transcripts and continues turns waiting for tool results (default: in memory only; after a restart, resent histories count as edited). Sessions offloaded to make room upstream (their memory exported to a snapshot in the upstream's state directory, restored on their next request) are recorded here too; without it those records live in memory, so after a proxy restart an offloaded session starts with empty memory and its resent transcript is committed again: what memory held beyond the transcript (e.g. a restored snapshot) is lost")
    state.add_argument("--records-directory", default=None, help="keep the per-session records (see --state-directory) here instead: a directory on a filesystem all proxies of a cluster share, so trimming continues on whichever node a session moves to; the Responses API's stored responses and conversations are kept there too, so a chain or conversation continues on any node (default: --state-directory)")
    state.add_argument("--cluster", action="store_true", help="run as one node behind a router (SMG) over cores sharing a --snapshot-store: the session may come as X-SMG-Routing-Key, sessions restored from the store are adopted, POST /admin/drain hands this node's sessions off (see memt_proxy.http.cluster)")
    limits = parser.add_argument_group("limits and timeouts")
    limits.add_argument("--max-sessions", type=positive, default=MAX_SESSIONS, help="session states kept in memory; beyond it the least recently used idle one is dropped (its native session and memory stay upstream; its next request re-reads its record from --state-directory, or without one counts its history as unknown); when all are busy a new session gets 429")
    limits.add_argument("--memory-states-budget", type=positive, default=MEMORY_STATES_BUDGET_MIB, metavar="MIB", help="MiB of the upstream's memory that header-less memory states (--headerless-memory) may hold: each is a native session holding one memory state, an FP32 [heads, key, value] matrix per memory layer (the bundled demo model: 192 KiB, so 2730 states in 512 MiB); the proxy logs the number at start. Past it, or when the upstream has no room for another session, the least recently used idle state is closed, one a later turn has extended before any conversation's latest, which only makes its conversation's next prompt longer (its messages are read as text); closing a conversation's latest state while it is live (used within 10 minutes) is logged. States are never written to snapshots, so they take no disk")
    limits.add_argument("--max-memory-states", type=positive, default=None, help="header-less memory states kept at most, as a count (default: as many as --memory-states-budget holds)")
    limits.add_argument("--response-snapshots", type=positive, default=SNAPSHOTS_PER_CHAIN, help="Responses API: memory snapshots kept per previous_response_id chain, so that continuing one of its last N responses (not the latest) branches from the right memory; an older one is refused with 409")
    limits.add_argument("--lease-wait", type=float, default=30.0, help="seconds a request waits for another request on the same session before 409")
    limits.add_argument("--lease-ttl", type=lease_ttl, default=30, help="seconds of each native session lease; renewed every third of it while a request runs, so a proxy that dies frees its sessions within this time")
    limits.add_argument("--lease-idle", type=float, default=LEASE_IDLE, help="seconds a session keeps its native lease after its last request (renewed meanwhile), so that an active conversation's turns need no acquire and release; 0 releases it after each request")
    limits.add_argument("--max-request-bytes", type=positive, default=DEFAULT_MAX_REQUEST_BYTES, help="largest request body accepted; larger ones get 413 (refused from Content-Length before they are read)")
    limits.add_argument("--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT, help="seconds a client has to send its whole request body before 408")
    limits.add_argument("--header-timeout", type=float, default=10.0, help="seconds a client has, from its first byte, to send a request's headers; the connection is closed past it")
    logging = parser.add_argument_group("logging")
    logging.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log verbosity")
    return parser


def load_api_keys(keys: list[str], path: str | None) -> dict[str, str]:
    """key → tenant, from --api-key (tenant 'default') and --api-keys-file."""
    mapping = {key: "default" for key in keys}
    if path:
        text = Path(path).read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = {}
            for number, line in enumerate(text.splitlines(), start=1):
                line = line.strip()
                if not line or line.startswith("#"):
                    continue
                parts = line.split()
                if len(parts) != 2:
                    raise CheckpointError(f"{path}:{number}: expected 'KEY TENANT'")
                data[parts[0]] = parts[1]
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            raise CheckpointError(f"{path}: expected a JSON object of key → tenant")
        mapping.update(data)
    return mapping


def build_app(args: argparse.Namespace):
    from memt_core.client.chat_format import load_chat_format, load_tokenizer
    from memt_core.client.native import AsyncNativeClient
    from memt_core.bundled import BUNDLED_MODEL
    from memt_proxy.http.app import create_app
    from memt_proxy.responses.records import ResponseRecords
    from memt_proxy.responses.service import ResponsesService
    from memt_proxy.chat.service import ChatService
    from memt_proxy.session.turn import TurnRunner
    from memt_proxy.session.sessions import Sessions
    from memt_proxy.session.store import SessionRecordStore

    path = Path(args.model_path) if args.model_path else BUNDLED_MODEL
    checkpoint = read_checkpoint(path, validate_backbone=False)
    tokenizer = load_tokenizer(path)  # AutoTokenizer alone cannot configure the memt_* model types (Flash)
    chat_format, parser = load_chat_format(path, tokenizer=tokenizer)
    names = args.served_model_name or [checkpoint.served_name]
    # the checkpoint's other names, accepted but not listed: its directory and its family (the CLI's --model)
    aliases = () if args.served_model_name else tuple(sorted({path.name, checkpoint.model} - set(names)))
    core = None
    if args.embedded:
        from memt_proxy.http.embedded import InProcessNativeClient, build_core, core_plan

        plan = core_plan(args.model_path, args.core_args)
        core, core_service = build_core(plan)
        client = InProcessNativeClient(core, service=None if plan.spec_strict else core_service, max_body_bytes=plan.max_request_bytes,
                                       api_key=plan.api_key, timeout=args.timeout)
    else:
        client = AsyncNativeClient(args.upstream, api_key=args.upstream_api_key, timeout=args.timeout)
    max_memory_states = args.max_memory_states or states_within(args.memory_states_budget, checkpoint.memory)
    logging.getLogger("memt.proxy").info(
        "header-less memory states: at most %d (%d KiB each%s)", max_memory_states, state_bytes(checkpoint.memory) // 1024,
        "; --max-memory-states" if args.max_memory_states else f" within --memory-states-budget {args.memory_states_budget} MiB")
    sessions = Sessions(
        client, identity=chat_format.identity, served=chat_format.served, records=SessionRecordStore(args.state_directory, args.records_directory), max_sessions=args.max_sessions, max_memory_states=max_memory_states,
        lease_wait=args.lease_wait, lease_ttl=args.lease_ttl, lease_idle=args.lease_idle, native_encoding=chat_format.native_encoding,
    )
    runner = TurnRunner(sessions, chat_format)  # one turn, run alike for both surfaces
    service = ChatService(
        sessions, chat_format, parser, model_names=names, aliases=aliases, default_memory=args.default_memory,
        default_thinking=args.thinking == "on", on_divergence=args.on_divergence, headerless=args.headerless_memory == "on", runner=runner,
    )
    kept = args.records_directory or args.state_directory  # with --records-directory, every node reads and writes them
    records = ResponseRecords(Path(kept) / "responses" if kept else None, shared=args.records_directory is not None)
    responses = ResponsesService(
        sessions, chat_format, parser, records, model_names=names, aliases=aliases, default_thinking=args.thinking == "on", snapshots_per_chain=args.response_snapshots,
        headerless=args.headerless_memory == "on", runner=runner, default_memory=args.default_memory,
    )
    app = create_app(
        service, api_keys=load_api_keys(args.api_key, args.api_keys_file), max_request_bytes=args.max_request_bytes, body_timeout=args.body_timeout,
        responses=responses, admin_keys=args.admin_key,
    )
    if args.cluster:
        from memt_proxy.http.cluster import install

        install(app, sessions, api_keys=load_api_keys(args.api_key, args.api_keys_file), admin_keys=args.admin_key)
    if core is not None:
        from memt_proxy.http.embedded import embed

        embed(app, core)  # the engine starts before the proxy and stops after its pending commits
    return app, names, checkpoint.model


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from memt_core.launch import bind

    try:
        sock = bind(args.host, args.port)  # before anything else (the checkpoint, an embedded core): a taken port fails at once
    except OSError as exc:
        print(f"memt_proxy: refused: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        app, names, family = build_app(args)
    except (CheckpointError, OSError) as exc:
        sock.close()
        print(f"memt_proxy: refused: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    print(f"memt_proxy: serving {', '.join(names)} (a {family} checkpoint) on http://{args.host}:{args.port}/v1 "
          f"({'embedded core' if args.embedded else f'upstream {args.upstream}'})", flush=True)
    gc.freeze()  # what start-up made is not traversed again by the collector (see memt_core.launch.main)
    from memt_core.server.slow_clients import header_timeout_protocol

    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5,
                            http=header_timeout_protocol(args.header_timeout))
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
