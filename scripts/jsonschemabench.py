#!/usr/bin/env python3
"""Structured outputs on JSONSchemaBench's schemas against a running `resin serve`.

    python3 scripts/jsonschemabench.py BENCH_DATA_DIR [--url URL] [--compile-per-dataset 100]
        [--generate-per-dataset 20] [--max-tokens 192] [--markdown]

BENCH_DATA_DIR is the `data/` folder of a checkout of github.com/guidance-ai/jsonschemabench
(one folder a dataset: Github_easy, Kubernetes, ...; one schema a file). The subset is the
first N files of each dataset in name order, so a run is repeatable.

Two passes, each request a chat completion with the schema as
`response_format: {"type": "json_schema", "json_schema": {"name", "schema"}}` (no `strict`: the
schema means what JSON Schema says):

- compile: `max_tokens: 1` on the first --compile-per-dataset schemas. 200 means resin compiled
  the schema into its grammar; 400 means it refused it, and the message names why (llguidance's
  `Unimplemented keys: [...]`, an unsatisfiable or malformed schema); anything else is an error.
- generate: the first --generate-per-dataset schemas resin compiled, up to --max-tokens tokens
  at temperature 0.7 (seeded). An answer that finished (`stop`) is validated with `jsonschema`
  (the schema's own draft, formats checked): valid or invalid. One cut by max_tokens is
  unfinished (its JSON is incomplete by construction); one whose schema `jsonschema` itself
  cannot use (a remote `$ref`, ...) is unchecked.

Prints one JSON line a dataset and the totals (and a markdown table with --markdown), and the
refusal reasons, most common first. Needs `jsonschema` (pip install jsonschema).
"""

import argparse
import collections
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

try:
    import jsonschema
except ImportError:
    sys.exit("jsonschemabench.py needs jsonschema: pip install jsonschema")

DATASETS = ["Github_trivial", "Github_easy", "Github_medium", "Github_hard", "Github_ultra", "Glaiveai2K", "Kubernetes", "Snowplow", "JsonSchemaStore", "WashingtonPost"]


def post(url, body, key, timeout):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), time.perf_counter() - t0
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw), time.perf_counter() - t0
        except ValueError:
            return e.code, {"error": {"message": raw.decode(errors="replace")}}, time.perf_counter() - t0


def request(schema, name, max_tokens, seed):
    title = schema.get("title") if isinstance(schema, dict) else None
    what = f"'{title}'" if isinstance(title, str) and title else f"the schema {name}"
    return {
        "messages": [{"role": "user", "content": f"Write one example JSON value for {what}."[:300]}],
        "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}},
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "seed": seed,
    }


def reason(message):
    """A refusal's reason, short enough to count: llguidance's unimplemented keys, or the
    message's first clause."""
    m = re.search(r"Unimplemented keys: \[[^\]]*\]", message)
    if m:
        return m.group(0)
    m = re.search(r"cannot be enforced: (.*)", message)
    text = m.group(1) if m else message
    return re.split(r"[\n.](?:\s|$)", text, maxsplit=1)[0][:120]


def check(schema, value):
    """'valid', 'invalid' (with why) or 'unchecked' (jsonschema cannot use the schema)."""
    try:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        cls.check_schema(schema)
        v = cls(schema, format_checker=cls.FORMAT_CHECKER)
        err = jsonschema.exceptions.best_match(v.iter_errors(value))
    except Exception as e:  # a remote $ref, a schema jsonschema refuses, ...
        return "unchecked", f"{type(e).__name__}: {e}"[:160]
    return ("valid", "") if err is None else ("invalid", f"{'/'.join(map(str, err.absolute_path))}: {err.message}"[:200])


