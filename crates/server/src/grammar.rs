//! A JSON grammar over a tool's parameter schema, as a [`LogitsConstraint`].
//!
//! A byte-level pushdown automaton ([`Matcher`]) accepts exactly
//! `{"name": "<an allowed tool>", "arguments": <a value matching that tool's schema>}`.
//! The mask runs every candidate token's bytes through a copy of the automaton; the token
//! texts are computed once per model ([`TokenTable`]). Tokens are grouped by their first byte
//! so only tokens that can start at this point are tried, and inside a free string every
//! "plain" token (no quote, backslash or control byte) passes without a try.
//!
//! Schema support, kept simple but correct: `object` with `properties` (keys from the declared
//! names, each at most once, `required` enforced before `}`), `array` with `items`, `string`,
//! `number`, `integer`, `boolean`, `null`, `enum` / `const`. Anything else (anyOf, oneOf, type
//! lists, objects without properties) accepts any JSON value of the right outer kind.

use std::sync::Arc;

use resin_engine::LogitsConstraint;
use serde_json::Value;

/// Most consecutive whitespace bytes between tokens (keeps a small model from looping on them).
const MAX_WS: u8 = 16;
/// Most digits in a number.
const MAX_DIGITS: u8 = 16;
/// Deepest nesting of free-form values.
const MAX_DEPTH: usize = 32;

/// The bytes of every token, arranged for the mask. Built once per model.
pub struct TokenTable {
    bytes: Vec<Vec<u8>>,
    /// Every token with bytes (control tokens have none and are never allowed).
    all: Trie,
    /// Only the tokens that are not plain string content (`plain`).
    nonplain: Trie,
    /// `plain[id]`: every byte of token `id` may stand inside a JSON string as is.
    plain: Vec<bool>,
    /// Ids that end generation: allowed only if the automaton is stuck.
    stop_ids: Vec<u32>,
}

impl TokenTable {
    /// `bytes[id]` is token `id`'s text as bytes (empty for tokens that are not text).
    pub fn new(bytes: Vec<Vec<u8>>, stop_ids: Vec<u32>) -> Self {
        let is_plain = |b: &[u8]| !b.is_empty() && b.iter().all(|&c| c >= 0x20 && c != b'"' && c != b'\\');
        let plain: Vec<bool> = bytes.iter().map(|b| is_plain(b)).collect();
        let ids = |keep: &dyn Fn(usize) -> bool| (0..bytes.len()).filter(|&i| !bytes[i].is_empty() && keep(i)).map(|i| i as u32).collect::<Vec<u32>>();
        let all = Trie::new(ids(&|_| true), &bytes);
        let nonplain = Trie::new(ids(&|i| !plain[i]), &bytes);
        TokenTable { bytes, all, nonplain, plain, stop_ids }
    }

    pub fn vocab(&self) -> usize {
        self.bytes.len()
    }
}

/// The tokens' bytes as a trie, each node's children side by side: the mask walks it once a
/// step, feeding a shared prefix to the automaton once and leaving a whole subtree the moment
/// a byte is refused (a 150k vocabulary's tokens after a space, say, are refused at their
/// second byte together instead of one by one).
struct Trie {
    nodes: Vec<TrieNode>,
    /// The ids of the tokens that end at each node (`TrieNode::ids`).
    ids: Vec<u32>,
}

#[derive(Debug, Clone, Copy, Default)]
struct TrieNode {
    /// The byte on the edge into this node (unused at the root).
    byte: u8,
    /// The children: nodes `children .. children + n_children`.
    children: u32,
    n_children: u32,
    /// The tokens ending here: `ids[ids_at .. ids_at + n_ids]`.
    ids_at: u32,
    n_ids: u32,
}

impl Trie {
    /// The trie of tokens `ids` (each with at least one byte).
    fn new(mut ids: Vec<u32>, bytes: &[Vec<u8>]) -> Trie {
        // In byte order a token comes before those it is a prefix of, so each node's range of
        // tokens starts with the ones that end there, then its children's ranges in order.
        ids.sort_by(|&a, &b| bytes[a as usize].cmp(&bytes[b as usize]));
        let mut t = Trie { nodes: vec![TrieNode::default()], ids: Vec::with_capacity(ids.len()) };
        // (node, the node's tokens ids[lo..hi], its depth): explicit, as tokens can be long.
        let mut work = vec![(0usize, 0usize, ids.len(), 0usize)];
        while let Some((node, mut lo, hi, depth)) = work.pop() {
            let ids_at = t.ids.len();
            while lo < hi && bytes[ids[lo] as usize].len() == depth {
                t.ids.push(ids[lo]);
                lo += 1;
            }
            let children = t.nodes.len();
            while lo < hi {
                let b = bytes[ids[lo] as usize][depth];
                let end = lo + ids[lo..hi].partition_point(|&id| bytes[id as usize][depth] == b);
                t.nodes.push(TrieNode { byte: b, ..TrieNode::default() });
                work.push((t.nodes.len() - 1, lo, end, depth + 1));
                lo = end;
            }
            let (n_children, n_ids) = ((t.nodes.len() - children) as u32, (t.ids.len() - ids_at) as u32);
            let n = &mut t.nodes[node];
            (n.children, n.n_children, n.ids_at, n.n_ids) = (children as u32, n_children, ids_at as u32, n_ids);
        }
        t
    }

