#!/usr/bin/env python3
"""OpenAI- and Anthropic-client tests against a running `resin serve`.

    python3 scripts/serve_tests.py [URL] [--api-key KEY] [--tools-url URL2]

--max-body (or $RESIN_MAX_BODY, default 4 MiB as in ServerConfig) is the server's body limit.
URL (default $RESIN_URL or http://127.0.0.1:8080) serves SmolLM2-135M; the api-key tests run
when the server was started with --api-key (pass the same key here, or $RESIN_API_KEY).
--max-stored N is the server's --max-stored-responses (the Responses store's bound test runs
with it). --tools-url (or $RESIN_TOOLS_URL) serves Qwen2.5-Coder-0.5B for the tool-call round trip;
--thinking-url (or $RESIN_THINKING_URL) serves the synthetic Qwen3 that writes its own
`<think>` (crates/server/tests/common/qwen3.rs) for the reasoning and signed-thinking tests;
without them those tests are skipped. Uses the official `openai` and `anthropic` packages
(pip install openai anthropic).
Prints one line a test and 'N passed, N failed' at the end; exits 1 on a failure.
"""

import argparse
import base64
import json
import math
import os
import sys
import traceback
import urllib.error
import urllib.request

try:
    import openai
    from openai import OpenAI
except ImportError:
    sys.exit("serve_tests.py needs the openai package: pip install openai")
try:
    import anthropic
except ImportError:
    sys.exit("serve_tests.py needs the anthropic package: pip install anthropic")
try:
    import jsonschema
except ImportError:
    sys.exit("serve_tests.py needs the jsonschema package: pip install jsonschema")

RESULTS = {"passed": 0, "failed": 0, "skipped": 0}


def test(fn):
    fn.is_test = True
    return fn


class Ctx:
    def __init__(self, url, key, tools_url, max_body, max_stored=None, thinking_url=None):
        self.thinking_url = thinking_url.rstrip("/") if thinking_url else None
        self.max_body = max_body
        self.max_stored = max_stored
        self.url = url.rstrip("/")
        self.key = key
        self.tools_url = tools_url.rstrip("/") if tools_url else None
        self.client = OpenAI(base_url=self.url + "/v1", api_key=key or "none", max_retries=0, timeout=300)
        self.model = self.client.models.list().data[0].id
        # Anthropic's client sends the key as x-api-key.
        self.anthropic = anthropic.Anthropic(base_url=self.url, api_key=key or "none", max_retries=0, timeout=300)


