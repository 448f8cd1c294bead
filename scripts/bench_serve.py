#!/usr/bin/env python3
"""Load generator for any OpenAI-compatible server (resin serve, llama-server, ...).

    python3 scripts/bench_serve.py URL [-c 1,8,32] [-n REQUESTS] [--max-tokens 128] [--model ID]

Each of C clients sends streaming /v1/chat/completions requests back to back (greedy, a fixed
max_tokens, ignore_eos where the server honours it) until N requests have finished. Reports
aggregate generated tokens/s (tokens counted from the stream's chunks, or from usage when the
server sends it), and p50 / p99 time to first token. Needs aiohttp (pip install aiohttp).
Prints one JSON line a concurrency level; --markdown adds a table.
"""

import argparse
import asyncio
import json
import statistics
import sys
import time

try:
    import aiohttp
except ImportError:
    sys.exit("bench_serve.py needs aiohttp: pip install aiohttp")

PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "Explain how a refrigerator works.",
    "Describe the city of Paris to a child.",
    "List some uses of copper and explain each.",
    "What makes a good cup of tea?",
    "Tell me about the history of the bicycle.",
    "How do bees make honey?",
    "Write a poem about autumn rain.",
]


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


async def one(session, url, model, prompt, max_tokens, headers):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    t0 = time.perf_counter()
    ttft = None
    chunks = 0
    usage_tokens = None
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {await r.text()}")
        buf = b""
        async for data in r.content.iter_any():
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == b"[DONE]":
                        continue
                    v = json.loads(payload)
                    if v.get("usage"):
                        usage_tokens = v["usage"].get("completion_tokens")
                    for ch in v.get("choices", []):
                        d = ch.get("delta", {})
                        if d.get("content") or d.get("tool_calls"):
                            if ttft is None:
                                ttft = time.perf_counter() - t0
                            chunks += 1
    return ttft, usage_tokens if usage_tokens is not None else chunks, time.perf_counter() - t0


async def level(url, model, conc, total, max_tokens, headers):
    timeout = aiohttp.ClientTimeout(total=3600)
    connector = aiohttp.TCPConnector(limit=conc)
    ttfts, tokens, errors = [], 0, 0
    queue = list(range(total))
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as s:

        async def client(ci):
            nonlocal tokens, errors
            while queue:
                i = queue.pop()
                try:
                    ttft, n, _ = await one(s, url, model, PROMPTS[(i + ci) % len(PROMPTS)], max_tokens, headers)
                    if ttft is not None:
                        ttfts.append(ttft)
                    tokens += n
                except Exception as e:  # noqa: BLE001 - counted and reported
                    errors += 1
                    print(f"request failed: {e}", file=sys.stderr)

        t0 = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(conc)))
        wall = time.perf_counter() - t0
    return {
        "concurrency": conc,
        "requests": total,
        "errors": errors,
        "generated_tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 2) if wall > 0 else 0.0,
        "ttft_p50_ms": round(pct(ttfts, 50) * 1e3, 1),
        "ttft_p99_ms": round(pct(ttfts, 99) * 1e3, 1),
        "ttft_mean_ms": round(statistics.fmean(ttfts) * 1e3, 1) if ttfts else float("nan"),
    }


async def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url", help="server base URL, e.g. http://127.0.0.1:8080")
    ap.add_argument("-c", "--concurrency", default="1,8,32", help="comma-separated client counts")
    ap.add_argument("-n", "--requests", type=int, default=0, help="requests per level (default: 2 per client, at least 4)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model", default=None, help="model id (default: the first of /v1/models)")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--label", default="", help="a name for the server in the output")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    url = a.url.rstrip("/")
    headers = {"authorization": f"Bearer {a.api_key}"} if a.api_key else {}
    model = a.model
    if model is None:
        async with aiohttp.ClientSession() as s:
            async with s.get(url + "/v1/models", headers=headers) as r:
                model = (await r.json())["data"][0]["id"]
    rows = []
    for c in [int(x) for x in a.concurrency.split(",") if x]:
        n = a.requests or max(4, 2 * c)
        res = await level(url, model, c, n, a.max_tokens, headers)
        res["server"] = a.label or url
        res["model"] = model
        print(json.dumps(res), flush=True)
        rows.append(res)
    if a.markdown:
        print("\n| server | clients | requests | tokens/s | TTFT p50 ms | TTFT p99 ms | errors |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['server']} | {r['concurrency']} | {r['requests']} | {r['tokens_per_s']} | {r['ttft_p50_ms']} | {r['ttft_p99_ms']} | {r['errors']} |")


if __name__ == "__main__":
    asyncio.run(main())
