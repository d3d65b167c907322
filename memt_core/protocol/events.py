"""The memt-http-v1 wire requests as validated, frozen events.

``parse_control`` turns a ``POST /memt/control`` body into one action event; ``parse_generate`` turns a
``POST /generate`` body into a ``Query``, a ``Commit`` or a ``PlainGeneration``. Every check on the
shape of a request lives here and raises ``InvalidRequest`` naming the field; nothing here knows
about HTTP, sessions or time.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from memt_core.errors import InvalidRequest
from memt_core.names import check_name, check_snapshot_name  # noqa: F401 (re-exported)
from memt_core.request_body import MAX_DEPTH, parse_json
from memt_core.sampling_params import SamplingParams

MIN_TTL, MAX_TTL, DEFAULT_TTL = 1, 3600, 300
#: Longest request ID (a MemT RID of the longest names is about 360 characters); answers echo request IDs,
#: so a longer one is refused rather than sent back.
MAX_REQUEST_ID = 512


# --------------------------------------------------------------------------- request IDs


@dataclass(frozen=True)
class Rid:
    """``memt|<session>|<operation>|<nonce>``; operation is ``query`` or ``commit:<token_count>``."""

    session: str
    operation: str  # "query" | "commit"
    nonce: str
    count: int | None = None  # commit token count

    @property
    def text(self) -> str:
        op = self.operation if self.count is None else f"{self.operation}:{self.count}"
        return f"memt|{self.session}|{op}|{self.nonce}"


def check_request_id(value: str, what: str) -> str:
    """Refuse a request ID longer than ``MAX_REQUEST_ID`` (without quoting it)."""
    if len(value) > MAX_REQUEST_ID:
        raise InvalidRequest(f"{what} is {len(value)} characters long; request ids are at most {MAX_REQUEST_ID}")
    return value


def is_memt_rid(rid: Any) -> bool:
    """Any RID starting with ``memt`` is reserved for MemT and validated as one."""
    return isinstance(rid, str) and rid.startswith("memt")


def parse_rid(rid: str) -> Rid:
    parts = rid.split("|")
    if len(parts) != 4 or parts[0] != "memt":
        raise InvalidRequest(f"rid {rid!r} is reserved for MemT but is not memt|<session>|<operation>|<nonce>")
    _, session, operation, nonce = parts
    check_name(session, "rid session")
    check_name(nonce, "rid nonce")
    if operation == "query":
        return Rid(session, "query", nonce)
    if operation.startswith("commit:"):
        count = operation[len("commit:"):]
        if not re.fullmatch(r"[1-9][0-9]*", count):
            raise InvalidRequest(f"rid {rid!r}: commit:<token_count> needs a positive integer count")
        return Rid(session, "commit", nonce, int(count))
    raise InvalidRequest(f"rid {rid!r}: operation must be 'query' or 'commit:<token_count>', got {operation!r}")


# --------------------------------------------------------------------------- control actions


@dataclass(frozen=True)
class Action:
    """Fields every control action carries."""

    session: str
    lease: str | None = None
    epoch: str | None = None


@dataclass(frozen=True)
class Create(Action):
    memory_read: bool = True
    source: str | None = None
    source_lease: str | None = None
    retain_kv: bool = False


@dataclass(frozen=True)
class Acquire(Action):
    ttl: int = DEFAULT_TTL


@dataclass(frozen=True)
class Renew(Action):
    ttl: int = DEFAULT_TTL


@dataclass(frozen=True)
class Release(Action):
    pass


@dataclass(frozen=True)
class Begin(Action):
    transaction: str = ""


@dataclass(frozen=True)
class Abort(Action):
    transaction: str = ""


@dataclass(frozen=True)
class Publish(Action):
    transaction: str = ""
    memory_read: bool | None = None


@dataclass(frozen=True)
class MemoryRead(Action):
    enabled: bool = True


@dataclass(frozen=True)
class Export(Action):
    encoding: str = ""
    file: str | None = None
    transaction: str | None = None
    overwrite: bool = False


@dataclass(frozen=True)
class Import(Action):
    transaction: str = ""
    file: str = ""
    encoding: str = ""


@dataclass(frozen=True)
class Inspect(Action):
    pass


@dataclass(frozen=True)
class Status(Action):
    pass


@dataclass(frozen=True)
class Recover(Action):
    ttl: int = DEFAULT_TTL


@dataclass(frozen=True)
class Cancel(Action):
    request_id: str = ""


@dataclass(frozen=True)
class KvReset(Action):
    pass


@dataclass(frozen=True)
class Reset(Action):
    pass


@dataclass(frozen=True)
class Close(Action):
    pass


@dataclass(frozen=True)
class Unload(Action):
    """This server's extension: free the session here and give up its ownership, keeping its durable memory
    (a server with a snapshot store), so that another server can take it over."""


@dataclass(frozen=True)
class DeleteSnapshot(Action):
    """This server's extension: delete a named snapshot file of the state directory (e.g. a client's offload
    snapshot once restored into ``session``). It needs what a control action needs: the lease of a session
    the caller holds, and the epoch when given. Content-addressed files are immutable and never deleted."""

    file: str = ""


class _Fields:
    """Reads typed fields of one request body, naming the field in every refusal."""

    def __init__(self, body: dict, where: str):
        self.body, self.where, self.used = body, where, set()

    def get(self, name: str, kind: str, *, required: bool = False, default: Any = None) -> Any:
        self.used.add(name)
        if name not in self.body or self.body[name] is None:
            if required:
                raise InvalidRequest(f"{self.where}: field {name!r} is required")
            return default
        value = self.body[name]
        check = _KINDS[kind]
        if not check(value):
            raise InvalidRequest(f"{self.where}: field {name!r} must be {kind}, got {value!r}")
        return value

    def name(self, name: str, *, required: bool = False) -> str | None:
        value = self.get(name, "a string", required=required)
        return None if value is None else check_name(value, f"{self.where}: {name!r}")

    def ttl(self) -> int:
        ttl = self.get("ttl", "an integer", default=DEFAULT_TTL)
        if not MIN_TTL <= ttl <= MAX_TTL:
            raise InvalidRequest(f"{self.where}: 'ttl' must be between {MIN_TTL} and {MAX_TTL} seconds, got {ttl}")
        return ttl

    def no_extra(self) -> None:
        extra = sorted(set(self.body) - self.used)
        if extra:
            raise InvalidRequest(f"{self.where}: unknown field(s) {', '.join(map(repr, extra))}")


_KINDS: dict[str, Callable[[Any], bool]] = {
    "a string": lambda v: isinstance(v, str),
    "a boolean": lambda v: isinstance(v, bool),
    "an integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "a finite number": lambda v: (isinstance(v, int) and not isinstance(v, bool) and abs(v) <= 2**53)
    or (isinstance(v, float) and math.isfinite(v)),
    "an object": lambda v: isinstance(v, dict),
    "a list": lambda v: isinstance(v, list),
}

# action name → (event class, lease needed, readers of the action's own fields)
CONTROL_ACTIONS: dict[str, tuple[type[Action], bool, Callable[[_Fields], dict]]] = {
    "create": (Create, False, lambda f: {
        "memory_read": f.get("memory_read", "a boolean", default=True),
        "source": f.name("source"),
        "source_lease": f.get("source_lease", "a string"),
        "retain_kv": f.get("retain_kv", "a boolean", default=False),
    }),
    "acquire": (Acquire, False, lambda f: {"ttl": f.ttl()}),
    "renew": (Renew, True, lambda f: {"ttl": f.ttl()}),
    "release": (Release, True, lambda f: {}),
    "begin": (Begin, True, lambda f: {"transaction": f.name("transaction", required=True)}),
    "abort": (Abort, True, lambda f: {"transaction": f.name("transaction", required=True)}),
    "publish": (Publish, True, lambda f: {
        "transaction": f.name("transaction", required=True),
        "memory_read": f.get("memory_read", "a boolean"),
    }),
    "memory_read": (MemoryRead, True, lambda f: {"enabled": f.get("enabled", "a boolean", required=True)}),
    "export": (Export, True, lambda f: {
        "encoding": f.get("encoding", "a string", required=True),
        "file": f.get("file", "a string"),
        "transaction": f.name("transaction"),
        "overwrite": f.get("overwrite", "a boolean", default=False),
    }),
    "import": (Import, True, lambda f: {
        "transaction": f.name("transaction", required=True),
        "file": f.get("file", "a string", required=True),
        "encoding": f.get("encoding", "a string", required=True),
    }),
    "inspect": (Inspect, False, lambda f: {}),
    "status": (Status, True, lambda f: {}),
    "recover": (Recover, True, lambda f: {"ttl": f.ttl()}),
    "cancel": (Cancel, True, lambda f: {"request_id": check_request_id(f.get("request_id", "a string", required=True), f"{f.where}: 'request_id'")}),
    "kv_reset": (KvReset, True, lambda f: {}),
    "reset": (Reset, True, lambda f: {}),
    "close": (Close, True, lambda f: {}),
    "unload": (Unload, True, lambda f: {}),
    "delete_snapshot": (DeleteSnapshot, True, lambda f: {"file": f.get("file", "a string", required=True)}),
}

#: the actions this server adds to the memt-http-v1 spec's (``--spec-strict`` refuses them)
EXTENSION_ACTIONS = ("unload", "delete_snapshot")


def parse_control(body: Any, *, extensions: bool = True) -> Action:
    """Validate a control request body into its action event (``extensions``: this server's actions beside the
    spec's; without them, as under ``--spec-strict``, an extension action is refused as an unknown one)."""
    if not isinstance(body, dict):
        raise InvalidRequest("control request body must be a JSON object")
    action = body.get("action")
    known = [name for name in CONTROL_ACTIONS if extensions or name not in EXTENSION_ACTIONS]
    if not isinstance(action, str) or action not in known:
        refused = " (an extension of this server, refused under --spec-strict)" if action in EXTENSION_ACTIONS else ""
        raise InvalidRequest(f"'action' must be one of {', '.join(known)}; got {action!r}{refused}")
    cls, needs_lease, read = CONTROL_ACTIONS[action]
    fields = _Fields(body, f"control {action!r}")
    fields.used.add("action")
    session = fields.name("session", required=action != "create")
    lease = fields.get("lease", "a string", required=needs_lease)
    epoch = fields.get("epoch", "a string")
    own = read(fields)
    fields.no_extra()
    return cls(session=session or "", lease=lease, epoch=epoch, **own)


def action_name(action: Action) -> str:
    for name, (cls, _, _) in CONTROL_ACTIONS.items():
        if type(action) is cls:
            return name
    raise TypeError(type(action))


# --------------------------------------------------------------------------- generation requests

SAMPLING_FIELDS = {
    "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "sampling_seed", "stop",
    "stop_token_ids", "n", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
    "no_stop_trim", "frequency_penalty", "presence_penalty", "repetition_penalty", "min_new_tokens",
    "logit_bias", "json_schema", "regex", "ebnf",
}
GRAMMAR_FIELDS = ("json_schema", "regex", "ebnf")
#: A ``json_schema`` nests at most this deep, as a request body does (the proxy passes a client's schema on as it is).
MAX_SCHEMA_DEPTH = MAX_DEPTH
MAX_TOP_LOGPROBS = 20
UNSUPPORTED_INPUTS = ("text", "input_embeds", "image_data", "audio_data", "video_data")
COMMIT_REFUSED = ("return_logprob", "return_hidden_states", "top_logprobs_num", "logprob_start_len", "return_text_in_logprobs")


@dataclass(frozen=True)
class Query:
    rid: Rid
    input_ids: tuple[int, ...]
    sampling: SamplingParams
    lease: str
    epoch: str | None
    stream: bool = False
    session_params: dict | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Commit:
    rid: Rid
    input_ids: tuple[int, ...]
    lease: str
    transaction: str
    epoch: str | None


@dataclass(frozen=True)
class PlainGeneration:
    """A generation without a MemT RID: ordinary generation that never touches session memory."""

    rid: str | None
    input_ids: tuple[int, ...] | None
    text: str | None
    sampling: SamplingParams
    stream: bool = False


def parse_sampling(params: Any, *, where: str, vocab_size: int | None = None) -> SamplingParams:
    if params is None:
        raise InvalidRequest(f"{where}: 'sampling_params' with an explicit 'max_new_tokens' is required")
    if not isinstance(params, dict):
        raise InvalidRequest(f"{where}: 'sampling_params' must be an object")
    unknown = sorted(set(params) - SAMPLING_FIELDS)
    if unknown:
        raise InvalidRequest(f"{where}: unsupported sampling_params field(s) {', '.join(map(repr, unknown))}")
    f = _Fields(params, f"{where}: sampling_params")
    max_new = f.get("max_new_tokens", "an integer", required=True)
    if max_new < 0:
        raise InvalidRequest(f"{where}: sampling_params.max_new_tokens must be non-negative, got {max_new}")
    if f.get("n", "an integer", default=1) != 1:
        raise InvalidRequest(f"{where}: sampling_params.n must be 1")
    if f.get("ignore_eos", "a boolean", default=False):
        raise InvalidRequest(f"{where}: sampling_params.ignore_eos must remain false")
    temperature = float(f.get("temperature", "a finite number", default=1.0))
    top_p = float(f.get("top_p", "a finite number", default=1.0))
    top_k = f.get("top_k", "an integer", default=-1)
    if temperature < 0:
        raise InvalidRequest(f"{where}: sampling_params.temperature must be >= 0")
    if not 0 < top_p <= 1:
        raise InvalidRequest(f"{where}: sampling_params.top_p must be in (0, 1]")
    if top_k == 0 or top_k < -1:
        raise InvalidRequest(f"{where}: sampling_params.top_k must be -1 or a positive integer")
    min_p = float(f.get("min_p", "a finite number", default=0.0))
    if not 0 <= min_p <= 1:
        raise InvalidRequest(f"{where}: sampling_params.min_p must be in [0, 1]")
    penalties = {}
    for name in ("frequency_penalty", "presence_penalty"):
        penalties[name] = float(f.get(name, "a finite number", default=0.0))
        if not -2 <= penalties[name] <= 2:
            raise InvalidRequest(f"{where}: sampling_params.{name} must be in [-2, 2]")
    repetition = float(f.get("repetition_penalty", "a finite number", default=1.0))
    if not 0 < repetition <= 2:
        raise InvalidRequest(f"{where}: sampling_params.repetition_penalty must be in (0, 2]")
    min_new = f.get("min_new_tokens", "an integer", default=0)
    if not 0 <= min_new <= max(max_new, 0):
        raise InvalidRequest(f"{where}: sampling_params.min_new_tokens must be between 0 and max_new_tokens")
    logit_bias = _logit_bias(f.get("logit_bias", "an object", default={}), where, vocab_size)
    grammars = [(name, f.get(name, "a string")) for name in GRAMMAR_FIELDS if params.get(name) is not None]
    if len(grammars) > 1:
        raise InvalidRequest(f"{where}: give at most one of sampling_params.json_schema, regex, ebnf")
    grammar = grammars[0] if grammars else None
    if grammar and grammar[0] == "json_schema":
        # JSON inside a string: the body's bounds never saw it, so it is parsed under the same bounds here
        # (nesting at most MAX_SCHEMA_DEPTH deep, bounded integers, valid Unicode), never to a RecursionError
        source = grammar[1].encode("utf-8", "surrogatepass")
        schema = parse_json(source, what=f"{where}: sampling_params.json_schema")
        if not isinstance(schema, (dict, bool)):
            raise InvalidRequest(f"{where}: sampling_params.json_schema must be a JSON object (or true)")
    seed = f.get("seed", "an integer")
    seed = f.get("sampling_seed", "an integer", default=seed)
    if seed is not None and not 0 <= seed < 2**63:
        raise InvalidRequest(f"{where}: sampling_params.seed must be between 0 and 2**63 - 1")
    stop = f.get("stop", "a string") if isinstance(params.get("stop"), str) else f.get("stop", "a list", default=[])
    stop = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) and s for s in stop):
        raise InvalidRequest(f"{where}: sampling_params.stop must be a string or a list of nonempty strings")
    stop_ids = f.get("stop_token_ids", "a list", default=[])
    if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in stop_ids):
        raise InvalidRequest(f"{where}: sampling_params.stop_token_ids must be a list of token ids")
    f.get("no_stop_trim", "a boolean")
    f.get("spaces_between_special_tokens", "a boolean")
    skip_special = f.get("skip_special_tokens", "a boolean", default=True)
    return SamplingParams(
        max_new_tokens=max_new, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
        stop=tuple(stop), stop_token_ids=tuple(stop_ids), skip_special_tokens=skip_special,
        min_p=min_p, repetition_penalty=repetition, min_new_tokens=min_new, logit_bias=logit_bias, grammar=grammar,
        **penalties,
    )