def raw(url, method="GET", body=None, headers=None):
    """A plain HTTP request: (status, headers, parsed JSON or text)."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            status, hdrs, text = r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        status, hdrs, text = e.code, dict(e.headers), e.read().decode()
    try:
        return status, hdrs, json.loads(text)
    except ValueError:
        return status, hdrs, text


def auth(ctx):
    return {"authorization": f"Bearer {ctx.key}"} if ctx.key else {}


@test
def models(ctx):
    ms = ctx.client.models.list()
    assert len(ms.data) == 1 and ms.data[0].object == "model", ms


@test
def health_and_metrics(ctx):
    st, _, b = raw(ctx.url + "/health")
    assert st == 200 and b["status"] == "ok", b
    st, _, m = raw(ctx.url + "/metrics")
    assert st == 200
    for name in ["resin_requests_total", "resin_time_to_first_token_seconds_bucket", "resin_active_sessions", "resin_nrow_steps_total"]:
        assert name in m, name


@test
def chat(ctx):
    r = ctx.client.chat.completions.create(
        model=ctx.model,
        messages=[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=24,
    )
    c = r.choices[0]
    assert c.message.role == "assistant" and c.message.content, r
    assert c.finish_reason in ("stop", "length"), r
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


@test
def streaming_chat_equals_whole(ctx):
    msgs = [{"role": "user", "content": "Name three colors."}]
    whole = ctx.client.chat.completions.create(model=ctx.model, messages=msgs, temperature=0, max_tokens=32)
    stream = ctx.client.chat.completions.create(
        model=ctx.model, messages=msgs, temperature=0, max_tokens=32, stream=True, stream_options={"include_usage": True}
    )
    text, reason, usage = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.delta.content or ""
            reason = ch.finish_reason or reason
    assert text == whole.choices[0].message.content, (text, whole.choices[0].message.content)
    assert reason == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


@test
def stop_strings_do_not_leak(ctx):
    p = "The capital of France is"
    full = ctx.client.completions.create(model=ctx.model, prompt=p, temperature=0, max_tokens=16).choices[0].text
    assert "Paris" in full, full
    cut = full[: full.index("Paris")]
    r = ctx.client.completions.create(model=ctx.model, prompt=p, temperature=0, max_tokens=16, stop=["Paris"])
    assert r.choices[0].text == cut and r.choices[0].finish_reason == "stop", r
    s = ctx.client.completions.create(model=ctx.model, prompt=p, temperature=0, max_tokens=16, stop="Paris", stream=True)
    assert "".join(c.choices[0].text for c in s if c.choices) == cut


@test
def completions(ctx):
    r = ctx.client.completions.create(model=ctx.model, prompt="Once upon a time", temperature=0, max_tokens=12)
    assert r.object == "text_completion" and r.choices[0].text, r
    s = ctx.client.completions.create(model=ctx.model, prompt="Once upon a time", temperature=0, max_tokens=12, stream=True)
    assert "".join(c.choices[0].text for c in s if c.choices) == r.choices[0].text


@test
def seeded_sampling_repeats(ctx):
    kw = dict(model=ctx.model, messages=[{"role": "user", "content": "Tell me a word."}], temperature=0.9, top_p=0.9, seed=7, max_tokens=12)
    a = ctx.client.chat.completions.create(**kw).choices[0].message.content
    b = ctx.client.chat.completions.create(**kw).choices[0].message.content
    assert a == b, (a, b)


@test
def errors(ctx):
    def expect(status, call):
        try:
            call()
        except openai.APIStatusError as e:
            assert e.status_code == status, (e.status_code, status, e)
            body = e.response.json()["error"]
            assert body["message"] and "type" in body and "param" in body and "code" in body, body
            return body
        raise AssertionError(f"expected {status}")

    msgs = [{"role": "user", "content": "hi"}]
    expect(404, lambda: ctx.client.chat.completions.create(model="no-such-model", messages=msgs))
    expect(400, lambda: ctx.client.chat.completions.create(model=ctx.model, messages=msgs, max_tokens=0))
    expect(400, lambda: ctx.client.chat.completions.create(model=ctx.model, messages=msgs, n=2))
    expect(400, lambda: ctx.client.chat.completions.create(model=ctx.model, messages=msgs, temperature=-3))
    expect(400, lambda: ctx.client.chat.completions.create(model=ctx.model, messages=[]))
    body = expect(400, lambda: ctx.client.completions.create(model=ctx.model, prompt="word " * 40000, max_tokens=4))
    assert any(ch.isdigit() for ch in body["message"]), body
    st, _, b = raw(ctx.url + "/v1/chat/completions", "POST", b"{not json", auth(ctx))
    assert st == 400 and "error" in b, (st, b)
    st, _, b = raw(ctx.url + "/v1/chat/completions", "POST", {"messages": "hi"}, auth(ctx))
    assert st == 400 and b["error"]["param"] == "messages", (st, b)
    # Just past the server's body limit (a client that sends far more may see the connection
    # closed before it reads the 413, as with any server that stops reading).
    st, _, b = raw(ctx.url + "/v1/completions", "POST", {"prompt": "x" * (ctx.max_body + (16 << 10))}, auth(ctx))
    assert st == 413 and b["error"]["code"] == "request_too_large", (st, b)
    # Still serving.
    ctx.client.chat.completions.create(model=ctx.model, messages=msgs, max_tokens=2)


@test
def api_key(ctx):
    if not ctx.key:
        return "skip: the server runs without --api-key"
    st, _, b = raw(ctx.url + "/v1/models")
    assert st == 401 and b["error"]["code"] == "invalid_api_key", (st, b)
    st, _, _ = raw(ctx.url + "/v1/models", headers={"authorization": "Bearer wrong"})
    assert st == 401
    bad = OpenAI(base_url=ctx.url + "/v1", api_key="wrong", max_retries=0)
    try:
        bad.models.list()
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError:
        pass
    assert raw(ctx.url + "/health")[0] == 200 and raw(ctx.url + "/metrics")[0] == 200



def check_top_list(entry, k):
    """One chat logprobs entry: a log-probability, its top list best first, within [-inf, 0]."""
    assert entry.logprob <= 0, entry
    top = entry.top_logprobs
    assert len(top) == k, (len(top), k)
    assert all(t.logprob <= 0 for t in top), top
    assert all(a.logprob >= b.logprob for a, b in zip(top, top[1:])), top
    assert sum(math.exp(t.logprob) for t in top) <= 1 + 1e-4, top
    if top:
        assert entry.logprob <= top[0].logprob + 1e-6, (entry, top[0])


@test
def logprobs_chat_greedy(ctx):
    msgs = [{"role": "user", "content": "Name three colors."}]
    kw = dict(model=ctx.model, messages=msgs, temperature=0, max_tokens=24, logprobs=True, top_logprobs=5)
    r = ctx.client.chat.completions.create(**kw)
    c = r.choices[0]
    content = c.logprobs.content
    # Every generated token but an end-of-generation token that ends the output.
    assert r.usage.completion_tokens - len(content) in (0, 1), (r.usage, len(content))
    assert "".join(e.token for e in content) == c.message.content, ([e.token for e in content], c.message.content)
    for e in content:
        check_top_list(e, 5)
        # Greedy: the chosen token is the first of its top list, its log-probability the largest.
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob, e
        assert bytes(e.bytes) == e.token.encode(), e
    # The same without logprobs: the same text (asking for them does not change the draw).
    plain = ctx.client.chat.completions.create(model=ctx.model, messages=msgs, temperature=0, max_tokens=24)
    assert plain.choices[0].message.content == c.message.content and plain.choices[0].logprobs is None
    # Streamed: the same entries, chunk by chunk.
    streamed = []
    text = ""
    for chunk in ctx.client.chat.completions.create(**kw, stream=True):
        for ch in chunk.choices:
            text += ch.delta.content or ""
            if ch.logprobs and ch.logprobs.content:
                streamed.extend(ch.logprobs.content)
    assert text == c.message.content
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]
    # logprobs without top_logprobs: empty top lists.
    r0 = ctx.client.chat.completions.create(model=ctx.model, messages=msgs, temperature=0, max_tokens=4, logprobs=True)
    assert [e.logprob for e in r0.choices[0].logprobs.content] == [e.logprob for e in content[:4]]
    assert all(e.top_logprobs == [] for e in r0.choices[0].logprobs.content)


@test
def logprobs_chat_sampled(ctx):
    msgs = [{"role": "user", "content": "Tell me a story."}]
    # top_k within the top candidates, then penalties (the whole row): each token's logprob is
    # the raw model's, whatever the sampler did with the row.
    for extra in [dict(extra_body={"top_k": 40}), dict(frequency_penalty=1.0), dict(extra_body={"top_k": 0})]:
        r = ctx.client.chat.completions.create(
            model=ctx.model, messages=msgs, temperature=1.2, seed=5, max_tokens=24, logprobs=True, top_logprobs=20, **extra
        )
        content = r.choices[0].logprobs.content
        assert len(content) >= r.usage.completion_tokens - 1, (extra, len(content), r.usage)
        for e in content:
            check_top_list(e, 20)
            if any(t.token == e.token for t in e.top_logprobs):
                assert any(t.token == e.token and abs(t.logprob - e.logprob) < 1e-6 for t in e.top_logprobs), e


@test
def logprobs_completions(ctx):
    kw = dict(model=ctx.model, prompt="The capital of France is", temperature=0, max_tokens=12, logprobs=3)
    r = ctx.client.completions.create(**kw)
    c = r.choices[0]
    lp = c.logprobs
    assert "".join(lp.tokens) == c.text, (lp.tokens, c.text)
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))], lp.text_offset
    for tok, v, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert v <= 0 and len(top) == 3 and sum(math.exp(x) for x in top.values()) <= 1 + 1e-4, top
        assert max(top.values()) == v and top[tok] == v, (tok, v, top)
    s = ctx.client.completions.create(**kw, stream=True)
    tokens, values, offsets = [], [], []
    for chunk in s:
        for ch in chunk.choices:
            if ch.logprobs:
                tokens += ch.logprobs.tokens
                values += ch.logprobs.token_logprobs
                offsets += ch.logprobs.text_offset
    assert (tokens, values, offsets) == (lp.tokens, lp.token_logprobs, lp.text_offset)


@test
def logprobs_errors(ctx):
    msgs = [{"role": "user", "content": "hi"}]
    for kw in [dict(logprobs=True, top_logprobs=21), dict(logprobs=True, top_logprobs=-1), dict(top_logprobs=2)]:
        try:
            ctx.client.chat.completions.create(model=ctx.model, messages=msgs, max_tokens=2, **kw)
            raise AssertionError(f"accepted {kw}")
        except openai.BadRequestError as e:
            body = e.response.json()["error"]
            assert body["type"] == "invalid_request_error" and body["param"] == "top_logprobs", body
    for n in [21, -1]:
        try:
            ctx.client.completions.create(model=ctx.model, prompt="a", max_tokens=2, logprobs=n)
            raise AssertionError(f"accepted logprobs={n}")
        except openai.BadRequestError as e:
            assert e.response.json()["error"]["param"] == "logprobs"

# Structured outputs: nested objects, arrays, enums, numbers and required fields.
ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "customer": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "maxLength": 40},
                "tier": {"type": "string", "enum": ["free", "pro", "enterprise"]},
                "age": {"type": "integer", "minimum": 0, "maximum": 150},
            },
            "required": ["name", "tier"],
            "additionalProperties": False,
        },
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "maxLength": 20},
                    "quantity": {"type": "integer", "minimum": 1, "maximum": 99},
                    "price": {"type": "number", "minimum": 0},
                },
                "required": ["sku", "quantity", "price"],
                "additionalProperties": False,
            },
            "minItems": 1,
            "maxItems": 4,
        },
        "paid": {"type": "boolean"},
        "note": {"type": ["string", "null"], "maxLength": 60},
    },
    "required": ["customer", "items", "paid"],
    "additionalProperties": False,
}


def schema_format(schema, name="order", strict=None):
    """response_format for `schema`; strict None leaves the field out (JSON Schema's meaning:
    ORDER_SCHEMA has optional members, which OpenAI's strict mode does not allow)."""
    js = {"name": name, "schema": schema}
    if strict is not None:
        js["strict"] = strict
    return {"type": "json_schema", "json_schema": js}


@test
def structured_output_validates(ctx):
    # Enforced by the mask at every step: even SmolLM2-135M's output parses and validates, at
    # any temperature and seed, unless max_tokens cut it (finish_reason "length").
    msgs = [{"role": "user", "content": "Make up an order for a customer as JSON."}]
    done = 0
    for seed, temp in [(0, 0.0), (1, 0.7), (2, 1.0), (3, 1.3), (4, 0.9), (5, 1.6)]:
        r = ctx.client.chat.completions.create(
            model=ctx.model, messages=msgs, response_format=schema_format(ORDER_SCHEMA), temperature=temp, seed=seed, max_tokens=400
        )
        c = r.choices[0]
        if c.finish_reason == "length":
            continue
        assert c.finish_reason == "stop", r
        v = json.loads(c.message.content)
        jsonschema.validate(v, ORDER_SCHEMA)
        done += 1
    assert done >= 3, f"only {done} of 6 answers finished within max_tokens"
    # Streamed: the chunks join to the same kind of answer.
    stream = ctx.client.chat.completions.create(
        model=ctx.model, messages=msgs, response_format=schema_format(ORDER_SCHEMA), temperature=0, seed=0, max_tokens=400, stream=True
    )
    text, reason = "", None
    for ch in stream:
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            reason = ch.choices[0].finish_reason or reason
    if reason == "stop":
        jsonschema.validate(json.loads(text), ORDER_SCHEMA)


@test
def structured_output_on_completions(ctx):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "population": {"type": "integer"}}, "required": ["city", "population"]}
    for seed in range(3):
        r = ctx.client.completions.create(
            model=ctx.model, prompt="The largest city of France:", max_tokens=100, temperature=1.0, seed=seed, extra_body={"response_format": schema_format(schema, "city", strict=True)}
        )
        c = r.choices[0]
        if c.finish_reason == "length":
            continue
        assert c.finish_reason == "stop", r
        jsonschema.validate(json.loads(c.text), schema)


