#!/usr/bin/env python3
"""Independent float32 reference forward pass for resin's correctness tests.

What this is: a plain numpy implementation of the llama / qwen2 / qwen3 / qwen3moe / gemma3
decoder (RMSNorm, GQA attention with rope -- NORM pairs for llama, NEOX halves for the others --,
q/k/v biases when present, per-head q/k RMS norms when present (qwen3, qwen3moe), SwiGLU FFN,
tied or separate output head) over weights dequantized to float32 with the `gguf` Python package
(not with resin's code).

Mixture of experts (qwen3moe; llama files with `llama.expert_count`, as Mixtral's), as llama.cpp's
build_moe_ffn computes it with softmax gating and normalised weights: router logits
`ffn_gate_inp @ h`, softmax over every expert, the `expert_used_count` largest probabilities
(ties to the lower index), those divided by their sum; the FFN output is the weighted sum of the
chosen experts' SwiGLU FFNs, read from the stacked `ffn_{gate,up,down}_exps` tensors. gemma3 adds, as its Hugging Face
implementation defines them: the embedding times sqrt(n_embd), per-head RMS norms of q and k,
RMS norms of the attention output and of the FFN output before their residual adds, GeGLU (tanh
GELU), queries scaled by 1/sqrt(head_dim) (query_pre_attn_scalar = 256 for the 270M),
sliding-window layers (every layer but each 6th sees its last `sliding_window` keys and ropes
with base 10,000) and final logit soft-capping when the file carries it. Greedy decoding; no BOS
for llama / qwen2, BOS first for gemma3 (its add_bos_token is true and Gemma is not meant to run
without it). The prompt is run as one causal batch, then tokens are decoded one by one against a
K/V cache.

Prompt ids come from a plain word lookup in the GGUF vocabulary (first word bare, later words
with the space marker: GPT-2's 'Ġ', SentencePiece's '▁' for gemma3), so no tokenizer is
involved. For "The capital of France is" the ids must equal the ones published in MODELS.md, and
the greedy continuation must start with the published ids (checked here, where published).

For every prompt it records the greedy ids, the top-2 logit margin at each step (= the top-2
log-probability margin), the first step whose margin is below 0.1 (past it a quantizing engine
may legitimately diverge), and for the first step the top-200 logits.

usage: scripts/reference_forward.py [--model NAME_OR_PATH]... [--out-dir testdata/reference] [--gen 16]
       [--name NAME] [--prompt-ids 1,2,3]...
       --prompt-ids gives a prompt as token ids (files without a word vocabulary, e.g. `resin synth`'s
       tiny shapes); --name names the output file (default: the registry name or the file name).
       NAME is smollm2-135m, qwen2.5-coder-0.5b, qwen2.5-coder-1.5b or gemma3-270m; a name is looked up in
       $RESIN_CACHE/models, ~/.cache/resin/models and ~/.cache/resin-dev/models.
Needs: numpy, gguf. Memory: about 4 bytes per parameter (1.5B: ~7 GB).
"""
import argparse, hashlib, json, os, sys, time
import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize

MODELS = {  # name -> (file name, sha256, published next ids for the France prompt)
    'smollm2-135m': ('SmolLM2-135M-Instruct.Q4_1.gguf',
                     'b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53',
                     [504, 3575, 282, 4649, 314], [7042, 30, 198, 198, 504, 2988, 314, 42, 216, 34, 32, 33]),
    'qwen2.5-coder-0.5b': ('Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf',
                           '1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32',
                           [785, 6722, 315, 9625, 374], [12095, 13, 12095, 374, 7407, 304, 279, 10200, 30282, 949]),
    'qwen2.5-coder-1.5b': ('Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf',
                           'cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046',
                           [785, 6722, 315, 9625, 374], [12095, 13, 12095, 374, 279, 7772, 3283, 304, 9625, 323]),
    'gemma3-270m': ('gemma-3-270m-q4_k_m.gguf',
                    'a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818', None, None),
}
FRANCE = 'The capital of France is'
PROMPTS = [FRANCE, 'The largest planet in the solar system is', 'Once upon a time there was a',
           'One two three four five', 'My favorite food is']
