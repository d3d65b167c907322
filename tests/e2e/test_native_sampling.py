"""SGLang sampling fields, grammars and log-probabilities on the live native server (queries and plain generation)."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from e2e.wire import Wire, assert_error

PROMPT = [1, 2, 3, 4]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}, "required": ["name", "age"],
          "additionalProperties": False}


@pytest.fixture
def wire(nano_server):
    with nano_server.client() as http:
        yield Wire(http)


def test_json_schema_and_regex_constrain_queries_and_plain_generation(wire):
    h = wire.open()
    answer = wire.query(h, PROMPT, 48, json_schema=json.dumps(SCHEMA))
    jsonschema.validate(json.loads(answer["text"]), SCHEMA)
    plain = wire.plain(PROMPT, 12, regex="[0-9]{3}-[0-9]{4}")
    assert len(plain["text"]) == 8 and plain["text"][3] == "-" and plain["text"].replace("-", "").isdigit()
    streamed = wire.post_generate(wire.query_body(h, PROMPT, 48, stream=False, json_schema=json.dumps(SCHEMA), temperature=0.8, seed=4))
    jsonschema.validate(json.loads(streamed.json()["text"]), SCHEMA)
    wire.ctl("close", h)


def test_a_grammar_that_does_not_compile_is_400_and_consumes_nothing(wire):
    h = wire.open()
    body = wire.query_body(h, PROMPT, 4, nonce_="n-grammar", json_schema='{"type": "nonsense"}')
    assert_error(wire.post_generate(body), 400, match="json_schema does not compile")
    assert wire.query(h, PROMPT, 2, nonce_="n-grammar")["output_ids"]  # the nonce was not used up
    wire.ctl("close", h)


def test_logprobs_on_queries(wire):
    h = wire.open()
    body = wire.query_body(h, PROMPT, 5)
    body.update(return_logprob=True, top_logprobs_num=3, return_text_in_logprobs=True)
    meta = wire.post_generate(body).json()["meta_info"]
    chosen, top = meta["output_token_logprobs"], meta["output_top_logprobs"]
    assert len(chosen) == len(top) == meta["completion_tokens"] == 5
    for (logprob, token, text), alternatives in zip(chosen, top):
        assert logprob <= 0 and isinstance(text, str)
        assert len(alternatives) == 3 and [a[0] for a in alternatives] == sorted((a[0] for a in alternatives), reverse=True)
        assert math.isclose(alternatives[0][0], logprob, rel_tol=1e-6) and alternatives[0][1] == token  # greedy picks the top
    assert "output_token_logprobs" not in wire.query(h, PROMPT, 2)["meta_info"]
    wire.ctl("close", h)


def test_logit_bias_penalties_and_min_new_tokens(wire):
    h = wire.open()
    forced = wire.query(h, PROMPT, 4, logit_bias={"7": 100})
    assert forced["output_ids"] == [7, 7, 7, 7]
    varied = wire.query(h, PROMPT, 4, logit_bias={"7": 100, "9": 99}, presence_penalty=2, frequency_penalty=2)
    assert varied["output_ids"][:2] == [7, 9]  # 7 is penalised once it appeared
    plain = wire.plain(PROMPT, 6, min_new_tokens=6, repetition_penalty=1.5, min_p=0.05)  # accepted and applied (unit-tested)
    assert plain["meta_info"]["completion_tokens"] == 6
    for bad, match in (({"min_p": 2}, "min_p"), ({"logit_bias": {"x": 1}}, "logit_bias")):
        assert_error(wire.post_generate(wire.query_body(h, PROMPT, 2, **bad)), 400, match=match)
    wire.ctl("close", h)