# ORDER_SCHEMA as OpenAI's strict mode has it: every member required (the optional ones
# nullable), every object closed.
STRICT_ORDER_SCHEMA = json.loads(json.dumps(ORDER_SCHEMA))
STRICT_ORDER_SCHEMA["properties"]["customer"]["properties"]["age"]["type"] = ["integer", "null"]
STRICT_ORDER_SCHEMA["properties"]["customer"]["required"] = ["name", "tier", "age"]
STRICT_ORDER_SCHEMA["required"] = ["customer", "items", "paid", "note"]


@test
def structured_output_strict_mode(ctx):
    # strict: true is OpenAI's strict mode: a schema it accepts validates as before ...
    msgs = [{"role": "user", "content": "Make up an order for a customer as JSON."}]
    done = 0
    for seed, temp in [(0, 0.0), (1, 0.8), (2, 1.2)]:
        r = ctx.client.chat.completions.create(
            model=ctx.model, messages=msgs, response_format=schema_format(STRICT_ORDER_SCHEMA, strict=True), temperature=temp, seed=seed, max_tokens=400
        )
        if r.choices[0].finish_reason == "length":
            continue
        jsonschema.validate(json.loads(r.choices[0].message.content), STRICT_ORDER_SCHEMA)
        done += 1
    assert done >= 1, "no strict answer finished within max_tokens"
    # ... an object that says nothing of additionalProperties takes no other member (SmolLM2
    # adds "age" to a cat where JSON Schema allows it) ...
    cat = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}, "required": ["name"]}
    ask = [{"role": "user", "content": "Describe a cat as a JSON object with many fields."}]
    open_ = ctx.client.chat.completions.create(model=ctx.model, messages=ask, response_format=schema_format(cat, "cat"), temperature=0, max_tokens=40)
    assert '"age":' in open_.choices[0].message.content, open_
    for seed, temp in [(0, 0.0), (1, 0.8), (2, 1.0), (3, 1.2)]:
        r = ctx.client.chat.completions.create(model=ctx.model, messages=ask, response_format=schema_format(cat, "cat", strict=True), temperature=temp, seed=seed, max_tokens=40)
        c = r.choices[0]
        assert c.finish_reason == "stop" and list(json.loads(c.message.content)) == ["name"], r
    # ... and a schema strict mode refuses is a 400 naming the rule and where, on every route;
    # the same schema without strict is JSON Schema's and is served.
    for schema, needle in [
        (ORDER_SCHEMA, "'required' must list every key in 'properties'; missing 'note'"),
        ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": True}, "'additionalProperties' must be false"),
        ({"type": "object", "properties": {"tags": {"type": "object"}}, "required": ["tags"]}, "in context (properties, tags), an object must declare its 'properties'"),
    ]:
        err = expect_status(400, lambda: ctx.client.chat.completions.create(model=ctx.model, messages=msgs, response_format=schema_format(schema, "x", strict=True), max_tokens=4))
        assert err["param"] == "response_format" and needle in err["message"] and "'x'" in err["message"], err
        st, _, body = raw(ctx.url + "/v1/completions", "POST", {"prompt": "a", "max_tokens": 4, "response_format": schema_format(schema, "x", strict=True)}, auth(ctx))
        assert st == 400 and needle in body["error"]["message"], body
        text = {"format": {"type": "json_schema", "name": "x", "schema": schema, "strict": True}}
        err = expect_status(400, lambda: ctx.client.responses.create(model=ctx.model, input="hi", text=text, max_output_tokens=4))
        assert err["param"] == "text.format" and needle in err["message"], err
        for strict in (None, False):
            r = ctx.client.chat.completions.create(model=ctx.model, messages=msgs, response_format=schema_format(schema, "x", strict=strict), max_tokens=4)
            assert r.choices[0].finish_reason in ("stop", "length"), r


@test
def json_object_mode_parses(ctx):
    msgs = [{"role": "user", "content": "Describe a cat in JSON."}]
    finished = 0
    for seed, temp in [(0, 0.0), (1, 0.8), (2, 1.2)]:
        r = ctx.client.chat.completions.create(model=ctx.model, messages=msgs, response_format={"type": "json_object"}, temperature=temp, seed=seed, max_tokens=300)
        c = r.choices[0]
        if c.finish_reason == "length":
            continue
        assert c.finish_reason == "stop", r
        assert isinstance(json.loads(c.message.content), dict), c.message.content
        finished += 1
    assert finished >= 1
    # {"type": "text"} is the unconstrained default.
    r = ctx.client.chat.completions.create(model=ctx.model, messages=msgs, response_format={"type": "text"}, temperature=0, max_tokens=8)
    assert r.choices[0].message.content