def load(data, dataset, n):
    d = os.path.join(data, dataset)
    if not os.path.isdir(d):
        return []
    out = []
    for f in sorted(os.listdir(d)):
        if len(out) == n:
            break
        if not f.endswith(".json"):
            continue
        with open(os.path.join(d, f), encoding="utf-8") as fh:
            try:
                out.append((f"{dataset}/{f}", json.load(fh)))
            except ValueError:
                continue
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="the data/ folder of a jsonschemabench checkout")
    ap.add_argument("--url", default=os.environ.get("RESIN_URL", "http://127.0.0.1:8080"))
    ap.add_argument("--api-key", default=os.environ.get("RESIN_API_KEY"))
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--compile-per-dataset", type=int, default=100)
    ap.add_argument("--generate-per-dataset", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--details", help="write every schema's outcome here (JSON lines)")
    a = ap.parse_args()
    url = a.url.rstrip("/")
    reasons = collections.Counter()
    invalid = []
    rows = []
    details = open(a.details, "w") if a.details else None
    pool = ThreadPoolExecutor(a.concurrency)
    for ds in a.datasets.split(","):
        schemas = load(a.data, ds, a.compile_per_dataset)
        if not schemas:
            print(f"# {ds}: no schemas under {a.data}", file=sys.stderr)
            continue
        row = collections.Counter(dataset=0)
        compiled = []
        t0 = time.perf_counter()

        def compile_one(item):
            name, schema = item
            safe = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]
            return item, post(url, request(schema, safe, 1, 0), a.api_key, a.timeout)

        lat = []
        for (name, schema), (st, body, dt) in pool.map(compile_one, schemas):
            row["schemas"] += 1
            lat.append(dt)
            if st == 200:
                row["compiled"] += 1
                compiled.append((name, schema))
                outcome = {"schema": name, "compile": "ok"}
            elif st == 400:
                row["refused"] += 1
                r = reason(body.get("error", {}).get("message", ""))
                reasons[r] += 1
                outcome = {"schema": name, "compile": "refused", "why": r}
            else:
                row["errors"] += 1
                outcome = {"schema": name, "compile": f"status {st}", "why": json.dumps(body)[:200]}
            if details:
                details.write(json.dumps(outcome) + "\n")
        compile_s = time.perf_counter() - t0

        def generate_one(item):
            name, schema = item
            safe = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]
            return item, post(url, request(schema, safe, a.max_tokens, 1), a.api_key, a.timeout)

        for (name, schema), (st, body, dt) in pool.map(generate_one, compiled[: a.generate_per_dataset]):
            row["generated"] += 1
            if st != 200:
                row["gen_errors"] += 1
                outcome = {"schema": name, "generate": f"status {st}", "why": json.dumps(body)[:200]}
            else:
                c = body["choices"][0]
                if c["finish_reason"] != "stop":
                    row["unfinished"] += 1
                    outcome = {"schema": name, "generate": "unfinished"}
                else:
                    try:
                        value = json.loads(c["message"]["content"])
                        verdict, why = check(schema, value)
                    except ValueError as e:
                        verdict, why = "invalid", f"not JSON: {e}"
                    row[verdict] += 1
                    if verdict == "invalid":
                        invalid.append((name, why, c["message"]["content"][:200]))
                    outcome = {"schema": name, "generate": verdict, "why": why}
            if details:
                details.write(json.dumps(outcome) + "\n")
        out = {"dataset": ds, **{k: row[k] for k in ["schemas", "compiled", "refused", "errors", "generated", "unfinished", "valid", "invalid", "unchecked", "gen_errors"]}}
        out["compile_s"] = round(compile_s, 1)
        out["compile_p50_ms"] = round(sorted(lat)[len(lat) // 2] * 1e3, 1)
        rows.append(out)
        print(json.dumps(out), flush=True)
    total = collections.Counter()
    for r in rows:
        for k, v in r.items():
            if isinstance(v, int):
                total[k] += v
    print(json.dumps({"dataset": "total", **total}))
    print("\n# refusal reasons (most common first)")
    for r, n in reasons.most_common(25):
        print(f"{n:5d}  {r}")
    if invalid:
        print("\n# invalid answers")
        for name, why, text in invalid:
            print(f"{name}: {why}\n    {text!r}")
    if a.markdown:
        print("\n| dataset | schemas | compiled | refused (400) | errors | generated | valid | invalid | unfinished | unchecked |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows + [{"dataset": "**total**", **total}]:
            print(
                f"| {r['dataset']} | {r['schemas']} | {r['compiled']} | {r['refused']} | {r['errors']} | {r['generated']} "
                f"| {r['valid']} | {r['invalid']} | {r['unfinished']} | {r['unchecked']} |"
            )
    if details:
        details.close()


if __name__ == "__main__":
    main()
