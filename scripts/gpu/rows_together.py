# Rows stepped together equal each row stepped alone, end to end through `resin serve`: greedy
# completions of 4 two-token prompts (BOS and a word) one at a time (one-row decode steps),
# then all 4 at once (N-row steps; their 8 prompt rows fit one peel, so no window). Exits 1 when
# any differs. On the GPU machine, with a server on a synthetic file:
#   .kit/resin serve --model /tmp/w/llama3.2-1b-q8_0.gguf --gpu vulkan --parallel 8 --port 8399 &
#   python3 scripts/gpu/rows_together.py http://127.0.0.1:8399
import json, sys, threading, urllib.request
url = sys.argv[1]
prompts = ["Hello", "The", "Once", "In"]
def ask(p):
    body = json.dumps({"prompt": p, "max_tokens": 48, "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=120))["choices"][0]["text"]
alone = [ask(p) for p in prompts]
together = [None] * len(prompts)
def run(i):
    together[i] = ask(prompts[i])
ts = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
[t.start() for t in ts]
[t.join() for t in ts]
same = sum(a == b for a, b in zip(alone, together))
distinct = len(set(alone))
print(f"{same} of {len(prompts)} together equal alone; {distinct} distinct outputs alone")
for i, (a, b) in enumerate(zip(alone, together)):
    if a != b:
        print(f"prompt {i} differs:\n  alone    {a!r}\n  together {b!r}")
sys.exit(0 if same == len(prompts) else 1)
