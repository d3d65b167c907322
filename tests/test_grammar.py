"""Grammar-constrained decoding on the bundled demo model: every output parses and validates.

100 random JSON schemas (seeded generator: nested objects, arrays, enums, numbers, strings,
booleans), decoded greedily and sampled, each within a token budget; plus regular expressions, an
EBNF grammar, budgets too small to be comfortable, and grammars that do not compile.
"""

from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest
from transformers import PreTrainedTokenizerFast

from memt_core.bundled import BUNDLED_MODEL
from memt_core.errors import InvalidRequest
from memt_core.grammar import GrammarCompiler
from memt_core.inference import MemTRuntime, generate
from memt_core.sampling import SamplingParams


@pytest.fixture(scope="module")
def demo():
    runtime = MemTRuntime.load(BUNDLED_MODEL)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(BUNDLED_MODEL))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Describe my cat as JSON."}], add_generation_prompt=True,
                                           enable_thinking=False, tokenize=False)
    return runtime.model, tokenizer, GrammarCompiler(tokenizer), tokenizer.encode(prompt, add_special_tokens=False)


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    kinds = ["string", "integer", "number", "boolean", "enum", "object", "array"] if depth < 2 else ["string", "integer", "boolean", "enum"]
    kind = rng.choice(kinds)
    if kind == "object":
        properties = {rng.choice(["name", "age", "city", "pet", "tags", "score", "ok"]) + str(i): random_schema(rng, depth + 1)
                      for i in range(rng.randint(1, 2 if depth else 3))}
        return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1), "maxItems": rng.randint(1, 3)}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 3, True, None], rng.randint(1, 3))}
    return {"type": kind}


def decode(demo, kind: str, source: str, **sampling) -> tuple[str, str]:
    model, tokenizer, compiler, prompt = demo
    params = SamplingParams(constraint=compiler.compile(kind, source), **sampling)
    out = generate(model, prompt, memory=None, params=params)
    return tokenizer.decode(out.output_ids, skip_special_tokens=True), out.finish_reason


def test_one_hundred_random_schemas_always_validate(demo):
    rng = random.Random(20261130)
    for i in range(100):
        schema = random_schema(rng)
        sampling = {"temperature": 0} if i % 2 else {"temperature": 1.0, "seed": i}
        text, _ = decode(demo, "json_schema", json.dumps(schema), max_new_tokens=rng.choice([48, 64]), **sampling)
        jsonschema.validate(json.loads(text), schema)  # raises with the schema and instance on failure


def test_tight_budgets_still_close_the_output(demo):
    schema = {"type": "object", "properties": {"story": {"type": "string"}, "n": {"type": "number"}}, "required": ["story", "n"]}
    for budget in (12, 16):
        text, _ = decode(demo, "json_schema", json.dumps(schema), max_new_tokens=budget, temperature=0)
        jsonschema.validate(json.loads(text), schema)


#: DSML-like markup: raw text ended by a tag (a quote is only more text there), then a JSON value, then a tag.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}  # as templates render JSON
TAGGED_JSON = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"], "x-guidance": JSON_STYLE}
TAGGED = f"""%llguidance {{}}
start: "<p>" RAW "</p>\\n<q>" %json {json.dumps(TAGGED_JSON)} "</q>"
RAW: /[^<]+/
"""
TAGGED_TEXT = re.compile(r"<p>([^<]+)</p>\n<q>(.*)</q>", re.S)


@pytest.mark.parametrize("budget", [22, 28, 40])  # the shortest output is 18 tokens
def test_tight_budgets_close_raw_text_with_its_tag(demo, budget):
    """Under a tight budget, raw text is ended by its closing tag, not by JSON's closers (more text there)."""
    for seed in range(4):
        text, _ = decode(demo, "ebnf", TAGGED, max_new_tokens=budget, temperature=1.0, seed=seed)
        match = TAGGED_TEXT.fullmatch(text)
        assert match, (budget, seed, text)
        assert isinstance(json.loads(match.group(2))["s"], str)


def test_regular_expressions_and_ebnf(demo):
    text, _ = decode(demo, "regex", r"(Mon|Tue|Wed)day, [0-9]{2}:[0-9]{2}", max_new_tokens=16, temperature=0)
    assert re.fullmatch(r"(Mon|Tue|Wed)day, [0-9]{2}:[0-9]{2}", text), text
    text, _ = decode(demo, "regex", r"[a-z]+( [a-z]+)*", max_new_tokens=6, temperature=1.0, seed=2)
    assert re.fullmatch(r"[a-z]+( [a-z]+)*", text), text
    text, _ = decode(demo, "ebnf", 'root ::= "yes" | "no" | "maybe"', max_new_tokens=8, temperature=0)
    assert text in ("yes", "no", "maybe")


@pytest.mark.parametrize("kind, source, match", [
    ("json_schema", '{"type": "nonsense"}', "does not compile"),
    ("regex", "(unclosed", "does not compile"),
    ("ebnf", "root ::= missing-rule", "does not compile"),
    ("xml", "<a/>", "unknown grammar kind"),
])
def test_grammars_that_do_not_compile_are_invalid_requests(demo, kind, source, match):
    with pytest.raises(InvalidRequest, match=match):
        demo[2].compile(kind, source)


def test_a_budget_below_the_shortest_valid_value_is_cut_and_not_json(demo):
    """What the docs say of a cut answer (issue 48, item 5): the grammar closes early only when the budget leaves
    room for the shortest way to finish; a schema whose smallest value is longer (here a 200-character string)
    ends at max_new_tokens with finish_reason "length" and text that is not valid JSON."""
    schema = {"type": "object", "properties": {"story": {"type": "string", "minLength": 200}}, "required": ["story"]}
    text, finish = decode(demo, "json_schema", json.dumps(schema), max_new_tokens=16, temperature=0)
    assert finish == "length"
    with pytest.raises(ValueError):
        json.loads(text)
    text, finish = decode(demo, "json_schema", json.dumps(schema), max_new_tokens=400, temperature=0)
    jsonschema.validate(json.loads(text), schema)  # with room, it closes
