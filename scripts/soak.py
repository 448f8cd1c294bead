#!/usr/bin/env python3
"""Soak test for `resin serve`: mixed traffic at a fixed concurrency for a fixed time.

Traffic: chat and text completions, streams, forced tool calls, cancellations (a stream read
for a few chunks, then closed), disconnects (a request abandoned before its answer) and bad
requests (malformed JSON, wrong types, wrong Content-Type). Reports throughput, errors by kind,
p50/p99 latency per kind and the server's resident memory over time.

Exits 1 on any 5xx, on a good request answered with anything but 200 or 429, on a bad request
answered with anything but a 4xx, on `resin_active_sessions` not back to 0 within 10 s after the
load stops, or on resident memory growing past --max-rss-growth-mib (the last idle sample
against the peak of the warm-up, the first tenth of the run).

    scripts/soak.py --url http://127.0.0.1:8080 --pid $(pgrep -n resin) --seconds 600
    scripts/soak.py --start "target/release/resin serve --model smollm2-135m --parallel 4 --port 8091" \\
        --url http://127.0.0.1:8091 --seconds 60

Needs Python 3.9+ and aiohttp.
"""

import argparse
import asyncio
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict

try:
    import aiohttp
except ImportError:  # pragma: no cover
    sys.exit("soak.py needs aiohttp (pip install aiohttp)")

# Kind of request -> weight in the mix.
MIX = {
    "chat": 20,
    "completion": 15,
    "stream": 20,
    "tool_call": 10,
    "cancel": 10,
    "disconnect": 8,
    "bad_json": 5,
    "bad_type": 6,
    "bad_content_type": 6,
}
BAD = {"bad_json", "bad_type", "bad_content_type"}
PROMPTS = [
    "Say hi.",
    "Count from one to ten.",
    "Name three colours.",
    "Write a haiku about rivers.",
    "What is the capital of France?",
    "Explain what a CPU does in one sentence.",
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    }
]


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


def rss_mib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Stats:
    def __init__(self):
        self.lat = defaultdict(list)  # kind -> seconds, requests that went as expected
        self.outcomes = Counter()  # (kind, outcome)
        self.failures = Counter()  # reason -> count (these fail the run)
        self.examples = {}  # reason -> one example
        self.tokens = 0
        self.done = 0

    def ok(self, kind, seconds, tokens=0):
        self.lat[kind].append(seconds)
        self.outcomes[(kind, "ok")] += 1
        self.tokens += tokens
        self.done += 1

    def outcome(self, kind, what, fail=False, example=None):
        self.outcomes[(kind, what)] += 1
        self.done += 1
        if fail:
            reason = f"{kind}: {what}"
            self.failures[reason] += 1
            if example is not None and reason not in self.examples:
                self.examples[reason] = str(example)[:300]


