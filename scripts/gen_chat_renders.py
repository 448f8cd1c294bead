#!/usr/bin/env python3
"""Writes the expected chat-template renders that crates/model/tests/chat.rs checks.

Each template (SmolLM2's and Qwen2.5-Coder's, read from the GGUF files, plus a synthetic one
that exercises tojson options, Python string methods and loop controls) renders a handful of
conversations with Python Jinja2, set up exactly as Hugging Face transformers'
`_compile_jinja_template` does (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, its own `tojson`, `raise_exception`, `strftime_now`) and called as
`apply_chat_template` calls it (messages, tools, documents=None, add_generation_prompt, the
special tokens). The output files hold the template text too, so the Rust test needs no model.

    pip install gguf jinja2
    python3 scripts/gen_chat_renders.py [SMOLLM2_GGUF] [QWEN05_GGUF]
    python3 scripts/gen_chat_renders.py --qwen3    # only qwen3.json (its template is in testdata)

Model paths default to $RESIN_TEST_SMOLLM2 / $RESIN_TEST_QWEN05, then ~/.cache/resin-dev/models.
"""

import json
import os
import sys
from datetime import datetime
from pathlib import Path

import gguf
import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "crates" / "model" / "tests" / "data" / "chat"
MODELS = Path.home() / ".cache" / "resin-dev" / "models"