    /// Mark in `ok` every token whose bytes `m` accepts in full, from the root.
    fn allow(&self, m: &Matcher, ok: &mut [bool]) {
        let mut work = vec![(0usize, m.clone())];
        while let Some((node, m)) = work.pop() {
            let n = self.nodes[node];
            for child in n.children as usize..(n.children + n.n_children) as usize {
                let c = self.nodes[child];
                let mut after = m.clone();
                if !after.feed(c.byte) {
                    continue;
                }
                for &id in &self.ids[c.ids_at as usize..(c.ids_at + c.n_ids) as usize] {
                    if let Some(o) = ok.get_mut(id as usize) {
                        *o = true;
                    }
                }
                if c.n_children > 0 {
                    work.push((child, after));
                }
            }
        }
    }
}

type NodeId = u32;

#[derive(Debug, Clone)]
enum Node {
    Any,
    Str,
    Num {
        int: bool,
    },
    /// One of these literals (their JSON text): enums, booleans, null.
    Lits(u32),
    Obj {
        keys: u32,
        vals: Vec<NodeId>,
        required: u64,
    },
    /// Any object.
    FreeObj,
    Arr(NodeId),
}

/// A compiled tool-call grammar: the allowed names and each one's argument schema.
#[derive(Debug)]
pub struct Grammar {
    nodes: Vec<Node>,
    /// Literal sets (JSON text of each alternative).
    lits: Vec<Vec<Vec<u8>>>,
    /// The literal set of the allowed tool names (quoted).
    names: u32,
    /// Argument schema node per allowed name.
    args: Vec<NodeId>,
}

impl Grammar {
    fn tool_call(tools: &[(String, Value)]) -> Arc<Grammar> {
        let mut g = Grammar { nodes: Vec::new(), lits: Vec::new(), names: 0, args: Vec::new() };
        let names = tools.iter().map(|(n, _)| serde_json::to_vec(&Value::String(n.clone())).unwrap_or_default()).collect();
        g.names = g.add_lits(names);
        for (_, schema) in tools {
            let id = g.compile(schema, 0);
            // The arguments are always an object.
            let id = match g.nodes[id as usize] {
                Node::Obj { .. } | Node::FreeObj => id,
                _ => g.add(Node::FreeObj),
            };
            g.args.push(id);
        }
        Arc::new(g)
    }

    fn add(&mut self, n: Node) -> NodeId {
        self.nodes.push(n);
        (self.nodes.len() - 1) as NodeId
    }

    fn add_lits(&mut self, l: Vec<Vec<u8>>) -> u32 {
        self.lits.push(l);
        (self.lits.len() - 1) as u32
    }

    fn compile(&mut self, s: &Value, depth: usize) -> NodeId {
        if depth > 16 {
            return self.add(Node::Any);
        }
        let Some(obj) = s.as_object() else {
            return self.add(Node::Any);
        };
        let lits_of =
            |vals: &[Value]| -> Option<Vec<Vec<u8>>> { (!vals.is_empty() && vals.len() <= 64).then(|| vals.iter().map(|v| serde_json::to_vec(v).unwrap_or_default()).collect()) };
        if let Some(c) = obj.get("const") {
            let l = lits_of(std::slice::from_ref(c)).unwrap_or_default();
            let id = self.add_lits(l);
            return self.add(Node::Lits(id));
        }
        if let Some(Value::Array(e)) = obj.get("enum") {
            if let Some(l) = lits_of(e) {
                let id = self.add_lits(l);
                return self.add(Node::Lits(id));
            }
        }
        match obj.get("type").and_then(Value::as_str) {
            Some("string") => self.add(Node::Str),
            Some("number") => self.add(Node::Num { int: false }),
            Some("integer") => self.add(Node::Num { int: true }),
            Some("boolean") => {
                let id = self.add_lits(vec![b"true".to_vec(), b"false".to_vec()]);
                self.add(Node::Lits(id))
            }
            Some("null") => {
                let id = self.add_lits(vec![b"null".to_vec()]);
                self.add(Node::Lits(id))
            }
            Some("array") => {
                let item = match obj.get("items") {
                    Some(i) => self.compile(i, depth + 1),
                    None => self.add(Node::Any),
                };
                self.add(Node::Arr(item))
            }
            Some("object") => match obj.get("properties").and_then(Value::as_object) {
                Some(props) if !props.is_empty() && props.len() <= 64 => {
                    let names: Vec<&String> = props.keys().collect();
                    let required_names: Vec<&str> = obj.get("required").and_then(Value::as_array).map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
                    let mut required = 0u64;
                    let mut keys = Vec::new();
                    let mut vals = Vec::new();
                    for (i, name) in names.iter().enumerate() {
                        if required_names.contains(&name.as_str()) {
                            required |= 1 << i;
                        }
                        keys.push(serde_json::to_vec(&Value::String((*name).clone())).unwrap_or_default());
                        vals.push(self.compile(&props[name.as_str()], depth + 1));
                    }
                    let keys = self.add_lits(keys);
                    self.add(Node::Obj { keys, vals, required })
                }
                _ => self.add(Node::FreeObj),
            },
            _ => self.add(Node::Any),
        }
    }

    fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }
}

/// One frame of the automaton's stack.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Frame {
    /// The tool call itself; `phase` counts the parts done, `chosen` the name picked.
    Root {
        phase: u8,
        chosen: u32,
    },
    /// A fixed text (no whitespace freedom).
    Fixed {
        text: &'static [u8],
        pos: u8,
    },
    /// Matching one of the literals of `set` still `alive` (a bitmask).
    Choice {
        set: u32,
        pos: u16,
        alive: u64,
    },
    /// A value of `node` starts here (whitespace first allowed).
    Value(NodeId),
    /// Inside a string after its opening quote; `esc`: 0 plain, 1 after `\`, 2..=5 hex digits left + 1.
    Str {
        esc: u8,
    },
    Num {
        int: bool,
        st: u8,
        digits: u8,
    },
    /// After `{`.
    ObjStart {
        node: NodeId,
    },
    /// A key comes next (after `{` or `,`); `started` once its matcher is pushed.
    ObjKey {
        node: NodeId,
        used: u64,
        started: bool,
    },
    /// After a key, before `:`; `val` is the value's node.
    ObjColon {
        node: NodeId,
        used: u64,
        val: NodeId,
    },
    /// After a member's value: `,` or `}`.
    ObjAfterVal {
        node: NodeId,
        used: u64,
    },
    ArrStart {
        item: NodeId,
    },
    ArrAfterVal {
        item: NodeId,
    },
}

const FIXED_OPEN: &[u8] = b"{\"name\": ";
const FIXED_ARGS: &[u8] = b", \"arguments\": ";

/// What a frame did with a byte.
enum Step {
    /// Consumed; the frame goes on.
    Ok,
    Reject,
    /// Consumed, and the frame is complete with this result.
    DoneConsumed(u32),
    /// Complete without consuming: pop it and give the byte to the frame below.
    DoneRefeed(u32),
}

/// The automaton's state: cheap to clone.
#[derive(Debug, Clone)]
pub struct Matcher {
    g: Arc<Grammar>,
    stack: Vec<Frame>,
    ws: u8,
}

impl Matcher {
    pub fn new(g: Arc<Grammar>) -> Self {
        Matcher { g, stack: vec![Frame::Root { phase: 0, chosen: 0 }], ws: 0 }
    }

    /// True once the whole call has been read.
    pub fn is_done(&self) -> bool {
        self.stack.is_empty()
    }

    /// True when the top frame is a free string with no escape pending (plain tokens pass).
    fn in_plain_string(&self) -> bool {
        matches!(self.stack.last(), Some(Frame::Str { esc: 0 }))
    }