@test
def structured_output_cut_by_max_tokens(ctx):
    msgs = [{"role": "user", "content": "Make up an order as JSON."}]
    r = ctx.client.chat.completions.create(model=ctx.model, messages=msgs, response_format=schema_format(ORDER_SCHEMA), temperature=0, max_tokens=5)
    c = r.choices[0]
    assert c.finish_reason == "length" and r.usage.completion_tokens == 5, r
    assert c.message.content.startswith("{"), c.message.content
    try:
        json.loads(c.message.content)
        raise AssertionError("a cut answer parsed")
    except ValueError:
        pass


@test
def structured_output_errors(ctx):
    msgs = [{"role": "user", "content": "hi"}]
    # A feature llguidance does not implement: a 400 that names it.
    bad = {"type": "array", "items": {"type": "string"}, "uniqueItems": True, "contains": {"const": "x"}, "minContains": 2}
    for fmt, needle in [
        (schema_format(bad, "bad"), "minContains"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": 3}}}, "properties"),
        ({"type": "json_schema"}, "json_schema"),
        ({"type": "xml"}, "xml"),
    ]:
        try:
            ctx.client.chat.completions.create(model=ctx.model, messages=msgs, response_format=fmt, max_tokens=5)
            raise AssertionError(f"accepted {fmt}")
        except openai.BadRequestError as e:
            err = e.response.json()["error"]
            assert err["param"] == "response_format" and err["type"] == "invalid_request_error", err
            assert needle in err["message"], err
    # The same on completions.
    st, _, body = raw(ctx.url + "/v1/completions", "POST", {"prompt": "a", "max_tokens": 4, "response_format": schema_format(bad, "bad")}, auth(ctx))
    assert st == 400 and "minContains" in body["error"]["message"], body


@test
def anthropic_structured_output(ctx):
    # Anthropic's output_config.format (the SDK's own parameter; the older beta's
    # output_format is taken too): the text block is JSON the schema accepts.
    schema = {"type": "object", "properties": {"animal": {"type": "string", "enum": ["cat", "dog", "bird"]}, "legs": {"type": "integer", "minimum": 0, "maximum": 8}}, "required": ["animal", "legs"], "additionalProperties": False}
    for temp in (0.0, 0.8):
        m = ctx.anthropic.messages.create(
            model=ctx.model, max_tokens=60, messages=[{"role": "user", "content": "Name an animal."}], output_config={"format": {"type": "json_schema", "schema": schema}}, extra_body={"temperature": temp}
        )
        if m.stop_reason == "max_tokens":
            continue
        assert m.stop_reason == "end_turn", m
        jsonschema.validate(json.loads(text_of(m)), schema)
    st, _, body = raw(ctx.url + "/v1/messages", "POST", {"model": ctx.model, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "output_format": {"type": "json_schema", "schema": {"type": "array", "uniqueItems": True}}}, auth(ctx))
    assert st == 400 and body["type"] == "error" and "uniqueItems" in body["error"]["message"], body


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}


@test
def forced_tool_call(ctx):
    # On any model: tool_choice "required" constrains decoding to a valid call.
    msgs = [{"role": "user", "content": "What's the weather like in Paris?"}]
    r = ctx.client.chat.completions.create(
        model=ctx.model, messages=msgs, tools=[WEATHER_TOOL], tool_choice="required", temperature=0, max_tokens=64
    )
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", r
    call = c.message.tool_calls[0]
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    assert "city" in json.loads(call.function.arguments)


@test
def tool_call_round_trip(ctx):
    if not ctx.tools_url:
        return "skip: no --tools-url (a server on Qwen2.5-Coder-0.5B)"
    client = OpenAI(base_url=ctx.tools_url + "/v1", api_key=ctx.key or "none", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    msgs = [
        {"role": "system", "content": "You are a helpful assistant. Use the tools when they help."},
        {"role": "user", "content": "What's the weather like in Paris today?"},
    ]
    r = client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER_TOOL], temperature=0, max_tokens=128)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", f"expected a call, got {c.message.content!r}"
    call = c.message.tool_calls[0]
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert "paris" in args["city"].lower(), args

    # Streamed, the same call arrives as tool_calls deltas.
    s = client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER_TOOL], temperature=0, max_tokens=128, stream=True)
    name, sargs, reason = None, "", None
    for chunk in s:
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                if tc.function and tc.function.name:
                    name = tc.function.name
                sargs += (tc.function.arguments or "") if tc.function else ""
            reason = ch.finish_reason or reason
    assert name == "get_weather" and reason == "tool_calls" and json.loads(sargs) == args, (name, sargs, reason)

    # The result goes back; the model answers in text using it.
    msgs.append({"role": "assistant", "content": None, "tool_calls": [call.model_dump()]})
    msgs.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"city": "Paris", "temperature_c": 21, "sky": "sunny"})})
    r2 = client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER_TOOL], temperature=0, max_tokens=64)
    c2 = r2.choices[0]
    assert c2.finish_reason in ("stop", "length") and c2.message.content, r2
    assert "21" in c2.message.content or "sunny" in c2.message.content.lower(), c2.message.content



# ---- Anthropic's Messages API ----

# Recent SDKs dropped `temperature` from create()'s signature; the API still takes it.
GREEDY = {"temperature": 0}

ANTHROPIC_WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Get the current weather in a given city",
    "input_schema": WEATHER_TOOL["function"]["parameters"],
}


def text_of(message):
    return "".join(b.text for b in message.content if b.type == "text")


@test
def anthropic_message(ctx):
    a = ctx.anthropic
    kw = dict(model=ctx.model, max_tokens=32, extra_body=GREEDY, system="You are terse.", messages=[{"role": "user", "content": "Name three colors."}])
    m = a.messages.create(**kw)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_"), m
    assert m.content and m.content[0].type == "text" and m.content[0].text, m
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None, m
    assert m.usage.input_tokens > 0 and 0 < m.usage.output_tokens <= 32, m.usage
    # The same conversation through the OpenAI route says the same (one chat pipeline).
    o = ctx.client.chat.completions.create(
        model=ctx.model, temperature=0, max_tokens=32, messages=[{"role": "system", "content": "You are terse."}, *kw["messages"]]
    )
    assert o.choices[0].message.content == text_of(m), (o.choices[0].message.content, text_of(m))
    assert o.usage.prompt_tokens == m.usage.input_tokens
    # Streamed: the SDK's accumulator sees the same message.
    with a.messages.stream(**kw) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text_of(m) and text_of(final) == text_of(m), (streamed, text_of(m))
    assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens, final
    # The raw events, in Anthropic's order.
    names = [e.type for e in a.messages.create(**kw, stream=True)]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    assert "content_block_start" in names and "content_block_stop" in names and "content_block_delta" in names, names
    # Content blocks in, max_tokens and stop sequences out.
    m2 = a.messages.create(model=ctx.model, max_tokens=3, extra_body=GREEDY, messages=[{"role": "user", "content": [{"type": "text", "text": "Name three colors."}]}])
    assert m2.stop_reason == "max_tokens" and m2.usage.output_tokens == 3, m2
    full = text_of(m)
    word = next(w for w in full.split()[1:] if len(w) > 3).strip(".,!:;")
    m3 = a.messages.create(**{**kw, "stop_sequences": [word, "zzzz"]})
    assert m3.stop_reason == "stop_sequence" and m3.stop_sequence == word, (word, m3)
    assert text_of(m3) == full[: full.index(word)], (text_of(m3), full, word)
    # count_tokens: the prompt as /v1/messages renders it.
    n = a.messages.count_tokens(model=ctx.model, system=kw["system"], messages=kw["messages"])
    assert n.input_tokens == m.usage.input_tokens, (n, m.usage)


