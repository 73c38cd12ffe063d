"""Structured outputs end to end: every constrained output of `sluice serve` (embedded model)
parses and validates with `jsonschema`, greedy and at temperature 1 with several seeds; regex
and choice outputs match with Python's `re`; EBNF output parses with a small parser for the
test grammar; bad constraints get a 400 that names the problem, and the server goes on.
"""

import json
import re
import urllib.request

import jsonschema
import openai
import pytest
from pydantic import BaseModel

MSG = [{"role": "user", "content": "Reply in JSON."}]
MAX_TOKENS = 400
SEEDS = 3  # n choices at temperature 1, seeds seed..seed+2

S = {"type": "string", "maxLength": 12}
SCHEMAS = {
    "object_basic": {"type": "object", "properties": {"name": S, "age": {"type": "integer"}},
                     "required": ["name", "age"]},
    "type_union": {"type": "object", "properties": {"v": {"type": ["integer", "null"]}},
                   "required": ["v"]},
    "enum_strings": {"enum": ["red", "green", "blue"]},
    "enum_mixed": {"enum": ["a", 1, None, True, {"k": [1, 2]}]},
    "const": {"type": "object", "properties": {"kind": {"const": "point"}, "x": {"type": "integer"}},
              "required": ["kind", "x"]},
    "int_bounds": {"type": "integer", "minimum": -40, "maximum": 1234},
    "int_exclusive": {"type": "object", "properties": {"n": {"type": "integer", "exclusiveMinimum": 0,
                                                             "exclusiveMaximum": 10}}, "required": ["n"]},
    "nested_object": {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1}, "email": {"type": "string", "format": "email"}},
        "required": ["id", "email"]}}, "required": ["user"]},
    "optional_props": {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"},
                                                        "c": S}, "additionalProperties": False},
    # additionalProperties with a schema: test_additional_properties_sampled.
    "array_items": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4},
    "array_exactly_two": {"type": "array", "items": {"type": "string", "maxLength": 6},
                          "minItems": 2, "maxItems": 2},
    "prefix_items": {"type": "array", "prefixItems": [{"type": "string", "maxLength": 5},
                                                      {"type": "integer"}], "items": False, "minItems": 2},
    "any_of": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 8}]},
    "one_of": {"type": "object", "properties": {"shape": {"oneOf": [
        {"type": "object", "properties": {"r": {"type": "integer", "minimum": 0}}, "required": ["r"],
         "additionalProperties": False},
        {"type": "object", "properties": {"w": {"type": "integer"}, "h": {"type": "integer"}},
         "required": ["w", "h"], "additionalProperties": False}]}}, "required": ["shape"]},
    "all_of": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                         {"properties": {"b": {"enum": ["x", "y"]}}, "required": ["b"]}]},
    "defs_ref": {"$defs": {"pos": {"type": "integer", "minimum": 0, "maximum": 99}},
                 "type": "object", "properties": {"x": {"$ref": "#/$defs/pos"}, "y": {"$ref": "#/$defs/pos"}},
                 "required": ["x", "y"]},
    "recursive_tree": {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer", "minimum": 0, "maximum": 9},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
    "pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$"}},
                "required": ["code"]},
    "min_max_length": {"type": "string", "minLength": 3, "maxLength": 5},
    "format_date": {"type": "string", "format": "date"},
    "format_time": {"type": "string", "format": "time"},
    "format_date_time": {"type": "string", "format": "date-time"},
    "format_uuid": {"type": "string", "format": "uuid"},
    "format_email": {"type": "string", "format": "email"},
    "format_ipv4": {"type": "string", "format": "ipv4"},
    "booleans_nulls": {"type": "array", "items": {"type": ["boolean", "null"]}, "maxItems": 5},
    "number": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]},
    "number_min0": {"type": "number", "minimum": 0},
    "array_of_objects": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {
        "k": {"type": "string", "maxLength": 4}, "v": {"type": "integer"}}, "required": ["k", "v"]}},
    # JSONSchemaBench-like documents.
    "bench_product": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1}, "name": {"type": "string", "minLength": 1, "maxLength": 16},
        "price": {"type": "number", "minimum": 0}, "tags": {"type": "array", "items": S, "maxItems": 3},
        "in_stock": {"type": "boolean"}}, "required": ["id", "name", "price", "in_stock"],
        "additionalProperties": False},
    "bench_person": {"type": "object", "definitions": {"address": {"type": "object", "properties": {
        "street": {"type": "string", "maxLength": 20}, "zip": {"type": "string", "pattern": "[0-9]{5}"},
        "country": {"enum": ["CH", "DE", "FR"]}}, "required": ["zip", "country"]}},
        "properties": {"first": S, "last": S, "birthday": {"type": "string", "format": "date"},
                       "home": {"$ref": "#/definitions/address"}},
        "required": ["first", "home"]},
    "bench_event": {"type": "object", "properties": {
        "id": {"type": "string", "format": "uuid"}, "at": {"type": "string", "format": "date-time"},
        "level": {"enum": ["debug", "info", "warn", "error"]}, "source_ip": {"type": "string", "format": "ipv4"},
        "count": {"type": "integer", "minimum": 0, "maximum": 100000}},
        "required": ["id", "at", "level"], "additionalProperties": False},
    "nested_arrays": {"type": "array", "maxItems": 3, "items": {"type": "array", "maxItems": 3,
                                                               "items": {"type": "integer", "minimum": 0, "maximum": 9}}},
    "empty_object": {"type": "object", "additionalProperties": False},
}