    pub fn feed_all(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.feed(b))
    }

    /// Advance by one byte; false if the grammar does not allow it here.
    pub fn feed(&mut self, b: u8) -> bool {
        loop {
            let Some(&top) = self.stack.last() else {
                return false;
            };
            let step = self.step(top, b);
            match step {
                Step::Ok => return true,
                Step::Reject => return false,
                Step::DoneConsumed(r) => {
                    self.stack.pop();
                    return self.child_done(r);
                }
                Step::DoneRefeed(r) => {
                    self.stack.pop();
                    if !self.child_done(r) {
                        return false;
                    }
                }
            }
        }
    }

    fn is_ws(b: u8) -> bool {
        matches!(b, b' ' | b'\n' | b'\t' | b'\r')
    }

    /// Whitespace where the grammar allows it, up to MAX_WS in a row.
    fn take_ws(&mut self, b: u8) -> Option<Step> {
        if Self::is_ws(b) {
            if self.ws >= MAX_WS {
                return Some(Step::Reject);
            }
            self.ws += 1;
            return Some(Step::Ok);
        }
        self.ws = 0;
        None
    }

    fn set_top(&mut self, f: Frame) {
        *self.stack.last_mut().expect("a frame is on the stack") = f;
    }

    fn step(&mut self, top: Frame, b: u8) -> Step {
        let g = self.g.clone();
        match top {
            Frame::Root { phase, chosen } => match phase {
                0 => {
                    self.set_top(Frame::Root { phase: 1, chosen });
                    self.stack.push(Frame::Fixed { text: FIXED_OPEN, pos: 0 });
                    self.step(Frame::Fixed { text: FIXED_OPEN, pos: 0 }, b)
                }
                _ => {
                    // Phase 4: the arguments are done; only `}` (after whitespace) remains.
                    if let Some(s) = self.take_ws(b) {
                        return s;
                    }
                    if b == b'}' {
                        Step::DoneConsumed(0)
                    } else {
                        Step::Reject
                    }
                }
            },
            Frame::Fixed { text, pos } => {
                if text.get(pos as usize) != Some(&b) {
                    return Step::Reject;
                }
                if pos as usize + 1 == text.len() {
                    Step::DoneConsumed(0)
                } else {
                    self.set_top(Frame::Fixed { text, pos: pos + 1 });
                    Step::Ok
                }
            }
            Frame::Choice { set, pos, alive } => {
                let lits = &g.lits[set as usize];
                let p = pos as usize;
                let mut next = 0u64;
                let mut complete = None;
                for (i, l) in lits.iter().enumerate() {
                    if alive & (1 << i) == 0 {
                        continue;
                    }
                    if l.len() == p {
                        complete = Some(i as u32);
                    } else if l[p] == b {
                        next |= 1 << i;
                    }
                }
                if next == 0 {
                    return match complete {
                        Some(i) => Step::DoneRefeed(i),
                        None => Step::Reject,
                    };
                }
                // Complete now if exactly the alive literals end here and none is longer.
                let ends: Vec<usize> = (0..lits.len()).filter(|&i| next & (1 << i) != 0 && lits[i].len() == p + 1).collect();
                let longer = (0..lits.len()).any(|i| next & (1 << i) != 0 && lits[i].len() > p + 1);
                if !ends.is_empty() && !longer {
                    return Step::DoneConsumed(ends[0] as u32);
                }
                self.set_top(Frame::Choice { set, pos: pos + 1, alive: next });
                Step::Ok
            }
            Frame::Value(node) => {
                if let Some(s) = self.take_ws(b) {
                    return s;
                }
                let deep = self.stack.len() > MAX_DEPTH;
                match g.node(node) {
                    Node::Any => match b {
                        b'{' if !deep => {
                            let free = self.free_obj_node();
                            self.set_top(Frame::ObjStart { node: free });
                            Step::Ok
                        }
                        b'[' if !deep => {
                            self.set_top(Frame::ArrStart { item: node });
                            Step::Ok
                        }
                        b'"' => {
                            self.set_top(Frame::Str { esc: 0 });
                            Step::Ok
                        }
                        b'-' | b'0'..=b'9' => {
                            self.set_top(Frame::Num { int: false, st: 0, digits: 0 });
                            self.step(Frame::Num { int: false, st: 0, digits: 0 }, b)
                        }
                        b't' | b'f' | b'n' => {
                            let set = self.literal_set_tfn();
                            let f = Frame::Choice { set, pos: 0, alive: 0b111 };
                            self.set_top(f);
                            self.step(f, b)
                        }
                        _ => Step::Reject,
                    },
                    Node::Str => {
                        if b == b'"' {
                            self.set_top(Frame::Str { esc: 0 });
                            Step::Ok
                        } else {
                            Step::Reject
                        }
                    }
                    &Node::Num { int } => {
                        let f = Frame::Num { int, st: 0, digits: 0 };
                        self.set_top(f);
                        self.step(f, b)
                    }
                    &Node::Lits(set) => {
                        let n = g.lits[set as usize].len();
                        let f = Frame::Choice { set, pos: 0, alive: if n >= 64 { u64::MAX } else { (1u64 << n) - 1 } };
                        self.set_top(f);
                        self.step(f, b)
                    }
                    Node::Obj { .. } | Node::FreeObj => {
                        if b == b'{' {
                            self.set_top(Frame::ObjStart { node });
                            Step::Ok
                        } else {
                            Step::Reject
                        }
                    }
                    &Node::Arr(item) => {
                        if b == b'[' {
                            self.set_top(Frame::ArrStart { item });
                            Step::Ok
                        } else {
                            Step::Reject
                        }
                    }
                }
            }
            Frame::Str { esc } => match esc {
                0 => match b {
                    b'"' => Step::DoneConsumed(0),
                    b'\\' => {
                        self.set_top(Frame::Str { esc: 1 });
                        Step::Ok
                    }
                    0..=0x1f => Step::Reject,
                    _ => Step::Ok,
                },
                1 => match b {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                        self.set_top(Frame::Str { esc: 0 });
                        Step::Ok
                    }
                    b'u' => {
                        self.set_top(Frame::Str { esc: 5 });
                        Step::Ok
                    }
                    _ => Step::Reject,
                },
                n => {
                    if b.is_ascii_hexdigit() {
                        self.set_top(Frame::Str { esc: if n == 2 { 0 } else { n - 1 } });
                        Step::Ok
                    } else {
                        Step::Reject
                    }
                }
            },
            Frame::Num { int, st, digits } => self.step_num(int, st, digits, b),
            Frame::ObjStart { node } => {
                if let Some(s) = self.take_ws(b) {
                    return s;
                }
                if b == b'}' {
                    return if self.required(node) == 0 { Step::DoneConsumed(0) } else { Step::Reject };
                }
                let f = Frame::ObjKey { node, used: 0, started: false };
                self.set_top(f);
                self.step(f, b)
            }
            Frame::ObjKey { node, used, started } => {
                debug_assert!(!started, "a started key has its matcher on top");
                if let Some(s) = self.take_ws(b) {
                    return s;
                }
                match g.node(node) {
                    Node::Obj { keys, .. } => {
                        let n = g.lits[*keys as usize].len();
                        let all = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
                        let alive = all & !used;
                        if alive == 0 {
                            return Step::Reject;
                        }
                        self.set_top(Frame::ObjKey { node, used, started: true });
                        let f = Frame::Choice { set: *keys, pos: 0, alive };
                        self.stack.push(f);
                        self.step(f, b)
                    }
                    _ => {
                        if b != b'"' {
                            return Step::Reject;
                        }
                        self.set_top(Frame::ObjKey { node, used, started: true });
                        self.stack.push(Frame::Str { esc: 0 });
                        Step::Ok
                    }
                }
            }
            Frame::ObjColon { node, used, val } => {
                if let Some(s) = self.take_ws(b) {
                    return s;
                }
                if b != b':' {
                    return Step::Reject;
                }
                self.set_top(Frame::ObjAfterVal { node, used });
                self.stack.push(Frame::Value(val));
                Step::Ok
            }
            Frame::ObjAfterVal { node, used } => {
                if let Some(s) = self.take_ws(b) {
                    return s;
                }
                match b {
                    b'}' => {
                        let req = self.required(node);
                        if req & used == req {
                            Step::DoneConsumed(0)
                        } else {
                            Step::Reject
                        }
                    }
                    b',' => {
                        if let Node::Obj { keys, .. } = g.node(node) {
                            let n = g.lits[*keys as usize].len();
                            let all = if n >= 64 { u64::MAX } else { (1u64 << n) - 1 };
                            if all & !used == 0 {
                                return Step::Reject;
                            }
                        }
                        self.set_top(Frame::ObjKey { node, used, started: false });
                        Step::Ok
                    }
                    _ => Step::Reject,
                }
            }
            Frame::ArrStart { item } => {
                if let Some(s) = self.take_ws(b) {
                    return s;
                }
                if b == b']' {
                    return Step::DoneConsumed(0);
                }
                self.set_top(Frame::ArrAfterVal { item });
                self.stack.push(Frame::Value(item));
                self.step(Frame::Value(item), b)
            }
            Frame::ArrAfterVal { item } => {
                if let Some(s) = self.take_ws(b) {
                    return s;
                }
                match b {
                    b']' => Step::DoneConsumed(0),
                    b',' => {
                        self.stack.push(Frame::Value(item));
                        Step::Ok
                    }
                    _ => Step::Reject,
                }
            }
        }
    }

    /// JSON number: `-? (0 | [1-9][0-9]*) (\.[0-9]+)? ([eE][+-]?[0-9]+)?`.
    /// States: 0 start, 1 after '-', 2 after a leading 0, 3 int digits, 4 after '.', 5 fraction
    /// digits, 6 after e, 7 after the exponent's sign, 8 exponent digits.
    fn step_num(&mut self, int: bool, st: u8, digits: u8, b: u8) -> Step {
        let complete = matches!(st, 2 | 3 | 5 | 8);
        // At most MAX_DIGITS in the mantissa and 2 in the exponent (so every number fits an f64).
        let cap = if st >= 6 { 2 } else { MAX_DIGITS };
        let digit = b.is_ascii_digit() && digits < cap;
        let next = match (st, b) {
            (0, b'-') => Some(1),
            (0 | 1, b'0') => Some(2),
            (0 | 1, b'1'..=b'9') if digit => Some(3),
            (3, b'0'..=b'9') if digit => Some(3),
            (2 | 3, b'.') if !int => Some(4),
            (2 | 3 | 5, b'e' | b'E') if !int => Some(6),
            (4 | 5, b'0'..=b'9') if digit => Some(5),
            (6, b'+' | b'-') => Some(7),
            (6..=8, b'0'..=b'9') if digit => Some(8),
            _ => None,
        };
        match next {
            Some(s) => {
                let d = if s == 6 { 0 } else { digits + u8::from(b.is_ascii_digit()) };
                self.set_top(Frame::Num { int, st: s, digits: d });
                Step::Ok
            }
            None if complete => Step::DoneRefeed(0),
            None => Step::Reject,
        }
    }

    fn required(&self, node: NodeId) -> u64 {
        match self.g.node(node) {
            Node::Obj { required, .. } => *required,
            _ => 0,
        }
    }

    /// Node ids of shared helper nodes: the grammar is immutable, so find them by scanning.
    fn free_obj_node(&self) -> NodeId {
        self.g.nodes.iter().position(|n| matches!(n, Node::FreeObj)).map(|i| i as NodeId).unwrap_or(u32::MAX)
    }

    fn literal_set_tfn(&self) -> u32 {
        (self.g.lits.len() - 1) as u32
    }

    /// A child frame finished with result `r`: the frame now on top takes its next step.
    fn child_done(&mut self, r: u32) -> bool {
        let Some(&top) = self.stack.last() else {
            return true;
        };
        self.ws = 0;
        match top {
            Frame::Root { phase, chosen } => {
                match phase {
                    1 => {
                        let set = self.g.names;
                        let n = self.g.lits[set as usize].len();
                        self.set_top(Frame::Root { phase: 2, chosen });
                        self.stack.push(Frame::Choice { set, pos: 0, alive: if n >= 64 { u64::MAX } else { (1u64 << n) - 1 } });
                    }
                    2 => {
                        self.set_top(Frame::Root { phase: 3, chosen: r });
                        self.stack.push(Frame::Fixed { text: FIXED_ARGS, pos: 0 });
                    }
                    3 => {
                        self.set_top(Frame::Root { phase: 4, chosen });
                        self.stack.push(Frame::Value(self.g.args[chosen as usize]));
                    }
                    _ => {}
                }
                true
            }
            Frame::ObjKey { node, used, .. } => {
                let (used, val) = match self.g.node(node) {
                    Node::Obj { vals, .. } => (used | (1 << r), vals[r as usize]),
                    _ => (used, self.any_node()),
                };
                self.set_top(Frame::ObjColon { node, used, val });
                true
            }
            // A value or an array element finished: these frames were set up before it began.
            Frame::ObjAfterVal { .. } | Frame::ArrAfterVal { .. } => true,
            _ => false,
        }
    }

    fn any_node(&self) -> NodeId {
        self.g.nodes.iter().position(|n| matches!(n, Node::Any)).map(|i| i as NodeId).unwrap_or(u32::MAX)
    }
}

