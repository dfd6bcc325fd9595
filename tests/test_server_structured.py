"""Structured outputs through `python -m server` and the openai SDK, with the real model.

Every constraint kind (response_format, structured_outputs, the guided_* aliases), streamed
and not, on both routes; each output is checked against its own constraint (jsonschema,
re.fullmatch, membership, the Lark grammar's own parser). Bad constraints are 400s naming
the field, and the server still serves afterwards. The offline LLM gives the server's text.
One server for the module, small max_tokens.
"""

from __future__ import annotations

import json
import re

import openai
import pytest
from server_helpers import ServerProcess, offline_llm

pytestmark = pytest.mark.slow

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
REGEX = r"[A-Z][a-z]{2,8} [0-9]{2}"
CHOICES = ["red", "green", "blue"]
LARK = 'start: "the answer is " NUMBER "."\nNUMBER: /[0-9]{1,3}/\n'
MSGS = [{"role": "user", "content": "Tell me about a person, as JSON."}]


@pytest.fixture(scope="module")
def server():
    srv = ServerProcess("--structured-outputs-config", "backend=guidance").wait_ready()
    yield srv
    assert srv.stop() == 0, srv.log()


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    with OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def chat(client, stream: bool, max_tokens: int = 40, **kw) -> tuple[str, str]:
    """(text, finish_reason) of one greedy chat completion."""
    args = dict(model="SmolLM2-135M-Instruct", messages=kw.pop("messages", MSGS),
                temperature=0, max_tokens=max_tokens, **kw)
    if not stream:
        c = client.chat.completions.create(**args).choices[0]
        return c.message.content, c.finish_reason
    text, finish = "", None
    for chunk in client.chat.completions.create(stream=True, **args):
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    return text, finish


def complete(client, stream: bool, prompt: str, max_tokens: int = 40, **kw) -> tuple[str, str]:
    args = dict(model="SmolLM2-135M-Instruct", prompt=prompt, temperature=0,
                max_tokens=max_tokens, **kw)
    if not stream:
        c = client.completions.create(**args).choices[0]
        return c.text, c.finish_reason
    text, finish = "", None
    for chunk in client.completions.create(stream=True, **args):
        for c in chunk.choices:
            text += c.text
            finish = c.finish_reason or finish
    return text, finish


def check_schema(text: str, schema: dict) -> dict:
    import jsonschema

    doc = json.loads(text)
    jsonschema.validate(doc, schema)
    return doc


def lark_parses(text: str) -> bool:
    import lark

    lark.Lark(LARK, parser="earley").parse(text)  # raises when the text breaks the grammar
    return True


# -- each kind, streamed and not --------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_response_format_json_schema(client, stream):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                  "strict": True}}
    text, finish = chat(client, stream, max_tokens=60, response_format=fmt)
    assert finish == "stop", text
    check_schema(text, PERSON)


@pytest.mark.parametrize("stream", [False, True])
def test_response_format_json_object(client, stream):
    text, finish = chat(client, stream, max_tokens=60,
                        response_format={"type": "json_object"})
    if finish == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # cut by max_tokens: still the start of an object
        assert finish == "length" and text.lstrip().startswith("{")


def test_response_format_text_is_unconstrained(client):
    plain = chat(client, False, max_tokens=8)
    assert chat(client, False, max_tokens=8, response_format={"type": "text"}) == plain


@pytest.mark.parametrize("stream", [False, True])
def test_structured_outputs_json_on_completions(client, stream):
    for schema in (PERSON, json.dumps(PERSON)):  # an object or its JSON text
        text, finish = complete(client, stream, "A person as JSON:", max_tokens=60,
                                extra_body={"structured_outputs": {"json": schema}})
        assert finish == "stop", text
        check_schema(text, PERSON)