def validate(schema, text):
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


def check_choices(resp, schema):
    for c in resp.choices:
        assert c.finish_reason == "stop", (c.finish_reason, c.message.content)
        validate(schema, c.message.content)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_greedy_and_sampled(client, model, name):
    schema = SCHEMAS[name]
    rf = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    greedy = client.chat.completions.create(model=model, messages=MSG, response_format=rf,
                                            max_tokens=MAX_TOKENS, temperature=0)
    check_choices(greedy, schema)
    sampled = client.chat.completions.create(model=model, messages=MSG, response_format=rf,
                                             max_tokens=MAX_TOKENS, temperature=1.0, n=SEEDS, seed=7)
    check_choices(sampled, schema)


# additionalProperties with a schema (map-like objects): keys under propertyNames, or free keys,
# which the grammar bounds (64 characters) so that a sampled key closes; maxProperties bounds
# how many come. Every sampled response at temperature 1 validates, over several seeds.
MAP_SCHEMAS = {
    "map_int_values": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 99},
                       "propertyNames": {"maxLength": 8}, "maxProperties": 3},
    "map_pattern_keys": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 6},
                         "propertyNames": {"pattern": "^[a-z]{1,6}$"}, "maxProperties": 3},
    "map_enum_keys": {"type": "object", "additionalProperties": {"type": "boolean"},
                      "propertyNames": {"enum": ["red", "green", "blue"]}, "minProperties": 1, "maxProperties": 3},
    "declared_and_extra": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999}},
                           "required": ["id"], "additionalProperties": {"type": ["integer", "null"]},
                           "propertyNames": {"enum": ["id", "x_a", "x_b", "x_c"]}, "maxProperties": 3},
    "free_keys": {"type": "object", "additionalProperties": {"type": "boolean"}, "maxProperties": 2},
    # propertyNames binds declared keys too: "Abc" never fits "^z", so it never appears.
    "declared_names_bound": {"type": "object", "properties": {"Abc": {"type": "integer", "minimum": 0, "maximum": 9},
                                                              "zed": {"type": "integer", "minimum": 0, "maximum": 9}},
                             "additionalProperties": {"type": "boolean"}, "propertyNames": {"pattern": "^z[a-z]{0,3}$"},
                             "maxProperties": 2},
    # Free keys beside declared ones (never a declared name again), and a minimum that one
    # declared and one additional property meet (additional keys may repeat one another).
    "declared_min_count": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                           "additionalProperties": {"type": "boolean"}, "propertyNames": {"maxLength": 4},
                           "minProperties": 2, "maxProperties": 3},
}


@pytest.mark.parametrize("name", sorted(MAP_SCHEMAS))
def test_additional_properties_sampled(client, model, name):
    schema = MAP_SCHEMAS[name]
    rf = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    extra_keys = set()
    for seed in (1, 2, 3):
        r = client.chat.completions.create(model=model, messages=MSG, response_format=rf,
                                           max_tokens=MAX_TOKENS, temperature=1.0, n=SEEDS, seed=seed)
        check_choices(r, schema)
        for c in r.choices:
            extra_keys |= set(json.loads(c.message.content)) - set(schema.get("properties", {}))
            keys = [k for k, _ in json.loads(c.message.content, object_pairs_hook=lambda p: p)]
            for k in schema.get("properties", {}):
                assert keys.count(k) <= 1, (k, c.message.content)  # never again as an additional key
    assert extra_keys  # the samples do use additional properties