class Soak:
    def __init__(self, args, model):
        self.a = args
        self.url = args.url.rstrip("/")
        self.model = model
        self.stats = Stats()
        self.rng = random.Random(args.seed)
        self.headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}

    def messages(self):
        return [{"role": "user", "content": self.rng.choice(PROMPTS)}]

    def max_tokens(self):
        return self.rng.randint(4, self.a.max_tokens)

    def check_status(self, kind, status, body):
        """Returns True when the status is what `kind` expects; records the outcome otherwise."""
        if status >= 500:
            self.stats.outcome(kind, f"http_{status}", fail=True, example=body)
            return False
        if kind in BAD:
            want = 415 if kind == "bad_content_type" else 400
            if status == want:
                return True
            self.stats.outcome(kind, f"http_{status}", fail=not (400 <= status < 500), example=body)
            return False
        if status == 200:
            return True
        # 429: the queue is full; expected under overload, reported, not a failure.
        self.stats.outcome(kind, f"http_{status}", fail=status != 429, example=body)
        return False

    async def post(self, s, path, **kw):
        return s.post(self.url + path, headers={**self.headers, **kw.pop("headers", {})}, **kw)

    async def one(self, s, kind):
        t0 = time.monotonic()
        st = self.stats
        if kind in ("chat", "completion", "tool_call"):
            if kind == "chat":
                path, body = "/v1/chat/completions", {"messages": self.messages(), "max_tokens": self.max_tokens()}
            elif kind == "completion":
                path, body = "/v1/completions", {"prompt": self.rng.choice(PROMPTS), "max_tokens": self.max_tokens()}
            else:
                path = "/v1/chat/completions"
                body = {
                    "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                    "tools": TOOLS,
                    "tool_choice": "required",
                    "max_tokens": 64,
                }
            body.update(model=self.model, temperature=self.rng.choice([0, 0.7]))
            async with await self.post(s, path, json=body) as r:
                text = await r.text()
                if not self.check_status(kind, r.status, text):
                    return
                try:
                    v = json.loads(text)
                    choice = v["choices"][0]
                    # A forced call cut by max_tokens ends with finish_reason "length" and its
                    # partial arguments as text: a truncation, not a wrong answer.
                    if kind == "tool_call" and choice.get("finish_reason") == "length":
                        st.outcome(kind, "truncated")
                        return
                    if kind == "tool_call" and not choice["message"].get("tool_calls"):
                        raise ValueError("no tool_calls in a tool_choice=required answer")
                    tokens = v.get("usage", {}).get("completion_tokens", 0)
                except (ValueError, KeyError, IndexError, TypeError) as e:
                    st.outcome(kind, "bad_answer", fail=True, example=f"{e}: {text}")
                    return
            st.ok(kind, time.monotonic() - t0, tokens)
        elif kind in ("stream", "cancel"):
            body = {"model": self.model, "messages": self.messages(), "stream": True}
            body["max_tokens"] = self.max_tokens() if kind == "stream" else 256
            async with await self.post(s, "/v1/chat/completions", json=body) as r:
                if not self.check_status(kind, r.status, await r.text() if r.status != 200 else ""):
                    return
                chunks, done, want = 0, False, self.rng.randint(1, 4)
                async for line in r.content:
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    ev = json.loads(data)
                    if "error" in ev:
                        st.outcome(kind, "error_event", fail=True, example=data)
                        return
                    chunks += 1
                    if kind == "cancel" and chunks >= want:
                        r.close()  # drops the connection mid-stream
                        st.ok(kind, time.monotonic() - t0, chunks)
                        return
                if not done:
                    st.outcome(kind, "no_done", fail=kind == "stream", example=f"{chunks} chunks")
                    return
            st.ok(kind, time.monotonic() - t0, chunks)
        elif kind == "disconnect":
            body = {"model": self.model, "messages": self.messages(), "max_tokens": 200}
            wait = self.rng.uniform(0.05, 0.5)
            try:
                async with await self.post(s, "/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=wait)) as r:
                    text = await r.text()
                    if self.check_status(kind, r.status, text):
                        st.outcome(kind, "answered_first")
                    return
            except asyncio.TimeoutError:
                st.ok(kind, time.monotonic() - t0)
        else:
            if kind == "bad_json":
                kw = {"data": b'{"messages": [{"role": "user", "content": "hi"', "headers": {"Content-Type": "application/json"}}
            elif kind == "bad_type":
                kw = {"json": self.rng.choice([
                    {"messages": "hi"},
                    {"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"},
                    {"messages": [{"role": "user", "content": "hi"}], "temperature": [1]},
                    {"prompt": 5, "max_tokens": 4},
                ])}
            else:
                kw = {"data": json.dumps({"messages": self.messages(), "max_tokens": 4}).encode(),
                      "headers": {"Content-Type": self.rng.choice(["text/plain", "application/x-www-form-urlencoded"])}}
            path = "/v1/completions" if "prompt" in kw.get("json", {}) else "/v1/chat/completions"
            async with await self.post(s, path, **kw) as r:
                text = await r.text()
                if not self.check_status(kind, r.status, text):
                    return
                try:
                    assert json.loads(text)["error"]["message"]
                except (ValueError, KeyError, TypeError, AssertionError):
                    st.outcome(kind, "error_not_json", fail=True, example=text)
                    return
            st.ok(kind, time.monotonic() - t0)

    async def worker(self, s, deadline):
        kinds, weights = zip(*MIX.items())
        while time.monotonic() < deadline:
            kind = self.rng.choices(kinds, weights)[0]
            try:
                await asyncio.wait_for(self.one(s, kind), timeout=self.a.request_timeout)
            except asyncio.TimeoutError:
                self.stats.outcome(kind, "timeout", fail=True, example=f"no answer in {self.a.request_timeout} s")
            except (aiohttp.ClientError, ConnectionError, json.JSONDecodeError) as e:
                self.stats.outcome(kind, type(e).__name__, fail=True, example=e)


async def get_text(s, url, headers=None):
    async with s.get(url, headers=headers or {}, timeout=aiohttp.ClientTimeout(total=10)) as r:
        return r.status, await r.text()


async def active_sessions(s, url, headers):
    _, text = await get_text(s, url + "/metrics", headers)
    m = re.search(r"^resin_active_sessions\s+(\S+)", text, re.M)
    return float(m.group(1)) if m else None


async def wait_healthy(url, proc, limit):
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as s:
        while time.monotonic() - t0 < limit:
            if proc is not None and proc.poll() is not None:
                sys.exit(f"the server exited with {proc.returncode} before it was ready")
            try:
                status, _ = await get_text(s, url + "/health")
                if status == 200:
                    return
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass
            await asyncio.sleep(0.5)
    sys.exit(f"the server was not healthy within {limit} s")


async def run(args, proc):
    url = args.url.rstrip("/")
    await wait_healthy(url, proc, args.start_timeout)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    conn = aiohttp.TCPConnector(limit=args.concurrency * 2)
    async with aiohttp.ClientSession(connector=conn) as s:
        model = args.model
        if not model:
            _, text = await get_text(s, url + "/v1/models", headers)
            model = json.loads(text)["data"][0]["id"]
        soak = Soak(args, model)
        rss = []  # (seconds since start, MiB)
        t_start = time.monotonic()
        deadline = t_start + args.seconds
        print(f"soak: {args.seconds} s at concurrency {args.concurrency} against {url} (model {model})", flush=True)

        async def sampler():
            last_print = 0.0
            while True:
                t = time.monotonic() - t_start
                if args.pid:
                    m = rss_mib(args.pid)
                    if m is not None:
                        rss.append((t, m))
                if t - last_print >= args.report_every:
                    last_print = t
                    r = f" rss {rss[-1][1]:.0f} MiB" if rss else ""
                    print(f"  t={t:6.1f}s done {soak.stats.done:6d} failures {sum(soak.stats.failures.values())}{r}", flush=True)
                await asyncio.sleep(1)

        sam = asyncio.create_task(sampler())
        await asyncio.gather(*(soak.worker(s, deadline) for _ in range(args.concurrency)))
        elapsed = time.monotonic() - t_start

        # Idle: every session must be freed.
        leaked = None
        t_idle = time.monotonic()
        while True:
            try:
                n = await active_sessions(s, url, headers)
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                n, leaked = None, f"/metrics failed: {e}"
            if n == 0:
                leaked = None
                break
            if time.monotonic() - t_idle > 10:
                leaked = leaked or f"resin_active_sessions is {n} 10 s after the load stopped"
                break
            await asyncio.sleep(0.25)
        idle_after = time.monotonic() - t_idle
        await asyncio.sleep(1)
        sam.cancel()
        if args.pid:
            m = rss_mib(args.pid)
            if m is not None:
                rss.append((time.monotonic() - t_start, m))
    return report(args, soak.stats, elapsed, rss, leaked, idle_after)


def report(args, st, elapsed, rss, leaked, idle_after):
    total = sum(st.outcomes.values())
    print(f"\nrequests: {total} in {elapsed:.1f} s = {total / elapsed:.2f}/s; "
          f"completion tokens (and stream chunks) {st.tokens} = {st.tokens / elapsed:.1f}/s")
    print(f"{'kind':18} {'ok':>6} {'other':>6} {'p50 ms':>8} {'p99 ms':>8}  other outcomes")
    for kind in MIX:
        oks = st.outcomes[(kind, "ok")]
        other = {w: n for (k, w), n in st.outcomes.items() if k == kind and w != "ok"}
        lat = st.lat[kind]
        print(f"{kind:18} {oks:6d} {sum(other.values()):6d} {pct(lat, 50) * 1000:8.0f} {pct(lat, 99) * 1000:8.0f}  "
              + ", ".join(f"{w}={n}" for w, n in sorted(other.items())))
    all_lat = [x for k in MIX if k not in BAD for x in st.lat[k]]
    print(f"all generating requests: p50 {pct(all_lat, 50) * 1000:.0f} ms, p99 {pct(all_lat, 99) * 1000:.0f} ms")
    failed = []
    if st.failures:
        failed.append("failures: " + ", ".join(f"{r} x{n}" for r, n in st.failures.most_common()))
        for r, ex in st.examples.items():
            print(f"  e.g. {r}: {ex}")
    print(f"sessions: " + (leaked or f"back to 0 {idle_after:.1f} s after the load stopped"))
    if leaked:
        failed.append(leaked)
    if rss:
        warm_end = max(args.seconds / 10, 2)
        warm = [m for t, m in rss if t <= warm_end] or [rss[0][1]]
        base, peak, last = max(warm), max(m for _, m in rss), rss[-1][1]
        step = max(1, len(rss) // 10)
        print("rss MiB over time: " + ", ".join(f"{t:.0f}s {m:.0f}" for t, m in rss[::step]) + f", {rss[-1][0]:.0f}s {last:.0f}")
        growth = last - base
        print(f"rss: warm {base:.0f} MiB, peak {peak:.0f} MiB, idle at the end {last:.0f} MiB, growth {growth:+.0f} MiB "
              f"(bound {args.max_rss_growth_mib} MiB)")
        if growth > args.max_rss_growth_mib:
            failed.append(f"resident memory grew {growth:.0f} MiB (bound {args.max_rss_growth_mib})")
    elif args.pid:
        failed.append(f"could not read /proc/{args.pid}/status")
    else:
        print("rss: not measured (give --pid or --start)")
    if failed:
        print("\nSOAK FAILED: " + "; ".join(failed))
        return 1
    print("\nsoak passed")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the server's base URL")
    p.add_argument("--seconds", type=float, default=60, help="how long to send traffic")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    p.add_argument("--pid", type=int, help="the server's process id, for its resident memory")
    p.add_argument("--start", help='start the server with this command line (e.g. "resin serve --port 8091"), stop it at the end')
    p.add_argument("--server-log", help="with --start, where the server's output goes (default: a temporary file, named at the end)")
    p.add_argument("--start-timeout", type=float, default=600, help="seconds to wait for /health after --start")
    p.add_argument("--max-rss-growth-mib", type=float, default=256)
    p.add_argument("--max-tokens", type=int, default=48, help="the largest max_tokens of a generating request")
    p.add_argument("--request-timeout", type=float, default=300, help="a request with no answer this long is a failure")
    p.add_argument("--report-every", type=float, default=10, help="seconds between progress lines")
    p.add_argument("--model", help="the model id to send (default: the first of /v1/models)")
    p.add_argument("--api-key", default=os.environ.get("RESIN_API_KEY"))
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    if args.concurrency < 1 or args.seconds <= 0:
        p.error("--concurrency and --seconds must be positive")
    proc = None
    if args.start:
        if not args.server_log:
            fd, args.server_log = tempfile.mkstemp(prefix="resin-soak-", suffix=".log")
            os.close(fd)
        log = open(args.server_log, "wb")
        proc = subprocess.Popen(shlex.split(args.start), stdout=log, stderr=subprocess.STDOUT)
        args.pid = args.pid or proc.pid
    rc = 1
    try:
        rc = asyncio.run(run(args, proc))
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            print(f"server exited with {code} after SIGTERM; its log: {args.server_log}")
            if code != 0 and rc == 0:
                rc = 1
    sys.exit(rc)


if __name__ == "__main__":
    main()