/// The constraint the engine applies to a forced tool call.
pub struct ToolCallConstraint {
    table: Arc<TokenTable>,
    m: Matcher,
    broken: bool,
}

impl ToolCallConstraint {
    pub fn new(table: Arc<TokenTable>, grammar: Arc<Grammar>) -> Self {
        ToolCallConstraint { table, m: Matcher::new(grammar), broken: false }
    }

    /// Which tokens may come next (true = allowed), over `n` logits: a token whose every byte
    /// the automaton accepts in turn. Inside a plain string every plain token is (one copy);
    /// the rest are found by a walk of the token trie.
    pub fn allowed(&self, n: usize) -> Vec<bool> {
        let t = &self.table;
        let mut ok = vec![false; n];
        if self.broken || self.m.is_done() {
            return ok;
        }
        if self.m.in_plain_string() {
            let k = n.min(t.plain.len());
            ok[..k].copy_from_slice(&t.plain[..k]);
            t.nonplain.allow(&self.m, &mut ok);
        } else {
            t.all.allow(&self.m, &mut ok);
        }
        ok
    }
}

impl LogitsConstraint for ToolCallConstraint {
    fn mask(&mut self, logits: &mut [f32]) {
        let mut ok = self.allowed(logits.len());
        if !ok.iter().any(|&o| o) {
            // Stuck (or done): let the model end rather than sample from nothing.
            for &s in &self.table.stop_ids {
                if let Some(o) = ok.get_mut(s as usize) {
                    *o = true;
                }
            }
        }
        for (l, o) in logits.iter_mut().zip(ok) {
            if !o {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    fn accept(&mut self, token: u32) -> bool {
        let bytes = self.table.bytes.get(token as usize).map(Vec::as_slice).unwrap_or(&[]);
        if bytes.is_empty() || !self.m.feed_all(bytes) {
            self.broken = true;
        }
        self.broken || self.m.is_done()
    }
}

/// The grammar of one call to one of `tools`: (name, JSON schema of its parameters).
pub fn compile(tools: &[(String, Value)]) -> Arc<Grammar> {
    let mut g = Arc::try_unwrap(Grammar::tool_call(tools)).expect("a fresh grammar has one owner");
    g.add(Node::FreeObj);
    g.add(Node::Any);
    // The true/false/null literal set must be the last one (see `literal_set_tfn`).
    g.add_lits(vec![b"true".to_vec(), b"false".to_vec(), b"null".to_vec()]);
    Arc::new(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> Arc<Grammar> {
        compile(&[
            (
                "get_weather".into(),
                json!({"type": "object", "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer"},
                    "lat": {"type": "number"},
                    "detailed": {"type": "boolean"},
                    "tags": {"type": "array", "items": {"type": "string"}}
                }, "required": ["city"]}),
            ),
            ("get_time".into(), json!({"type": "object", "properties": {"tz": {"type": "string"}}})),
            ("free".into(), json!({"type": "object"})),
        ])
    }

    fn accepts(g: &Arc<Grammar>, s: &str) -> bool {
        let mut m = Matcher::new(g.clone());
        m.feed_all(s.as_bytes()) && m.is_done()
    }

    #[test]
    fn accepts_valid_calls() {
        let g = weather();
        for s in [
            r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#,
            r#"{"name": "get_weather", "arguments": { "city" : "Paris, \"FR\" \u00e9", "unit": "celsius", "days": 3 }}"#,
            r#"{"name": "get_weather", "arguments": {"days": -10, "city": "x", "lat": 4.5e-3, "detailed": false, "tags": ["a", "b"]}}"#,
            r#"{"name": "get_weather", "arguments": {"city": "x", "tags": []}}"#,
            r#"{"name": "get_time", "arguments": {}}"#,
            r#"{"name": "free", "arguments": {"anything": [1, {"x": null}, true], "y": "z"}}"#,
        ] {
            assert!(accepts(&g, s), "{s}");
            serde_json::from_str::<Value>(s).unwrap();
        }
    }

    #[test]
    fn rejects_invalid_calls() {
        let g = weather();
        for s in [
            r#"{"name": "get_wether", "arguments": {"city": "Paris"}}"#,
            r#"{"name": "get_weather", "arguments": {}}"#,
            r#"{"name": "get_weather", "arguments": {"city": 3}}"#,
            r#"{"name": "get_weather", "arguments": {"city": "a", "city": "b"}}"#,
            r#"{"name": "get_weather", "arguments": {"city": "a", "unit": "kelvin"}}"#,
            r#"{"name": "get_weather", "arguments": {"city": "a", "days": 1.5}}"#,
            r#"{"name": "get_weather", "arguments": {"city": "a", "other": 1}}"#,
            r#"{"name": "get_weather", "arguments": {"city": "a"}} "#,
            r#"{"name": "get_weather", "arguments": {"city": "a\x"}}"#,
            r#"{"name": "get_time", "arguments": {"tz": "a",}}"#,
        ] {
            assert!(!accepts(&g, s), "{s}");
        }
        // Incomplete is not done.
        let mut m = Matcher::new(g.clone());
        assert!(m.feed_all(br#"{"name": "get_time", "arguments": {"tz": "a"}"#));
        assert!(!m.is_done());
    }

    /// Random walks over allowed tokens always end in a valid call (or run out of steps).
    #[test]
    fn random_walks_give_valid_calls() {
        let g = weather();
        let vocab = walk_vocab();
        let table = Arc::new(TokenTable::new(vocab.iter().map(|s| s.as_bytes().to_vec()).collect(), vec![vocab.len() as u32 - 1]));
        let mut rng = resin_engine::Rng::new(7);
        let mut done = 0;
        for _ in 0..300 {
            let mut c = ToolCallConstraint::new(table.clone(), g.clone());
            let mut out = String::new();
            for _ in 0..400 {
                let ok: Vec<usize> = c.allowed(vocab.len()).iter().enumerate().filter(|(_, &o)| o).map(|(i, _)| i).collect();
                assert!(!ok.is_empty(), "stuck after {out:?}");
                let t = ok[(rng.next_u64() % ok.len() as u64) as usize];
                out.push_str(&vocab[t]);
                if c.accept(t as u32) {
                    break;
                }
            }
            if !c.m.is_done() {
                continue;
            }
            done += 1;
            let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out:?}: {e}"));
            let name = v["name"].as_str().unwrap();
            assert!(["get_weather", "get_time", "free"].contains(&name), "{out}");
            assert!(v["arguments"].is_object(), "{out}");
            if name == "get_weather" {
                assert!(v["arguments"]["city"].is_string(), "{out}");
                if let Some(d) = v["arguments"].get("days") {
                    assert!(d.is_i64() || d.is_u64(), "{out}");
                }
            }
            let calls = crate::tools::parse_tool_calls(&out, &["get_weather".into(), "get_time".into(), "free".into()]).unwrap().1;
            assert_eq!(calls.len(), 1);
        }
        assert!(done > 30, "only {done} walks finished");
    }

    /// The mask's trie walk (and its plain-string copy) allows exactly the tokens whose bytes
    /// the automaton accepts one by one, at every step of random walks over a vocabulary with
    /// shared prefixes, tokens that are prefixes of others, duplicates, multi-byte UTF-8 pieces
    /// and runs of whitespace. Control: the walks pass states where some tokens are refused
    /// and others allowed, plain strings among them.
    #[test]
    fn the_mask_allows_what_feeding_each_token_allows() {
        let g = weather();
        let mut vocab = walk_vocab();
        vocab.pop(); // the control token goes last again below
        for w in ["Pa", "Par", "Paris", "Paris\"", "\"ci", "\"city\": \"", "    ", "\n\n  ", " \"", "é", "日本", "\"}}", "get_", "get_weather\""] {
            vocab.push(w.to_string());
        }
        vocab.push(String::new());
        let bytes: Vec<Vec<u8>> = vocab.iter().map(|s| s.as_bytes().to_vec()).collect();
        let table = Arc::new(TokenTable::new(bytes.clone(), vec![vocab.len() as u32 - 1]));
        let mut rng = resin_engine::Rng::new(11);
        let (mut mixed, mut plain) = (0, 0);
        for _ in 0..100 {
            let mut c = ToolCallConstraint::new(table.clone(), g.clone());
            for _ in 0..200 {
                let got = c.allowed(vocab.len());
                let want: Vec<bool> = bytes.iter().map(|b| !b.is_empty() && c.m.clone().feed_all(b)).collect();
                assert_eq!(got, want, "the mask after {:?}", c.m.stack);
                let ok: Vec<usize> = (0..got.len()).filter(|&i| got[i]).collect();
                if ok.is_empty() {
                    break;
                }
                mixed += usize::from(ok.len() < vocab.len() - 1);
                plain += usize::from(c.m.in_plain_string());
                if c.accept(ok[(rng.next_u64() % ok.len() as u64) as usize] as u32) {
                    break;
                }
            }
        }
        assert!(mixed > 100 && plain > 10, "{mixed} steps refused some tokens, {plain} in plain strings");
    }

    /// A vocabulary of JSON pieces, words of the `weather` tools, every printable byte alone
    /// (so no prefix is a dead end) and, last, a control token (no bytes: never allowed).
    fn walk_vocab() -> Vec<String> {
        let mut vocab: Vec<String> =
            ["{", "}", "[", "]", ",", ":", " ", "\n", "\"", "\\", "u", "e", "E", "-", "+", ".", "0", "1", "9", "true", "false", "null"].iter().map(|s| s.to_string()).collect();
        for w in [
            "{\"name\": \"",
            "get_weather",
            "get_time",
            "free",
            "\", \"arguments\": ",
            "\"city\"",
            "\"unit\"",
            "\"days\"",
            "\"tags\"",
            "\"tz\"",
            "\"lat\"",
            "\"detailed\"",
            "celsius",
            "\"celsius\"",
            "Paris",
            "a\"",
            "\"}",
            "}}",
            "\": ",
            "12",
            "3.5",
            "e-2",
            "\\n",
            "\\u00e9",
            "x y",
            "ab",
        ] {
            vocab.push(w.to_string());
        }
        // Like a byte-level vocabulary: every printable byte alone, so no prefix is a dead end.
        vocab.extend((0x20u8..0x7f).map(|b| (b as char).to_string()));
        vocab.push(String::new()); // a control token: never allowed
        vocab
    }

    #[test]
    fn mask_allows_exactly_the_tokens_that_fit() {
        let g = weather();
        let vocab: Vec<&str> = vec!["{\"", "name", "\": ", "\"", "get", "_time", "_weather", "\", \"", "arguments", "{", "}", "}}", "tz", "hello world", "a\"", "\\n", "x", ""];
        let table = Arc::new(TokenTable::new(vocab.iter().map(|s| s.as_bytes().to_vec()).collect(), vec![17]));
        let mut c = ToolCallConstraint::new(table.clone(), g);
        let allowed = |c: &ToolCallConstraint| -> Vec<&str> { c.allowed(vocab.len()).iter().enumerate().filter(|(_, &o)| o).map(|(i, _)| vocab[i]).collect() };
        assert_eq!(allowed(&c), vec!["{\"", "{"]);
        let walk = ["{\"", "name", "\": ", "\"", "get", "_time", "\", \"", "arguments", "\": ", "{", "\"", "tz", "\": ", "\""];
        for t in walk {
            let id = vocab.iter().position(|v| *v == t).unwrap() as u32;
            assert!(c.allowed(vocab.len())[id as usize], "{t} should be allowed");
            assert!(!c.accept(id));
        }
        // Inside a free string: plain tokens and a closing quote token pass; a lone brace too.
        let inside = allowed(&c);
        assert!(inside.contains(&"hello world") && inside.contains(&"a\"") && inside.contains(&"\\n") && inside.contains(&"}"));
        assert!(!inside.contains(&""));
        for t in ["x", "a\"", "}}"] {
            let id = vocab.iter().position(|v| *v == t).unwrap() as u32;
            assert!(c.allowed(vocab.len())[id as usize], "{t}");
            let done = c.accept(id);
            assert_eq!(done, t == "}}");
        }
        // Done: nothing more but the stop id (via mask).
        let mut logits = vec![0.0; vocab.len()];
        c.mask(&mut logits);
        assert_eq!(logits.iter().filter(|l| l.is_finite()).count(), 1);
        assert!(logits[17].is_finite());
    }
}