NEAR_TIE = 0.1


def find_model(arg):
    if os.path.isfile(arg):
        name = next((n for n, m in MODELS.items() if m[0] == os.path.basename(arg)), os.path.basename(arg))
        return name, arg
    if arg not in MODELS:
        sys.exit(f'unknown model {arg!r}; known: {", ".join(MODELS)}')
    dirs = [os.path.join(os.environ['RESIN_CACHE'], 'models')] if os.environ.get('RESIN_CACHE') else []
    dirs += [os.path.expanduser('~/.cache/resin/models'), os.path.expanduser('~/.cache/resin-dev/models')]
    for d in dirs:
        p = os.path.join(d, MODELS[arg][0])
        if os.path.isfile(p):
            return arg, p
    sys.exit(f'{MODELS[arg][0]} not found in {dirs} (fetch it with resin\'s hub first)')


def sha256(path):
    h = hashlib.sha256()
    with open(path, 'rb') as f:
        for b in iter(lambda: f.read(1 << 22), b''):
            h.update(b)
    return h.hexdigest()


class Model:
    def __init__(self, path):
        r = GGUFReader(path)
        self.r = r

        def fv(k):
            f = r.fields[k]
            if f.types[0] == GGUFValueType.STRING:
                return bytes(f.parts[f.data[0]]).decode()
            if f.types[0] == GGUFValueType.ARRAY:
                if f.types[1] == GGUFValueType.STRING:
                    return [bytes(f.parts[i]).decode('utf-8', 'replace') for i in f.data]
                return [f.parts[i][0] for i in f.data]
            return f.parts[f.data[0]][0]
        self.arch = a = fv('general.architecture')
        if a not in ('llama', 'qwen2', 'qwen3', 'qwen3moe', 'gemma3'):
            sys.exit(f'arch {a} not supported')
        self.gemma = a == 'gemma3'
        self.L = int(fv(f'{a}.block_count')); self.D = int(fv(f'{a}.embedding_length'))
        self.H = int(fv(f'{a}.attention.head_count')); self.HKV = int(fv(f'{a}.attention.head_count_kv'))
        self.eps = np.float32(fv(f'{a}.attention.layer_norm_rms_epsilon'))
        self.base = float(fv(f'{a}.rope.freq_base'))
        opt = lambda k, d: fv(k) if k in r.fields else d
        self.hd = int(opt(f'{a}.attention.key_length', self.D // self.H))
        self.scale = np.float32(1 / np.sqrt(self.hd))
        # gemma3: a sliding window on every layer but each 6th (Gemma 3's layer pattern), those
        # layers roping with their own base; the rest see every key.
        self.window = int(opt(f'{a}.attention.sliding_window', 0)) if self.gemma else 0
        self.local = [self.window > 0 and l % 6 < 5 for l in range(self.L)]
        self.base_local = float(opt(f'{a}.rope.freq_base_swa', 10000.0))
        self.softcap = float(opt(f'{a}.final_logit_softcapping', 0.0))
        if self.gemma and f'{a}.attention.sliding_window_pattern' in r.fields:
            sys.exit('this reference knows only the default sliding-window pattern')
        self.n_expert = int(opt(f'{a}.expert_count', 0))
        self.n_used = int(opt(f'{a}.expert_used_count', 0))
        if a == 'qwen3moe' and self.n_expert == 0:
            sys.exit('a qwen3moe file without experts')
        if self.n_expert and not 0 < self.n_used <= self.n_expert:
            sys.exit(f'expert_used_count {self.n_used} of {self.n_expert} experts')
        self.bos = int(fv('tokenizer.ggml.bos_token_id')) if self.gemma else None
        self.tokens = fv('tokenizer.ggml.tokens')
        self.tok2id = {t: i for i, t in enumerate(self.tokens)}
        T = {t.name: t for t in r.tensors}

        def W(name):
            t = T[name]
            a = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
            shape = tuple(int(x) for x in reversed(t.shape))  # numpy order: [rows, cols]
            return np.ascontiguousarray(a.reshape(shape))
        t0 = time.time()
        self.emb = W('token_embd.weight')
        self.out = W('output.weight') if 'output.weight' in T else self.emb
        self.layers = []
        for l in range(self.L):
            p = f'blk.{l}.'
            names = ['attn_norm', 'attn_q', 'attn_k', 'attn_v', 'attn_output', 'ffn_norm']
            # Experts: ffn_gate_inp [E, D] and the stacked [E, F, D] / [E, D, F] experts.
            names += ['ffn_gate_inp', 'ffn_gate_exps', 'ffn_up_exps', 'ffn_down_exps'] if self.n_expert else ['ffn_gate', 'ffn_up', 'ffn_down']
            if self.gemma:
                names += ['post_attention_norm', 'post_ffw_norm']
            if p + 'attn_q_norm.weight' in T:
                names += ['attn_q_norm', 'attn_k_norm']
            d = {k: W(p + k + '.weight') for k in names}
            for b in ['attn_q', 'attn_k', 'attn_v']:
                d[b + '_b'] = W(p + b + '.bias') if p + b + '.bias' in T else np.float32(0)
            self.layers.append(d)
        self.onorm = W('output_norm.weight')
        print(f'  {a}: L={self.L} D={self.D} H={self.H}/{self.HKV} hd={self.hd}, dequantized in {time.time() - t0:.1f}s',
              file=sys.stderr)
        self.neox = a != 'llama'
        self.inv = self.base ** (-np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)
        self.inv_local = self.base_local ** (-np.arange(0, self.hd, 2, dtype=np.float64) / self.hd)
        self.space = '\u2581' if self.gemma else '\u0120'
        self.router_margins = []  # per routed (layer, row): logit of the last chosen expert minus the next
        self.routes = []  # the experts each (layer, row) chose, in order of computation

    def words_to_ids(self, words):
        ids = [] if self.bos is None else [self.bos]
        for i, w in enumerate(words.split(' ')):
            key = w if i == 0 else self.space + w
            if key not in self.tok2id:
                raise SystemExit(f'token {key!r} not in vocab')
            ids.append(self.tok2id[key])
        return ids

    def rms(self, x, w):  # x: [T, D]
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, pos, inv):  # x: [T, nh, hd], pos: [T]
        ang = pos[:, None].astype(np.float64) * inv[None, :]  # [T, hd/2]
        c = np.cos(ang).astype(np.float32)[:, None, :]; s = np.sin(ang).astype(np.float32)[:, None, :]
        hd = self.hd
        if self.neox:
            a, b = x[..., :hd // 2], x[..., hd // 2:]
            return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)
        a, b = x[..., 0::2], x[..., 1::2]
        o = np.empty_like(x); o[..., 0::2] = a * c - b * s; o[..., 1::2] = a * s + b * c
        return o

    def route(self, logits):
        """(experts, weights) of one row: the top expert_used_count softmax probabilities, renormalised."""
        p = np.exp(logits - logits.max()); p /= p.sum()
        order = np.argsort(-p, kind='stable'); sel = order[:self.n_used]
        if self.n_used < self.n_expert:
            self.router_margins.append(float(logits[order[self.n_used - 1]] - logits[order[self.n_used]]))
        w = p[sel] / max(p[sel].sum(), np.float32(6.103515625e-5))
        return sel, w.astype(np.float32)

    def moe(self, h, d):  # h: [n, D] -> [n, D]
        out = np.zeros_like(h)
        for i, hi in enumerate(h):
            sel, w = self.route(d['ffn_gate_inp'] @ hi)
            for e, we in zip(sel, w):
                gt = d['ffn_gate_exps'][e] @ hi; u = d['ffn_up_exps'][e] @ hi
                out[i] += we * (d['ffn_down_exps'][e] @ (gt / (1 + np.exp(-gt)) * u))
        return out

    def forward(self, ids, cache):
        """Runs tokens `ids` (positions continue after those in `cache`); returns the last row's logits."""
        n = len(ids); p0 = cache['n']; pos = np.arange(p0, p0 + n)
        H, HKV, hd = self.H, self.HKV, self.hd; g = H // HKV
        x = self.emb[np.array(ids)]  # [n, D]
        if self.gemma:
            x = x * np.float32(np.sqrt(self.D))
        for l, d in enumerate(self.layers):
            h = self.rms(x, d['attn_norm'])
            q = h @ d['attn_q'].T + d['attn_q_b']; k = h @ d['attn_k'].T + d['attn_k_b']; v = h @ d['attn_v'].T + d['attn_v_b']
            q = q.reshape(n, H, hd); k = k.reshape(n, HKV, hd)
            if 'attn_q_norm' in d:
                q = self.rms(q, d['attn_q_norm']); k = self.rms(k, d['attn_k_norm'])
            inv = self.inv_local if self.local[l] else self.inv
            q = self.rope(q, pos, inv); k = self.rope(k, pos, inv)
            K = cache['k'][l] = np.concatenate([cache['k'][l], k]) if p0 else k  # [t, HKV, hd]
            V = cache['v'][l] = np.concatenate([cache['v'][l], v.reshape(n, HKV, hd)]) if p0 else v.reshape(n, HKV, hd)
            t = p0 + n
            # scores [H, n, t]; head hh uses kv head hh // g
            Kh = np.repeat(K.transpose(1, 0, 2), g, axis=0)  # [H, t, hd]
            Vh = np.repeat(V.transpose(1, 0, 2), g, axis=0)
            s = np.matmul(q.transpose(1, 0, 2), Kh.transpose(0, 2, 1)) * self.scale
            mask = np.arange(t)[None, :] > pos[:, None]  # [n, t], key position after query position
            if self.local[l]:  # and keys at or past `window` positions back
                mask |= pos[:, None] - np.arange(t)[None, :] >= self.window
            s = np.where(mask[None], np.float32(-np.inf), s)
            s = np.exp(s - s.max(axis=-1, keepdims=True)); s /= s.sum(axis=-1, keepdims=True)
            o = np.matmul(s, Vh).transpose(1, 0, 2).reshape(n, H * hd)  # [n, D]
            o = o @ d['attn_output'].T
            if self.gemma:
                o = self.rms(o, d['post_attention_norm'])
            x = x + o
            h = self.rms(x, d['ffn_norm'])
            if self.n_expert:
                f = self.moe(h, d)
            else:
                gt = h @ d['ffn_gate'].T; u = h @ d['ffn_up'].T
                if self.gemma:  # GELU, tanh approximation
                    act = np.float32(0.5) * gt * (1 + np.tanh(np.float32(np.sqrt(2 / np.pi)) * (gt + np.float32(0.044715) * gt ** 3)))
                else:
                    act = gt / (1 + np.exp(-gt))
                f = (act * u) @ d['ffn_down'].T
            if self.gemma:
                f = self.rms(f, d['post_ffw_norm'])
            x = x + f
        cache['n'] = p0 + n
        logits = self.out @ self.rms(x[-1:], self.onorm)[0]
        if self.softcap > 0:
            logits = np.float32(self.softcap) * np.tanh(logits / np.float32(self.softcap))
        return logits


def run_case(m, prompt, ngen, ntop, ids=None):
    ids = m.words_to_ids(prompt) if ids is None else ids
    m.router_margins = []
    cache = {'n': 0, 'k': [None] * m.L, 'v': [None] * m.L}
    logits = m.forward(ids, cache)
    out, margins, top = [], [], None
    for i in range(ngen):
        order = np.argsort(-logits, kind='stable')
        if i == 0:
            top = {'ids': [int(j) for j in order[:ntop]], 'values': [round(float(logits[j]), 4) for j in order[:ntop]]}
        cur = int(order[0]); out.append(cur)
        margins.append(round(float(logits[order[0]] - logits[order[1]]), 4))
        if i + 1 < ngen:
            logits = m.forward([cur], cache)
    tie = next((i for i, mg in enumerate(margins) if mg < NEAR_TIE), None)
    text = ''.join(m.tokens[j] for j in out).replace(m.space, ' ').replace('\u010a', '\n')
    # The smallest router margin over every (layer, row) routed: where it is tiny an engine's
    # rounding may pick another expert (a discrete change no logit bar covers).
    extra = {'min_router_margin': round(min(m.router_margins), 4)} if m.router_margins else {}
    return {'prompt': prompt, 'prompt_ids': ids, 'greedy_ids': out, 'text': text, 'margins': margins,
            'first_near_tie': tie, 'top_logits': top, **extra}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--model', action='append', help='registry name or .gguf path (repeatable; default: smollm2 and qwen 0.5b)')
    ap.add_argument('--out-dir', default=os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'testdata', 'reference'))
    ap.add_argument('--gen', type=int, default=16)
    ap.add_argument('--top', type=int, default=200)
    ap.add_argument('--prompt', action='append', help='space-separated words (repeatable; default: built-in list)')
    ap.add_argument('--prompt-ids', action='append', help='comma-separated token ids (repeatable; replaces --prompt)')
    ap.add_argument('--name', help='output name (one --model only)')
    a = ap.parse_args()
    # (prompt text, ids or None): ids given directly are recorded with their text as the ids.
    prompts = [(p, [int(t) for t in p.split(',')]) for p in a.prompt_ids] if a.prompt_ids else [(p, None) for p in a.prompt or PROMPTS]
    if a.name and len(a.model or []) != 1:
        sys.exit('--name needs exactly one --model')
    os.makedirs(a.out_dir, exist_ok=True)
    failed = False
    for arg in a.model or ['smollm2-135m', 'qwen2.5-coder-0.5b']:
        name, path = find_model(arg)
        name = a.name or name
        print(f'{name}: {path}', file=sys.stderr)
        digest = sha256(path)
        if name in MODELS and digest != MODELS[name][1]:
            sys.exit(f'sha256 mismatch for {path}: {digest} != {MODELS[name][1]}')
        m = Model(path)
        cases = []
        for p, ids in prompts:
            t0 = time.time()
            c = run_case(m, p, a.gen, a.top, ids)
            cases.append(c)
            print(f'  {p!r} -> {c["greedy_ids"]} {c["text"]!r} first near-tie: {c["first_near_tie"]} '
                  f'(min margin {min(c["margins"]):.3f}, min router margin {c.get("min_router_margin")}) '
                  f'[{time.time() - t0:.1f}s]', file=sys.stderr)
            if name in MODELS and p == FRANCE and MODELS[name][2] is not None:
                _, _, want_prompt, want_next = MODELS[name]
                ok_p = c['prompt_ids'] == want_prompt
                n = len(want_next) if c['first_near_tie'] is None else min(len(want_next), c['first_near_tie'] + 1)
                ok_n = c['greedy_ids'][:n] == want_next[:n]
                full = c['greedy_ids'][:len(want_next)] == want_next
                print(f'  MODELS.md check: prompt ids {"ok" if ok_p else "MISMATCH"}, '
                      f'next {n} ids (up to the first near-tie) {"ok" if ok_n else "MISMATCH " + str(want_next)}, '
                      f'all {len(want_next)} published ids {"equal" if full else "differ"}', file=sys.stderr)
                failed |= not (ok_p and ok_n)
        doc = {
            'model': name, 'file': os.path.basename(path), 'sha256': digest, 'arch': m.arch,
            'generator': 'scripts/reference_forward.py (numpy float32 over gguf-dequantized weights)',
            'bos': m.bos is not None, 'greedy_steps': a.gen, 'near_tie': NEAR_TIE,
            'notes': 'margins[i] = top1 - top2 logit at step i; first_near_tie = first step with margin < near_tie; '
                     'top_logits = top-%d logits after the prompt (step 0); min_router_margin (MoE) = smallest '
                     'router logit gap between the last chosen expert and the next, over every layer and row' % a.top,
            'cases': cases,
        }
        out = os.path.join(a.out_dir, f'{name}.json')
        with open(out, 'w') as f:
            json.dump(doc, f, separators=(',', ':'))
            f.write('\n')
        print(f'  wrote {out} ({os.path.getsize(out)} bytes)', file=sys.stderr)
        del m
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