@pytest.mark.parametrize("stream", [False, True])
def test_structured_outputs_regex(client, stream):
    text, finish = complete(client, stream, "A name and a number:",
                            extra_body={"structured_outputs": {"regex": REGEX}})
    assert re.fullmatch(REGEX, text), text
    assert finish == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_structured_outputs_choice(client, stream):
    text, finish = chat(client, stream, messages=[
        {"role": "user", "content": "Pick a colour."}],
        extra_body={"structured_outputs": {"choice": CHOICES}})
    assert text in CHOICES and finish == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_structured_outputs_grammar(client, stream):
    text, finish = complete(client, stream, "Question: what is six times seven?\n",
                            extra_body={"structured_outputs": {"grammar": LARK}})
    assert finish == "stop"
    assert lark_parses(text), text


def test_structured_outputs_json_object_and_whitespace(client):
    text, finish = complete(client, False, "A person as JSON:", max_tokens=60, extra_body={
        "structured_outputs": {"json": PERSON, "disable_any_whitespace": True}})
    assert finish == "stop" and not re.search(r"\s", text.replace(" ", "")), text
    check_schema(text, PERSON)
    assert "\n" not in text
    text, _ = complete(client, False, "An object:", max_tokens=30,
                       extra_body={"structured_outputs": {"json_object": True}})
    assert text.lstrip().startswith("{")


def test_disable_additional_properties(client):
    open_schema = {"type": "object", "properties": {"a": {"type": "integer", "maximum": 99,
                                                          "minimum": 0}},
                   "required": ["a"]}
    text, finish = complete(client, False, "JSON:", max_tokens=40, extra_body={
        "structured_outputs": {"json": open_schema, "disable_additional_properties": True}})
    assert finish == "stop"
    assert set(json.loads(text)) == {"a"}


def test_structural_tag(client):
    # free text, except that whatever follows the trigger must be the tag's schema (a
    # trigger written like "<num>" is read by llguidance as a special token's name)
    tag = {"type": "structural_tag", "triggers": ["[num]"], "structures": [
        {"begin": "[num]", "schema": {"type": "integer", "minimum": 0, "maximum": 99},
         "end": "[/num]"}]}
    text, finish = complete(client, False, "Numbers in tags: [num]7[/num], [num]12[/num],",
                            max_tokens=24,
                            extra_body={"structured_outputs": {"structural_tag": tag}})
    assert finish in ("stop", "length")
    for m in re.finditer(re.escape("[num]"), text):
        rest = text[m.end():]
        if finish == "length" and "[/num]" not in rest:
            break
        body, _, _ = rest.partition("[/num]")
        assert 0 <= int(json.loads(body)) <= 99, text


def test_max_tokens_cut_is_length(client):
    text, finish = complete(client, False, "A person as JSON:", max_tokens=3,
                            extra_body={"structured_outputs": {"json": PERSON}})
    assert finish == "length" and text.lstrip().startswith("{")


def test_stream_and_whole_agree(client):
    body = {"structured_outputs": {"json": PERSON}}
    assert (complete(client, False, "A person:", 60, extra_body=body)
            == complete(client, True, "A person:", 60, extra_body=body))


def test_n_choices_each_constrained(client):
    out = client.completions.create(
        model="SmolLM2-135M-Instruct", prompt="A name and a number:", n=3, temperature=1.0,
        seed=7, max_tokens=20, extra_body={"structured_outputs": {"regex": REGEX}})
    assert len(out.choices) == 3
    for c in out.choices:
        assert re.fullmatch(REGEX, c.text), c.text


# -- the openai SDK's parse helper, and the legacy aliases ------------------------------

def test_sdk_parse_pydantic_model(client):
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        name: str = Field(max_length=12)
        age: int

    out = client.chat.completions.parse(model="SmolLM2-135M-Instruct", messages=MSGS,
                                        temperature=0, max_tokens=60, response_format=Person)
    person = out.choices[0].message.parsed
    assert isinstance(person, Person) and person.name


@pytest.mark.parametrize("field,value,check", [
    ("guided_json", PERSON, lambda t: check_schema(t, PERSON)),
    ("guided_regex", REGEX, lambda t: re.fullmatch(REGEX, t)),
    ("guided_choice", CHOICES, lambda t: t in CHOICES),
    ("guided_grammar", LARK, lark_parses),
])
def test_guided_aliases_constrain(client, field, value, check):
    text, finish = complete(client, False, "Answer:", max_tokens=60,
                            extra_body={field: value, "guided_decoding_backend": "auto"})
    assert finish == "stop" and check(text), text