@test
def anthropic_errors(ctx):
    a = ctx.anthropic

    def expect(status, kind, call):
        try:
            call()
        except anthropic.APIStatusError as e:
            assert e.status_code == status, (e.status_code, status, e)
            body = e.response.json()
            assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"], body
            return body
        raise AssertionError(f"expected {status}")

    msgs = [{"role": "user", "content": "hi"}]
    expect(400, "invalid_request_error", lambda: a.messages.create(model=ctx.model, max_tokens=4, messages=[]))
    expect(400, "invalid_request_error", lambda: a.messages.create(model=ctx.model, max_tokens=0, messages=msgs))
    expect(400, "invalid_request_error", lambda: a.messages.create(model=ctx.model, max_tokens=4, messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]))
    expect(404, "not_found_error", lambda: a.messages.create(model="no-such-model", max_tokens=4, messages=msgs))
    hdr = {"x-api-key": ctx.key or "none", "anthropic-version": "2023-06-01"}
    # max_tokens is required; bad JSON; the HTTP layer's own errors: all in Anthropic's shape.
    for body, ctype, want in [
        ({"model": ctx.model, "messages": msgs}, "application/json", 400),
        (b"{not json", "application/json", 400),
        (b"{}", "text/plain", 415),
        ({"prompt": "x" * (ctx.max_body + (16 << 10))}, "application/json", 413),
    ]:
        st, _, b = raw(ctx.url + "/v1/messages", "POST", body, {**hdr, "content-type": ctype})
        assert st == want and b["type"] == "error" and b["error"]["message"], (st, b)
    st, _, b = raw(ctx.url + "/v1/messages/nope", "POST", {}, hdr)
    assert st == 404 and b["error"]["type"] == "not_found_error", (st, b)
    st, _, b = raw(ctx.url + "/v1/messages", "GET", None, hdr)
    assert st == 405 and b["type"] == "error", (st, b)
    if ctx.key:
        bad = anthropic.Anthropic(base_url=ctx.url, api_key="wrong", max_retries=0)
        expect(401, "authentication_error", lambda: bad.messages.create(model=ctx.model, max_tokens=4, messages=msgs))
        # A bearer token is accepted too.
        st, _, b = raw(ctx.url + "/v1/messages", "POST", {"model": ctx.model, "max_tokens": 2, "messages": msgs}, {"authorization": f"Bearer {ctx.key}"})
        assert st == 200 and b["type"] == "message", (st, b)
    # The OpenAI routes keep OpenAI's shape.
    st, _, b = raw(ctx.url + "/v1/chat/completions", "POST", {"messages": []}, auth(ctx))
    assert st == 400 and "error" in b and "type" not in b, b


@test
def anthropic_forced_tool_use(ctx):
    # On any model: tool_choice "tool" constrains decoding to a valid call.
    a = ctx.anthropic
    kw = dict(
        model=ctx.model,
        max_tokens=64,
        extra_body=GREEDY,
        tools=[ANTHROPIC_WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "What's the weather like in Paris?"}],
    )
    m = a.messages.create(**kw)
    assert m.stop_reason == "tool_use", m
    use = [b for b in m.content if b.type == "tool_use"][0]
    assert use.id.startswith("toolu_") and use.name == "get_weather" and isinstance(use.input, dict) and "city" in use.input, use
    with a.messages.stream(**kw) as s:
        final = s.get_final_message()
    suse = [b for b in final.content if b.type == "tool_use"][0]
    assert final.stop_reason == "tool_use" and suse.name == use.name and suse.input == use.input, (final, m)


def anthropic_tool_round(client, model, msgs, stream):
    kw = dict(model=model, max_tokens=128, extra_body=GREEDY, tools=[ANTHROPIC_WEATHER_TOOL], messages=msgs,
              system="You are a helpful assistant. Use the tools when they help.")
    if not stream:
        return client.messages.create(**kw)
    with client.messages.stream(**kw) as s:
        for _ in s:
            pass
        return s.get_final_message()


@test
def anthropic_tool_round_trip(ctx):
    if not ctx.tools_url:
        return "skip: no --tools-url (a server on Qwen2.5-Coder-0.5B)"
    client = anthropic.Anthropic(base_url=ctx.tools_url, api_key=ctx.key or "none", max_retries=0, timeout=600)
    model = ctx.client.with_options(base_url=ctx.tools_url + "/v1").models.list().data[0].id
    msgs = [{"role": "user", "content": "What's the weather like in Paris today?"}]
    answers = []
    for stream in (False, True):
        m = anthropic_tool_round(client, model, msgs, stream)
        assert m.stop_reason == "tool_use", f"expected a call (stream={stream}), got {m.content!r}"
        use = [b for b in m.content if b.type == "tool_use"][0]
        assert use.name == "get_weather" and "paris" in use.input["city"].lower(), use
        # The result goes back as a tool_result block; the model answers in text.
        turn = msgs + [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": json.dumps({"city": "Paris", "temperature_c": 21, "sky": "sunny"})}]},
        ]
        m2 = anthropic_tool_round(client, model, turn, stream)
        assert m2.stop_reason in ("end_turn", "max_tokens"), m2
        text = text_of(m2)
        assert "21" in text or "sunny" in text.lower(), text
        answers.append((use.input, text))
    assert answers[0] == answers[1], answers