def _logit_bias(bias: dict, where: str, vocab_size: int | None) -> tuple[tuple[int, float], ...]:
    """SGLang's ``logit_bias``: token ids (as strings) → a bias in [-100, 100]."""
    items = []
    for key, value in bias.items():
        if not (isinstance(key, str) and key.isdigit()) or (vocab_size is not None and int(key) >= vocab_size):
            raise InvalidRequest(f"{where}: sampling_params.logit_bias keys must be token ids below {vocab_size}, got {key[:40]!r}")
        if not _KINDS["a finite number"](value) or not -100 <= value <= 100:
            raise InvalidRequest(f"{where}: sampling_params.logit_bias[{key!r}] must be a number in [-100, 100]")
        items.append((int(key), float(value)))
    return tuple(sorted(items))


def _logprob_request(body: dict, where: str, sampling: SamplingParams) -> SamplingParams:
    """Fold the request's log-probability fields into its sampling (queries and plain generations)."""
    f = _Fields(body, where)
    want = f.get("return_logprob", "a boolean", default=False)
    top = f.get("top_logprobs_num", "an integer", default=0)
    text = f.get("return_text_in_logprobs", "a boolean", default=False)
    start = f.get("logprob_start_len", "an integer", default=-1)
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"{where}: 'top_logprobs_num' must be between 0 and {MAX_TOP_LOGPROBS}")
    if (top or text) and not want:
        raise InvalidRequest(f"{where}: 'top_logprobs_num' and 'return_text_in_logprobs' need 'return_logprob': true")
    if want and start != -1:
        raise InvalidRequest(f"{where}: input-token log-probabilities are not supported; leave 'logprob_start_len' at -1")
    if body.get("return_hidden_states"):
        raise InvalidRequest(f"{where}: 'return_hidden_states' is not supported by this engine")
    return replace(sampling, logprobs=want, top_logprobs=top if want else 0, logprob_text=text)