def test_guided_decoding_backend_picks_the_backend(client):
    # vLLM 0.33 ignores the field; here it names the backend, or is a 400 saying why not
    try:
        import xgrammar  # noqa: F401
        have = True
    except ImportError:
        have = False
    body = {"guided_regex": REGEX, "guided_decoding_backend": "xgrammar"}
    if have:
        text, finish = complete(client, False, "Answer:", max_tokens=30, extra_body=body)
        assert finish == "stop" and re.fullmatch(REGEX, text), text
    else:
        with pytest.raises(openai.BadRequestError) as e:
            complete(client, False, "Answer:", max_tokens=30, extra_body=body)
        assert e.value.body["param"] == "guided_decoding_backend"
        assert "xgrammar" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        complete(client, False, "Answer:", max_tokens=30,
                 extra_body={"guided_regex": REGEX, "guided_decoding_backend": "outlines"})
    assert e.value.body["param"] == "guided_decoding_backend"
    assert "not available" in e.value.body["message"]
    text, finish = complete(client, False, "Answer:", max_tokens=30,
                            extra_body={"guided_choice": CHOICES})
    assert text in CHOICES  # the server goes on serving


# -- refusals ---------------------------------------------------------------------------

PATHOLOGICAL_REGEX = {"structured_outputs": {"regex": "(a|aa)*" * 50 + "(x{1,900}){1,900}"}}
BAD = [
    ({"structured_outputs": {"json": {"type": "object", "properties": {"a": {"type": 7}}}}},
     "structured_outputs.json"),
    ({"structured_outputs": {"json": "{not json"}}, "structured_outputs.json"),
    ({"structured_outputs": {"regex": "(ab"}}, "structured_outputs.regex"),
    ({"structured_outputs": {"grammar": ""}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"grammar": "start: undefined_rule\n"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"regex": "a+", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a+"}, "response_format": {"type": "json_object"}},
     "structured_outputs"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "nope"}}}}, "response_format"),
    ({"guided_regex": "(ab"}, "guided_regex"),
    ({"guided_json": PERSON, "guided_regex": "a"}, "guided_regex"),
    ({"structured_outputs": {"regex": "a"}, "guided_choice": ["a"]}, "guided_choice"),
    ({"structured_outputs": {"json": {"type": "object", "properties": {
        f"p{i}": {"type": "string"} for i in range(5000)}}}}, "structured_outputs.json"),
    (PATHOLOGICAL_REGEX, "structured_outputs.regex"),
]


@pytest.mark.parametrize("body,param", BAD, ids=[p for _, p in BAD])
def test_bad_constraint_is_400_naming_the_field(server, client, body, param):
    import httpx

    for route, extra in (("/v1/completions", {"prompt": "Hi"}),
                         ("/v1/chat/completions", {"messages": MSGS})):
        r = httpx.post(server.url + route, timeout=60, json={
            "model": "SmolLM2-135M-Instruct", "max_tokens": 4, **extra, **body})
        if body is PATHOLOGICAL_REGEX and r.status_code == 200:
            continue  # compiled within the cache's bound: allowed, and it constrained
        assert r.status_code == 400, (route, r.text)
        assert r.json()["error"]["param"] == param, r.text
    # and the server still serves
    text, finish = complete(client, False, "Hello", max_tokens=4)
    assert finish in ("stop", "length") and isinstance(text, str)


# -- the offline LLM gives the server's text --------------------------------------------

def test_offline_llm_matches_server(client):
    from actors import SamplingParams
    from actors.params.structured import StructuredSpec

    prompt = "A person as JSON:"
    served, _ = complete(client, False, prompt, 60,
                         extra_body={"structured_outputs": {"json": PERSON}})
    params = SamplingParams(temperature=0, max_tokens=60,
                            structured=StructuredSpec.from_params(json=PERSON))
    offline = offline_llm().generate([prompt], params)[0].outputs[0]
    assert offline.text == served
    assert offline.finish_reason == "stop"