def compile_hf(template: str):
    """transformers.utils.chat_template_utils._compile_jinja_template, minus the
    {% generation %} tracker (no template here uses it)."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)


def render(template, messages, tools, add_generation_prompt, bos_token, eos_token, extra=None):
    kwargs = dict(extra or {})
    if bos_token is not None:
        kwargs["bos_token"] = bos_token
    if eos_token is not None:
        kwargs["eos_token"] = eos_token
    return compile_hf(template).render(
        messages=messages, tools=tools, documents=None, add_generation_prompt=add_generation_prompt, **kwargs
    )


def gguf_template(path):
    r = gguf.GGUFReader(str(path))
    f = r.fields
    tmpl = f["tokenizer.chat_template"].contents()
    tokens = f["tokenizer.ggml.tokens"].contents()

    def tok(key):
        return tokens[int(f[key].contents())] if key in f else None

    return tmpl, tok("tokenizer.ggml.bos_token_id"), tok("tokenizer.ggml.eos_token_id")


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo actuelle d'une ville — « current weather » 🌦",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 1},
                    "threshold": {"type": "number", "default": 0.5},
                },
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_code",
            "description": "Runs Python code.\nReturns stdout.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    },
]

SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in one line."}


def conversations(content_none_ok):
    """(name, messages, tools, add_generation_prompt). `content_none_ok`: the template copes with
    an assistant message whose content is null (SmolLM2's concatenates it and cannot)."""
    call_content = None if content_none_ok else ""
    convs = [
        ("user_only", [{"role": "user", "content": "The capital of France is?"}], None, True),
        (
            "multi_turn",
            [
                SYSTEM,
                {"role": "user", "content": "Hi!"},
                {"role": "assistant", "content": "Hello. How can I help?"},
                {"role": "user", "content": "Quote: \"a\\b\" <tag> & 'x'\n\ttabbed — 日本語 🦙"},
            ],
            None,
            True,
        ),
        (
            "multi_turn_no_prompt",
            [
                SYSTEM,
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4"},
            ],
            None,
            False,
        ),
        (
            "tools_no_system",
            [{"role": "user", "content": "Weather in Paris?"}],
            TOOLS,
            True,
        ),
        (
            "tools_full_exchange",
            [
                SYSTEM,
                {"role": "user", "content": "Weather in Paris and Zürich, then run print(1)."},
                {
                    "role": "assistant",
                    "content": call_content,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius", "days": 2}},
                        },
                        {
                            "id": "call_2",
                            "type": "function",
                            "function": {
                                "name": "get_weather",
                                "arguments": {"city": "Zürich", "threshold": 0.25, "flags": [True, None, 1.0], "z": {"b": 1, "a": 2}},
                            },
                        },
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
                {"role": "tool", "tool_call_id": "call_2", "content": "11 °C, rain"},
                {
                    "role": "assistant",
                    "content": "Calling code.",
                    "tool_calls": [{"name": "run_code", "arguments": {"code": "print(1)\n"}}],
                },
                {"role": "tool", "content": "1\n"},
                {"role": "assistant", "content": "Paris 21 °C clear; Zürich 11 °C rain; the code printed 1."},
                {"role": "user", "content": "Thanks"},
            ],
            TOOLS,
            True,
        ),
    ]
    return convs


# Exercises what HF templates lean on beyond the two real ones.
SYNTHETIC = """{%- set ns = namespace(sys='', n=0) -%}
{%- for m in messages -%}
  {%- if m.role == 'system' %}{% set ns.sys = m.content.strip() %}{% continue %}{% endif -%}
  {%- set ns.n = ns.n + 1 -%}
  {%- if m.role not in ['user', 'assistant', 'tool'] %}{{ raise_exception('bad role: ' + m.role) }}{% endif %}
[{{ loop.index0 }}:{{ m.role | upper }}] {{ m.content | trim }}
  {%- if m.content.startswith('#') %} (heading){% endif %}
  {%- if m.content.endswith('?') %} (question){% endif %}
  {% for w in m.content.split(' ') %}{% if loop.index > 3 %}{% break %}{% endif %}<{{ w.lstrip('#').rstrip('?') }}>{% endfor %}

  {%- if m.tool_calls is defined and m.tool_calls %}
    {%- for c in m.tool_calls %}
      {%- set f = c.function if c.function is defined else c %}
call {{ f.name }} {{ f.arguments | tojson }}
sorted {{ f.arguments | tojson(sort_keys=true) }}
compact {{ f.arguments | tojson(separators=(',', ':')) }}
ascii {{ f.arguments | tojson(ensure_ascii=true) }}
pretty {{ f.arguments | tojson(indent=2) }}
    {%- endfor %}
  {%- endif %}
{% endfor -%}
system={{ ns.sys | replace('terse', 'brief') }} turns={{ ns.n }} none={{ none }} flag={{ add_generation_prompt }}
{% if tools is not none %}tools:
{% for t in tools %}{{ t.function.name }}: {{ t.function.parameters | tojson }}
{% for k, v in t.function.parameters.properties.items() %}  - {{ k }} ({{ v.type }})
{% endfor %}{% endfor %}{% endif %}
{%- if bos_token is defined %}bos={{ bos_token }}{% endif %} eos={{ eos_token }}
{% if add_generation_prompt %}<assistant>
{% endif %}
"""


def write(name, template, bos, eos, convs):
    cases = []
    for conv in convs:
        cname, messages, tools, agp = conv[:4]
        extra = conv[4] if len(conv) > 4 else None
        expected = render(template, messages, tools, agp, bos, eos, extra)
        case = {"name": cname, "messages": messages, "tools": tools, "add_generation_prompt": agp, "expected": expected}
        if extra:
            case["kwargs"] = extra
        cases.append(case)
    doc = {
        "generator": "scripts/gen_chat_renders.py (Python Jinja2 %s, HF apply_chat_template settings)" % jinja2.__version__,
        "template": template,
        "bos_token": bos,
        "eos_token": eos,
        "cases": cases,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{path.relative_to(ROOT)}: {len(cases)} cases")


# Qwen3's template (Qwen/Qwen3-0.6B .. 32B, tokenizer_config.json's chat_template), which thinks
# in <think>...</think> and takes `enable_thinking`; no Qwen3 GGUF ships here.
QWEN3 = (ROOT / "testdata" / "templates" / "qwen3.jinja").read_text(encoding="utf-8")


def qwen3_conversations():
    user = [{"role": "user", "content": "The capital of France is?"}]
    return conversations(content_none_ok=True) + [
        ("thinking_off", user, None, True, {"enable_thinking": False}),
        ("thinking_on", user, None, True, {"enable_thinking": True}),
        (
            "reasoning_in_history",
            [
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4", "reasoning_content": "Two and two make four."},
                {"role": "user", "content": "And 3+3?"},
                {"role": "assistant", "content": "<think>\nThree and three.\n</think>\n\n6"},
            ],
            None,
            False,
        ),
    ]


def main():
    if sys.argv[1:] == ["--qwen3"]:
        write("qwen3", QWEN3, None, "<|im_end|>", qwen3_conversations())
        return
    smol = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RESIN_TEST_SMOLLM2", MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    qwen = Path(sys.argv[2] if len(sys.argv) > 2 else os.environ.get("RESIN_TEST_QWEN05", MODELS / "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"))

    tmpl, bos, eos = gguf_template(smol)
    write("smollm2", tmpl, bos, eos, conversations(content_none_ok=False))

    tmpl, bos, eos = gguf_template(qwen)
    write("qwen2.5-coder", tmpl, bos, eos, conversations(content_none_ok=True))

    write("synthetic", SYNTHETIC, "<s>", "</s>", conversations(content_none_ok=False))
    write("synthetic-no-bos", SYNTHETIC, None, "</s>", conversations(content_none_ok=False)[:2])
    write("qwen3", QWEN3, None, "<|im_end|>", qwen3_conversations())


if __name__ == "__main__":
    main()