@test
def template_kwargs_pass_through(ctx):
    """chat_template_kwargs (and Anthropic's thinking) reach the template; a template that does
    not think (SmolLM2's, Qwen2.5's) answers as it did: no reasoning_content, the same text."""
    msgs = [{"role": "user", "content": "Name three colors."}]
    base = ctx.client.chat.completions.create(model=ctx.model, messages=msgs, temperature=0, max_tokens=16)
    off = ctx.client.chat.completions.create(model=ctx.model, messages=msgs, temperature=0, max_tokens=16, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert off.choices[0].message.content == base.choices[0].message.content, (off, base)
    assert off.usage.prompt_tokens == base.usage.prompt_tokens, (off.usage, base.usage)
    st, _, b = raw(ctx.url + "/v1/chat/completions", "POST", {"model": ctx.model, "messages": msgs, "temperature": 0, "max_tokens": 4}, auth(ctx))
    assert st == 200 and "reasoning_content" not in b["choices"][0]["message"], (st, b)
    st, _, b = raw(ctx.url + "/v1/chat/completions", "POST", {"model": ctx.model, "messages": msgs, "chat_template_kwargs": "x"}, auth(ctx))
    assert st == 400 and b["error"]["param"] == "chat_template_kwargs", (st, b)
    # Anthropic's thinking switch: a template that does not think ignores it.
    kw = dict(model=ctx.model, max_tokens=16, extra_body=GREEDY, messages=msgs)
    m = ctx.anthropic.messages.create(**kw)
    m2 = ctx.anthropic.messages.create(**kw, thinking={"type": "disabled"})
    assert [b.type for b in m2.content] == [b.type for b in m.content] and text_of(m2) == text_of(m), (m, m2)
    assert all(b.type != "thinking" for b in m.content), m



# ---- OpenAI's Responses API ----

TERSE = "You are terse."

RESPONSES_WEATHER_TOOL = {"type": "function", **WEATHER_TOOL["function"]}

STREAM_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def responses_stream(client, **kw):
    """The SDK's accumulating stream: (event types, sequence numbers, final response)."""
    with client.responses.stream(**kw) as s:
        events = list(s)
        final = s.get_final_response()
    return [e.type for e in events], [e.sequence_number for e in events], final


def expect_status(status, call):
    try:
        call()
    except openai.APIStatusError as e:
        assert e.status_code == status, (e.status_code, status, e)
        err = e.response.json()["error"]
        assert err["message"] and err["type"], err
        return err
    raise AssertionError(f"expected {status}")


@test
def responses_round_trip(ctx):
    c = ctx.client
    kw = dict(model=ctx.model, instructions=TERSE, input="Name three colors.", temperature=0, max_output_tokens=128)
    r = c.responses.create(**kw)
    assert r.object == "response" and r.id.startswith("resp_") and r.status == "completed", r
    assert [o.type for o in r.output] == ["message"] and r.output[0].role == "assistant", r.output
    text = r.output_text
    assert text and r.output[0].content[0].type == "output_text", r
    u = r.usage
    assert u.input_tokens > 0 and 0 < u.output_tokens <= 128 and u.total_tokens == u.input_tokens + u.output_tokens, u
    assert r.instructions == TERSE and r.max_output_tokens == 128 and r.temperature == 0, r
    # One chat pipeline: the chat route says the same for the same conversation.
    o = c.chat.completions.create(model=ctx.model, temperature=0, max_tokens=128, messages=[{"role": "system", "content": TERSE}, {"role": "user", "content": "Name three colors."}])
    assert o.choices[0].message.content == text and o.usage.prompt_tokens == u.input_tokens, (o, r)
    # The input as items says the same as the input as a string.
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Name three colors."}]}]
    assert c.responses.create(**{**kw, "input": items}).output_text == text
    # Streamed: the SDK accumulates the same response from the full event sequence.
    types, seqs, final = responses_stream(c, **kw)
    assert [t for t in STREAM_EVENTS if t in types] == STREAM_EVENTS, types
    assert types[:2] == STREAM_EVENTS[:2] and types[-1] == "response.completed", types
    assert seqs == list(range(len(seqs))), seqs
    assert final.status == "completed" and final.output_text == text, (final.output_text, text)
    assert final.usage.output_tokens == u.output_tokens and final.usage.input_tokens == u.input_tokens, final.usage
    # Cut by max_output_tokens: incomplete, as OpenAI says it.
    cut = c.responses.create(**{**kw, "max_output_tokens": 3})
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens" and cut.usage.output_tokens == 3, cut
    names = [e.type for e in c.responses.create(**{**kw, "max_output_tokens": 3}, stream=True)]
    assert names[0] == "response.created" and names[-1] == "response.incomplete", names


@test
def responses_previous_id_reuses_the_stored_prefix(ctx):
    c = ctx.client
    first = c.responses.create(model=ctx.model, instructions=TERSE, input="Name three colors.", temperature=0, max_output_tokens=48)
    kw = dict(model=ctx.model, instructions=TERSE, input="Name three more.", temperature=0, max_output_tokens=16)
    second = c.responses.create(**kw, previous_response_id=first.id)
    assert second.previous_response_id == first.id and second.status in ("completed", "incomplete"), second
    # The stored conversation (its input and its output) came first in the prompt ...
    fu, su = first.usage, second.usage
    assert su.input_tokens > fu.input_tokens + fu.output_tokens, (fu, su)
    # ... exactly as a client sending the whole conversation itself would render it ...
    whole = [
        {"role": "user", "content": "Name three colors."},
        {"role": "assistant", "content": [{"type": "output_text", "text": first.output_text}]},
        {"role": "user", "content": "Name three more."},
    ]
    explicit = c.responses.create(**{**kw, "input": whole})
    assert explicit.usage.input_tokens == su.input_tokens and explicit.output_text == second.output_text, (explicit, second)
    # ... and the K/V rows of the stored prompt and its output were reused, not prefilled again.
    again = c.responses.create(**kw, previous_response_id=first.id)
    assert again.usage.input_tokens_details.cached_tokens > fu.input_tokens, (fu, again.usage)
    # Streamed continuation: it ends as the unstreamed one did (completed, or incomplete where
    # max_output_tokens cut it: which depends on the machine's kernels' greedy text).
    events = list(c.responses.create(**kw, previous_response_id=first.id, stream=True))
    last = events[-1]
    assert last.type == f"response.{second.status}", ([e.type for e in events[-3:]], second.status)
    final = last.response
    assert final.previous_response_id == first.id and final.output_text == second.output_text, (final, second)
    # A stored response comes back whole.
    got = c.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text and got.usage.output_tokens == fu.output_tokens, got


@test
def responses_input_items(ctx):
    # The items a stored response was made from, as OpenAI lists them: its chain's earlier
    # input and output, then its own input, each with an id; newest first unless order="asc".
    c = ctx.client
    first = c.responses.create(model=ctx.model, instructions=TERSE, input="Name three colors.", temperature=0, max_output_tokens=8)
    page = c.responses.input_items.list(first.id)
    assert page.object == "list" and page.has_more is False, page
    [item] = page.data
    assert item.type == "message" and item.role == "user" and item.content[0].type == "input_text" and item.content[0].text == "Name three colors.", item
    assert item.id and page.first_id == page.last_id == item.id, page
    more = [{"role": "user", "content": "Name three more."}, {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Only one word each."}], "id": "msg_client"}]
    second = c.responses.create(model=ctx.model, instructions=TERSE, input=more, previous_response_id=first.id, temperature=0, max_output_tokens=8)
    asc = c.responses.input_items.list(second.id, order="asc")
    ids = [i.id for i in asc.data]
    assert len(ids) == 4 and len(set(ids)) == 4 and ids[0] == item.id and ids[1] == first.output[0].id and ids[3] == "msg_client", (ids, first.output)
    assert [i.type for i in asc.data] == ["message"] * 4 and [i.role for i in asc.data] == ["user", "assistant", "user", "user"], asc.data
    assert asc.data[1].content[0].text == first.output_text and asc.data[2].content[0].text == "Name three more.", asc.data
    desc = c.responses.input_items.list(second.id)
    assert [i.id for i in desc.data] == ids[::-1] and desc.first_id == ids[3] and desc.last_id == ids[0], desc
    # A page at a time: limit and the cursor; the SDK's auto-pagination follows has_more.
    p1 = c.responses.input_items.list(second.id, order="asc", limit=3)
    assert [i.id for i in p1.data] == ids[:3] and p1.has_more is True and p1.last_id == ids[2], p1
    p2 = c.responses.input_items.list(second.id, order="asc", limit=3, after=p1.last_id)
    assert [i.id for i in p2.data] == ids[3:] and p2.has_more is False, p2
    assert [i.id for i in c.responses.input_items.list(second.id, limit=1)] == ids[::-1]
    assert [i.id for i in c.responses.input_items.list(second.id, order="asc", limit=2)] == ids
    # The first response's listing is unchanged by its continuation.
    assert [i.id for i in c.responses.input_items.list(first.id).data] == [item.id]
    # Bad queries are 400s naming the parameter; a response not held is a 404.
    for kw, param in [({"limit": 0}, "limit"), ({"limit": 101}, "limit"), ({"after": "msg_nosuch"}, "after"), ({"extra_query": {"order": "sideways"}}, "order")]:
        err = expect_status(400, lambda: c.responses.input_items.list(second.id, **kw))
        assert err["param"] == param and err["type"] == "invalid_request_error", (kw, err)
    err = expect_status(404, lambda: c.responses.input_items.list("resp_doesnotexist"))
    assert "resp_doesnotexist" in err["message"], err
    unstored = c.responses.create(model=ctx.model, input="Say hi.", temperature=0, max_output_tokens=2, store=False)
    expect_status(404, lambda: c.responses.input_items.list(unstored.id))
    c.responses.delete(second.id)
    expect_status(404, lambda: c.responses.input_items.list(second.id))


@test
def responses_not_held_is_404(ctx):
    c = ctx.client
    kw = dict(model=ctx.model, input="Say hi.", temperature=0, max_output_tokens=2)
    err = expect_status(404, lambda: c.responses.create(**kw, previous_response_id="resp_doesnotexist"))
    assert err["param"] == "previous_response_id" and "resp_doesnotexist" in err["message"], err
    unstored = c.responses.create(**kw, store=False)
    assert unstored.store is False, unstored
    expect_status(404, lambda: c.responses.create(**kw, previous_response_id=unstored.id))
    expect_status(404, lambda: c.responses.retrieve(unstored.id))
    # A streamed one with store: false is not kept either.
    events = list(c.responses.create(**kw, store=False, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.store is False, events[-1]
    expect_status(404, lambda: c.responses.retrieve(events[0].response.id))
    # Deleted: gone.
    kept = c.responses.create(**kw)
    assert c.responses.retrieve(kept.id).id == kept.id
    c.responses.delete(kept.id)
    expect_status(404, lambda: c.responses.retrieve(kept.id))
    expect_status(404, lambda: c.responses.create(**kw, previous_response_id=kept.id))


@test
def responses_store_drops_the_oldest(ctx):
    if not ctx.max_stored:
        return "skip: no --max-stored (the server's --max-stored-responses)"
    c = ctx.client
    kw = dict(model=ctx.model, input="Say hi.", temperature=0, max_output_tokens=1)
    ids = [c.responses.create(**kw).id for _ in range(ctx.max_stored + 1)]
    expect_status(404, lambda: c.responses.retrieve(ids[0]))
    expect_status(404, lambda: c.responses.input_items.list(ids[0]))
    assert len(c.responses.input_items.list(ids[1]).data) == 1
    expect_status(404, lambda: c.responses.create(**kw, previous_response_id=ids[0]))
    for i in ids[1:]:
        assert c.responses.retrieve(i).id == i, i


@test
def responses_structured_output(ctx):
    c = ctx.client
    fmt = {"format": {"type": "json_schema", "name": "order", "schema": ORDER_SCHEMA, "strict": False}}
    done = 0
    for seed, temp in [(0, 0.0), (1, 0.7), (2, 1.0), (3, 1.3)]:
        r = c.responses.create(model=ctx.model, input="Make up an order for a customer as JSON.", text=fmt, temperature=temp, max_output_tokens=400, extra_body={"seed": seed})
        if r.status == "incomplete":
            continue
        assert r.status == "completed", r
        jsonschema.validate(json.loads(r.output_text), ORDER_SCHEMA)
        done += 1
    assert done >= 2, f"only {done} of 4 answers finished within max_output_tokens"
    _, _, final = responses_stream(c, model=ctx.model, input="Make up an order for a customer as JSON.", text=fmt, temperature=0, max_output_tokens=400)
    if final.status == "completed":
        jsonschema.validate(json.loads(final.output_text), ORDER_SCHEMA)
    r = c.responses.create(model=ctx.model, input="Describe a cat in JSON.", text={"format": {"type": "json_object"}}, temperature=0, max_output_tokens=300)
    if r.status == "completed":
        assert isinstance(json.loads(r.output_text), dict), r.output_text
    err = expect_status(400, lambda: c.responses.create(model=ctx.model, input="hi", text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "array", "uniqueItems": True, "contains": {"const": 1}, "minContains": 2}}}))
    assert err["param"] == "text.format" and "minContains" in err["message"], err


@test
def responses_unsupported_fields_are_named(ctx):
    c = ctx.client
    kw = dict(model=ctx.model, input="hi", max_output_tokens=2)
    for extra, param, needle in [
        ({"tools": [{"type": "web_search"}]}, "tools[0]", "web_search"),
        ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools[0]", "file_search"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/x.png"}]}]}, "input[0].content[0]", "input_image"),
        ({"background": True}, "background", "background"),
        ({"truncation": "auto"}, "truncation", "truncation"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice", "web_search_preview"),
    ]:
        err = expect_status(400, lambda: c.responses.create(**{**kw, **extra}))
        assert err["param"] == param and needle in err["message"] and err["type"] == "invalid_request_error", (extra, err)