def _input_ids(body: dict, where: str, *, vocab_size: int, max_prefill_tokens: int) -> tuple[int, ...]:
    ids = body.get("input_ids")
    if ids is None:
        raise InvalidRequest(f"{where}: 'input_ids' is required (one nonempty list of token ids)")
    if not isinstance(ids, list) or not ids:
        raise InvalidRequest(f"{where}: 'input_ids' must be one nonempty list of token ids")
    if any(isinstance(item, list) for item in ids):
        raise InvalidRequest(f"{where}: batched 'input_ids' are not supported; send one list per request")
    for token in ids:
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab_size:
            raise InvalidRequest(f"{where}: 'input_ids' holds {token!r}, not a token id in [0, {vocab_size})")
    if len(ids) > max_prefill_tokens:
        raise InvalidRequest(f"{where}: {len(ids)} input tokens exceed max_prefill_tokens ({max_prefill_tokens})")
    return tuple(ids)


GENERATE_FIELDS = {
    "rid", "input_ids", "text", "sampling_params", "stream", "memt_lease", "memt_epoch", "memt_transaction",
    "session_params", "return_logprob", "return_hidden_states", "top_logprobs_num", "logprob_start_len",
    "return_text_in_logprobs", "input_embeds", "image_data", "audio_data", "video_data", "lora_path",
    "custom_logit_processor",
}