def test_json_object_and_vllm_fields(client, model):
    # json_object (free-form keys and strings) is covered by grammar_tests (AnyJsonAndChoice): the
    # embedded model does not close free strings reliably. Here: it is accepted and constrains.
    r = client.chat.completions.create(model=model, messages=MSG, max_tokens=8, temperature=0,
                                       response_format={"type": "json_object"})
    assert r.choices[0].message.content.startswith("{")
    schema = SCHEMAS["bench_product"]
    # Completions with the vLLM field spellings, streamed and not.
    for extra in ({"guided_json": schema}, {"structured_outputs": {"json": schema}},
                  {"guided_json": json.dumps(schema)}):
        r = client.completions.create(model=model, prompt="Product:", max_tokens=MAX_TOKENS,
                                      temperature=1.0, seed=11, extra_body=extra)
        validate(schema, r.choices[0].text)
        stream = client.completions.create(model=model, prompt="Product:", max_tokens=MAX_TOKENS,
                                           temperature=1.0, seed=11, stream=True, extra_body=extra)
        text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        assert text == r.choices[0].text  # same seed, same tokens
        validate(schema, text)


def test_streamed_chat_json_schema(client, model):
    schema = SCHEMAS["bench_event"]
    rf = {"type": "json_schema", "json_schema": {"name": "event", "schema": schema, "strict": True}}
    chunks = list(client.chat.completions.create(model=model, messages=MSG, response_format=rf,
                                                 max_tokens=MAX_TOKENS, temperature=1.0, seed=5, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    validate(schema, text)


def test_objects_follow_the_schemas_property_order(client, model, base_url):
    # The client's property order, not sorted: generated objects list their keys the same way,
    # for every field that carries a schema object (and as JSON text).
    schema = {"type": "object", "properties": {
        "zeta": {"type": "integer", "minimum": 0, "maximum": 99}, "mid": {"type": "boolean"},
        "alpha": {"enum": ["x", "y"]}}, "required": ["zeta", "mid", "alpha"],
        "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "ordered", "schema": schema}}
    for kw in ({"response_format": rf}, {"extra_body": {"guided_json": schema}},
               {"extra_body": {"structured_outputs": {"json": schema}}},
               {"extra_body": {"guided_json": json.dumps(schema)}}):
        r = client.chat.completions.create(model=model, messages=MSG, max_tokens=MAX_TOKENS,
                                           temperature=1.0, n=2, seed=3, **kw)
        for c in r.choices:
            keys = json.loads(c.message.content, object_pairs_hook=lambda pairs: [k for k, _ in pairs])
            assert keys == ["zeta", "mid", "alpha"], c.message.content
            validate(schema, c.message.content)
    # The keys and separators the grammar forces were appended without model steps.
    with urllib.request.urlopen(base_url + "/metrics", timeout=30) as m:
        text = m.read().decode()
    (value,) = re.findall(r"^sluice_grammar_jump_forward_tokens_total (\S+)$", text, re.M)
    assert float(value) > 0


REGEXES = [r"[A-Z][a-z]{2,6} [0-9]{1,3}", r"(yes|no|maybe)!?", r"\d{3}-\d{4}", r"(ab|cd)+x?",
           r"[a-f0-9]{8}", r"(?:https?)://[a-z]{3,8}\.(com|org)"]


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex(client, model, pattern):
    for extra in ({"guided_regex": pattern}, {"structured_outputs": {"regex": pattern}}):
        r = client.completions.create(model=model, prompt="Answer:", max_tokens=64, temperature=1.0,
                                      n=SEEDS, seed=1, extra_body=extra)
        for c in r.choices:
            assert c.finish_reason == "stop"
            assert re.fullmatch(pattern, c.text), (pattern, c.text)


def test_choice(client, model):
    choices = ["positive", "negative", "neutral", "pos"]
    for extra in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
        r = client.chat.completions.create(model=model, messages=MSG, max_tokens=16, temperature=1.0,
                                           n=4, seed=2, extra_body=extra)
        for c in r.choices:
            assert c.message.content in choices
            assert re.fullmatch("|".join(choices), c.message.content)


# The EBNF test grammar: comma-separated assignments of arithmetic expressions.
GRAMMAR = r"""
root   ::= assign (", " assign){0,2}
assign ::= var " = " expr
var    ::= [a-z]
expr   ::= term ((" + " | " * ") term)*
term   ::= [0-9] | var | "(" expr ")"
"""


def parse_program(text):
    """Recursive-descent parser for GRAMMAR; raises ValueError unless `text` is a program."""
    pos = 0

    def expect(s):
        nonlocal pos
        if not text.startswith(s, pos):
            raise ValueError(f"expected {s!r} at {pos} in {text!r}")
        pos += len(s)

    def char(cls):
        nonlocal pos
        if pos < len(text) and re.fullmatch(cls, text[pos]):
            pos += 1
            return True
        return False

    def term():
        if char("[0-9]") or char("[a-z]"):
            return
        expect("(")
        expr()
        expect(")")

    def expr():
        term()
        while text.startswith(" + ", pos) or text.startswith(" * ", pos):
            expect(text[pos:pos + 3])
            term()

    def assign():
        if not char("[a-z]"):
            raise ValueError(f"expected a variable at {pos} in {text!r}")
        expect(" = ")
        expr()

    assign()
    count = 1
    while text.startswith(", ", pos):
        expect(", ")
        assign()
        count += 1
    if pos != len(text) or count > 3:
        raise ValueError(f"trailing text at {pos} in {text!r}")


def test_ebnf_grammar(client, model):
    for extra in ({"guided_grammar": GRAMMAR}, {"structured_outputs": {"grammar": GRAMMAR}}):
        r = client.completions.create(model=model, prompt="x = 1, y =", max_tokens=MAX_TOKENS,
                                      temperature=1.0, n=SEEDS, seed=9, extra_body=extra)
        for c in r.choices:
            assert c.finish_reason == "stop", c.text
            parse_program(c.text)


class Point(BaseModel):
    x: int
    y: int
    label: str


def test_openai_sdk_parse_and_stream(client, model):
    completion = client.beta.chat.completions.parse(model=model, messages=MSG, response_format=Point,
                                                    max_tokens=MAX_TOKENS, temperature=1.0, seed=4)
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, Point)
    with client.beta.chat.completions.stream(model=model, messages=MSG, response_format=Point,
                                             max_tokens=MAX_TOKENS, temperature=1.0, seed=4) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].message.parsed == parsed  # same seed, same output


BAD = [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "e", "schema": {"enum": []}}}},
     "response_format", "empty 'enum'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "object", "patternProperties": {"^a": {}}}}}}, "response_format", "patternProperties"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {
        "$ref": "https://example.com/x.json"}}}}, "response_format", "not local"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "m", "schema": {
        "type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2}}}},
     "response_format", "minProperties 2 with additionalProperties"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "propertyNames": False}}}},
     "response_format", "required property 'a' does not match 'propertyNames'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}},
     "response_format", "'response_format.json_schema.name' is required"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "strict": "yes",
                                                                 "schema": {"type": "object"}}}},
     "response_format", "'response_format.json_schema.strict' must be a boolean"),
    ({"guided_json": "{not json"}, "guided_json", "not a valid JSON schema"),
    ({"guided_regex": r"(a)\1"}, "guided_regex", "backreference"),
    ({"structured_outputs": {"regex": r"a(?=b)"}}, "structured_outputs.regex", "lookahead"),
    ({"guided_grammar": "root ::= (\"a\""}, "guided_grammar", "grammar syntax error"),
    ({"guided_choice": []}, "guided_choice", "non-empty"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "only one output constraint"),
    ({"response_format": {"type": "xml"}}, "response_format", "'xml' is not supported"),
]