@test
def responses_forced_function_call(ctx):
    # On any model: a forced call is a valid call, streamed and not.
    c = ctx.client
    kw = dict(model=ctx.model, input="What's the weather like in Paris?", tools=[RESPONSES_WEATHER_TOOL], tool_choice="required", temperature=0, max_output_tokens=64)
    r = c.responses.create(**kw)
    calls = [o for o in r.output if o.type == "function_call"]
    assert r.status == "completed" and calls and calls[0].name == "get_weather", r.output
    assert calls[0].call_id.startswith("call_") and "city" in json.loads(calls[0].arguments), calls[0]
    types, _, final = responses_stream(c, **{**kw, "tool_choice": {"type": "function", "name": "get_weather"}})
    scalls = [o for o in final.output if o.type == "function_call"]
    assert scalls and json.loads(scalls[0].arguments) == json.loads(calls[0].arguments), (final.output, r.output)
    for t in ["response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done", "response.completed"]:
        assert t in types, (t, types)


@test
def responses_function_call_round_trip(ctx):
    if not ctx.tools_url:
        return "skip: no --tools-url (a server on Qwen2.5-Coder-0.5B)"
    client = ctx.client.with_options(base_url=ctx.tools_url + "/v1", timeout=600)
    model = client.models.list().data[0].id
    kw = dict(model=model, instructions="You are a helpful assistant. Use the tools when they help.", tools=[RESPONSES_WEATHER_TOOL], temperature=0, max_output_tokens=128)
    result = json.dumps({"city": "Paris", "temperature_c": 21, "sky": "sunny"})
    answers = []
    for stream in (False, True):
        ask = dict(kw, input="What's the weather like in Paris today?")
        r = responses_stream(client, **ask)[2] if stream else client.responses.create(**ask)
        calls = [o for o in r.output if o.type == "function_call"]
        assert r.status == "completed" and calls, f"expected a call (stream={stream}), got {r.output!r}"
        call = calls[0]
        assert call.name == "get_weather" and "paris" in json.loads(call.arguments)["city"].lower(), call
        # The result goes back as a function_call_output, continuing the stored response.
        back = dict(kw, previous_response_id=r.id, input=[{"type": "function_call_output", "call_id": call.call_id, "output": result}])
        r2 = responses_stream(client, **back)[2] if stream else client.responses.create(**back)
        assert r2.status in ("completed", "incomplete") and r2.output_text, r2
        assert "21" in r2.output_text or "sunny" in r2.output_text.lower(), r2.output_text
        answers.append((json.loads(call.arguments), r2.output_text))
    assert answers[0] == answers[1], answers