def parse_generate(body: Any, *, vocab_size: int, max_prefill_tokens: int) -> Query | Commit | PlainGeneration:
    """Validate a ``/generate`` body (the spec's "Generation requests" rules)."""
    if not isinstance(body, dict):
        raise InvalidRequest("generate request body must be a JSON object")
    unknown = sorted(set(body) - GENERATE_FIELDS)
    if unknown:
        raise InvalidRequest(f"generate: unknown field(s) {', '.join(map(repr, unknown))}")
    rid = body.get("rid")
    if isinstance(rid, str):
        check_request_id(rid, "generate: 'rid'")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("generate: 'stream' must be a boolean")
    for name in ("lora_path", "custom_logit_processor"):
        if body.get(name) is not None:
            raise InvalidRequest(f"generate: {name!r} is not supported")

    if not is_memt_rid(rid):
        if rid is not None and not isinstance(rid, str):
            raise InvalidRequest("generate: 'rid' must be a string (batched requests are not supported)")
        for name in ("memt_lease", "memt_transaction", "memt_epoch"):
            if body.get(name) is not None:
                raise InvalidRequest(f"generate: {name!r} needs a MemT rid (memt|<session>|<operation>|<nonce>)")
        for name in ("input_embeds", "image_data", "audio_data", "video_data"):
            if body.get(name) is not None:
                raise InvalidRequest(f"generate: {name!r} is not supported")
        text = body.get("text")
        if text is not None and not isinstance(text, str):
            raise InvalidRequest("generate: 'text' must be one string (batched requests are not supported)")
        if (text is None) == (body.get("input_ids") is None):
            raise InvalidRequest("generate: give exactly one of 'text' or 'input_ids'")
        ids = None if text is not None else _input_ids(body, "generate", vocab_size=vocab_size, max_prefill_tokens=max_prefill_tokens)
        sampling = _logprob_request(body, "generate", parse_sampling(body.get("sampling_params"), where="generate", vocab_size=vocab_size))
        return PlainGeneration(rid=rid, input_ids=ids, text=text, sampling=sampling, stream=stream)

    parsed = parse_rid(rid)
    where = f"{parsed.operation} {rid!r}"
    for name in UNSUPPORTED_INPUTS:
        if body.get(name) is not None:
            raise InvalidRequest(f"{where}: {name!r} is not supported for MemT requests; send input_ids")
    ids = _input_ids(body, where, vocab_size=vocab_size, max_prefill_tokens=max_prefill_tokens)
    lease = body.get("memt_lease")
    if not isinstance(lease, str) or not lease:
        raise InvalidRequest(f"{where}: 'memt_lease' is required")
    epoch = body.get("memt_epoch")
    if epoch is not None and not isinstance(epoch, str):
        raise InvalidRequest(f"{where}: 'memt_epoch' must be a string")
    sampling = parse_sampling(body.get("sampling_params"), where=where, vocab_size=vocab_size)

    if parsed.operation == "commit":
        if parsed.count != len(ids):
            raise InvalidRequest(f"{where}: commit:{parsed.count} does not match {len(ids)} input_ids")
        if sampling.max_new_tokens != 0:
            raise InvalidRequest(f"{where}: commits must set sampling_params.max_new_tokens to 0")
        if stream:
            raise InvalidRequest(f"{where}: only queries support stream: true")
        for name in COMMIT_REFUSED:
            if body.get(name):
                raise InvalidRequest(f"{where}: commits do not return output scores or hidden states ({name!r})")
        if sampling.grammar is not None:
            raise InvalidRequest(f"{where}: commits generate nothing, so sampling_params.{sampling.grammar[0]} has nothing to constrain")
        if body.get("session_params") is not None:
            raise InvalidRequest(f"{where}: session_params are not accepted on commits")
        transaction = body.get("memt_transaction")
        if transaction is None:
            raise InvalidRequest(f"{where}: commits must name their transaction in 'memt_transaction'")
        check_name(transaction, f"{where}: 'memt_transaction'")
        return Commit(rid=parsed, input_ids=ids, lease=lease, transaction=transaction, epoch=epoch)

    if body.get("memt_transaction") is not None:
        raise InvalidRequest(f"{where}: queries do not take 'memt_transaction'")
    sampling = _logprob_request(body, where, sampling)
    session_params = body.get("session_params")
    if session_params is not None and session_params != {"id": parsed.session}:
        raise InvalidRequest(f"{where}: session_params may only be {{\"id\": \"{parsed.session}\"}}")
    return Query(rid=parsed, input_ids=ids, sampling=sampling, lease=lease, epoch=epoch, stream=stream, session_params=session_params)