@pytest.mark.parametrize("schema,got", [('{"type": "object"}', "a string"), ("object", "a string"),
                                        ([{"type": "object"}], "an array")])
def test_response_format_schema_must_be_an_object(client, model, schema, got):
    # As OpenAI's API answers: the schema is an object; JSON text in a string is not parsed.
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model, messages=MSG, max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    assert e.value.status_code == 400
    assert e.value.body == {
        "message": f"'response_format.json_schema.schema' must be a JSON Schema object, got {got}",
        "type": "invalid_request_error", "param": "response_format.json_schema.schema",
        "code": 400}


@pytest.mark.parametrize("schema,ref", [
    ({"$defs": {"node": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "string"}]}},
      "$ref": "#/$defs/node"}, "#/$defs/node"),
    ({"anyOf": [{"$ref": "#"}, {"type": "null"}]}, "#"),
])
def test_left_recursive_ref_is_named_as_written(client, model, schema, ref):
    # Not the grammar rule made for it ("node", "root-ref").
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model, messages=MSG, max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}})
    assert e.value.body["param"] == "response_format"
    assert e.value.body["message"] == (
        f"invalid 'response_format': JSON Schema $ref '{ref}' is left-recursive (it can reach "
        "itself before matching any character)")


@pytest.mark.parametrize("extra,param,message", BAD)
def test_bad_constraints_are_400(client, model, extra, param, message):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=MSG, max_tokens=8, extra_body=extra)
    body = e.value.body
    assert body["param"] == param
    assert message in body["message"], body["message"]
    # The server goes on serving.
    r = client.chat.completions.create(model=model, messages=MSG, max_tokens=4, temperature=0)
    assert r.choices[0].message.content is not None