# What the synthetic Qwen3 thinker writes after Qwen3's generation prompt (common/qwen3.rs).
THINKER_REASONING = "The user wants four."
THINKER_ANSWER = "Four!"


def thinker(ctx):
    """The OpenAI and Anthropic clients on the thinker's server, and its model id."""
    client = ctx.client.with_options(base_url=ctx.thinking_url + "/v1", api_key="none")
    return client, ctx.anthropic.with_options(base_url=ctx.thinking_url, api_key="none"), client.models.list().data[0].id


@test
def reasoning_the_model_writes(ctx):
    # The thinker opens <think> itself: its reasoning is reasoning_content (chat) and a
    # reasoning item (Responses), streamed and not, and never the answer's text.
    if not ctx.thinking_url:
        return "skip: no --thinking-url (a server on the synthetic Qwen3 thinker)"
    client, _, model = thinker(ctx)
    msgs = [{"role": "user", "content": "What is 2+2?"}]
    r = client.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=32)
    m = r.choices[0].message
    assert (m.model_extra.get("reasoning_content"), m.content, r.choices[0].finish_reason) == (THINKER_REASONING, THINKER_ANSWER, "stop"), r
    reasoning, content = "", ""
    for ch in client.chat.completions.create(model=model, messages=msgs, temperature=0, max_tokens=32, stream=True):
        if ch.choices:
            d = ch.choices[0].delta
            reasoning += (d.model_extra or {}).get("reasoning_content") or ""
            content += d.content or ""
    assert (reasoning, content) == (THINKER_REASONING, THINKER_ANSWER), (reasoning, content)
    kw = dict(model=model, input="What is 2+2?", temperature=0, max_output_tokens=32)
    whole = client.responses.create(**kw)
    types, _, final = responses_stream(client, **kw)
    for resp in (whole, final):
        assert [o.type for o in resp.output] == ["reasoning", "message"] and resp.status == "completed", resp.output
        assert resp.output[0].content[0].text == THINKER_REASONING and resp.output_text == THINKER_ANSWER, resp.output
    assert "response.reasoning_text.delta" in types and types.index("response.reasoning_text.delta") < types.index("response.output_text.delta"), types


@test
def anthropic_thinking_is_signed(ctx):
    # Anthropic's thinking blocks carry a signature (streamed as a signature_delta that the
    # SDK accumulates), and a conversation that sends them back is accepted. (At Anthropic's
    # default temperature 1: the thinker's margin makes its sampled output its greedy one.)
    if not ctx.thinking_url:
        return "skip: no --thinking-url (a server on the synthetic Qwen3 thinker)"
    _, client, model = thinker(ctx)
    kw = dict(model=model, max_tokens=32, messages=[{"role": "user", "content": "What is 2+2?"}], thinking={"type": "enabled", "budget_tokens": 1024})
    m = client.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "text"] and m.stop_reason == "end_turn", m
    think = m.content[0]
    assert think.thinking == THINKER_REASONING and m.content[1].text == THINKER_ANSWER, m
    assert len(base64.b64decode(think.signature, validate=True)) == 32, think.signature
    with client.messages.stream(**kw) as s:
        events = list(s)
        final = s.get_final_message()
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert deltas.count("signature_delta") == 1 and deltas[deltas.index("signature_delta") - 1] == "thinking_delta", deltas
    assert "thinking" in [e.type for e in events] and "signature" in [e.type for e in events], [e.type for e in events]
    assert final.content[0].type == "thinking" and final.content[0].thinking == think.thinking and final.content[0].signature == think.signature, final
    assert final.content[1].text == THINKER_ANSWER and final.stop_reason == "end_turn", final
    # The SDK's own blocks sent back, then another question: accepted.
    again = client.messages.create(**{**kw, "messages": kw["messages"] + [{"role": "assistant", "content": final.content}, {"role": "user", "content": "And 3+3?"}]})
    assert again.stop_reason == "end_turn", again

    # In a tool loop the signed reasoning reaches the prompt; altered or redacted, it is
    # accepted and left out.
    def tool_loop(blocks):
        return [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": blocks + [{"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 2}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "4"}]},
        ]

    signed = [{"type": "thinking", "thinking": think.thinking, "signature": think.signature}]
    altered = [{"type": "thinking", "thinking": "The user wants five.", "signature": think.signature}]
    redacted = [{"type": "redacted_thinking", "data": "b3BhcXVl"}]
    counts = [client.messages.count_tokens(model=model, messages=tool_loop(b)).input_tokens for b in (signed, altered, redacted, [])]
    assert counts[0] > counts[3] and counts[1] == counts[2] == counts[3], counts
    for b in (signed, altered, redacted):
        r = client.messages.create(model=model, max_tokens=8, messages=tool_loop(b))
        assert r.stop_reason in ("end_turn", "max_tokens"), r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url", nargs="?", default=os.environ.get("RESIN_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--api-key", default=os.environ.get("RESIN_API_KEY"))
    ap.add_argument("--tools-url", default=os.environ.get("RESIN_TOOLS_URL"))
    ap.add_argument("--thinking-url", default=os.environ.get("RESIN_THINKING_URL"), help="a server on the synthetic Qwen3 thinker")
    ap.add_argument("--max-body", type=int, default=int(os.environ.get("RESIN_MAX_BODY", 4 << 20)), help="the server's body limit in bytes")
    ap.add_argument("--max-stored", type=int, default=None, help="the server's --max-stored-responses (for the store's bound)")
    ap.add_argument("-k", help="run only tests whose name contains this")
    a = ap.parse_args()
    ctx = Ctx(a.url, a.api_key, a.tools_url, a.max_body, a.max_stored, a.thinking_url)
    tests = [f for f in globals().values() if getattr(f, "is_test", False) and (not a.k or a.k in f.__name__)]
    for t in tests:
        try:
            note = t(ctx)
            if isinstance(note, str) and note.startswith("skip"):
                RESULTS["skipped"] += 1
                print(f"SKIP {t.__name__}: {note[5:].strip()}")
            else:
                RESULTS["passed"] += 1
                print(f"PASS {t.__name__}")
        except Exception:
            RESULTS["failed"] += 1
            print(f"FAIL {t.__name__}\n{traceback.format_exc()}")
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed, {RESULTS['skipped']} skipped")
    sys.exit(1 if RESULTS["failed"] else 0)


if __name__ == "__main__":
    main()
