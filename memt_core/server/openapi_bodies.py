"""OpenAPI request bodies of the routes that read their JSON themselves (``/memt/control``, ``/generate``).

The routes parse raw bodies defensively (``memt_core.request_body``), so FastAPI knows nothing of their
shape; these schemas describe it for the OpenAPI document, so that clients and property-based fuzzers
(schemathesis) can reach the routes. Descriptive only: validation stays in ``memt_core.protocol``.
"""

from __future__ import annotations

from memt_core.protocol.events import CONTROL_ACTIONS, MAX_REQUEST_ID

_NAME = {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,160}$"}
_REQUEST_ID = {"type": "string", "maxLength": MAX_REQUEST_ID}
_SNAPSHOT = {"type": "string", "pattern": r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,194}\.safetensors$"}

CONTROL = {
    "type": "object",
    "required": ["action"],
    "properties": {
        "action": {"type": "string", "enum": list(CONTROL_ACTIONS)},
        "session": _NAME,
        "epoch": {"type": "string"},
        "lease": {"type": "string"},
        "ttl": {"type": "integer", "minimum": 1},
        "transaction": _NAME,
        "memory_read": {"type": "boolean"},
        "enabled": {"type": "boolean"},
        "source": _NAME,
        "source_lease": {"type": "string"},
        "retain_kv": {"type": "boolean"},
        "encoding": {"type": "string"},
        "file": _SNAPSHOT,
        "overwrite": {"type": "boolean"},
        "request_id": _REQUEST_ID,
    },
}

_SAMPLING = {
    "type": "object",
    "properties": {
        "max_new_tokens": {"type": "integer", "minimum": 0},
        "min_new_tokens": {"type": "integer", "minimum": 0},
        "temperature": {"type": "number", "minimum": 0},
        "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "top_k": {"type": "integer"},
        "min_p": {"type": "number", "minimum": 0, "maximum": 1},
        "seed": {"type": "integer"},
        "sampling_seed": {"type": "integer"},
        "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "stop_token_ids": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "ignore_eos": {"type": "boolean"},
        "skip_special_tokens": {"type": "boolean"},
        "repetition_penalty": {"type": "number"},
        "frequency_penalty": {"type": "number"},
        "presence_penalty": {"type": "number"},
    },
}

GENERATE = {
    "type": "object",
    "properties": {
        "input_ids": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "text": {"type": "string"},
        "rid": _REQUEST_ID,
        "sampling_params": _SAMPLING,
        "stream": {"type": "boolean"},
        "return_logprob": {"type": "boolean"},
        "top_logprobs_num": {"type": "integer", "minimum": 0},
        "return_text_in_logprobs": {"type": "boolean"},
        "memt_lease": {"type": "string"},
        "memt_epoch": {"type": "string"},
        "memt_transaction": _NAME,
    },
}


def request_body(schema: dict) -> dict:
    """``openapi_extra`` of a route whose JSON body has ``schema``."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}
