//! Constrained decoding on [llguidance]: JSON Schema (structured outputs, `response_format`)
//! and the forced tool call, one grammar path for both.
//!
//! [`GrammarEnv`] is built once per model: every token's bytes in a token trie (control tokens
//! as `0xFF` + their text, llguidance's marker for special tokens, so no grammar can produce
//! them; the end-of-generation ids as its EOS set) and llguidance's parser factory over it. A
//! request's schema compiles into a [`GrammarConstraint`], the engine's [`LogitsConstraint`]:
//! before each draw llguidance computes the set of tokens the grammar allows next (a walk of
//! the trie against its lexer, with its slices of the vocabulary precomputed), and every other
//! logit becomes -inf; the chosen token advances the parser. The end-of-generation ids are
//! allowed only where the grammar may end; once the parser can go no further (the JSON value is
//! complete) the constraint says so and the generation ends with `stop`.
//!
//! JSON is compact with a space after `,` and `:` (`{"a": 1, "b": [2, 3]}`: no free
//! whitespace, so a small model cannot wander off into newlines) unless the schema carries
//! its own `x-guidance` options. A schema feature llguidance does not implement is an error
//! naming it (`Unimplemented keys: ["uniqueItems"]`), which the server answers with a 400;
//! tool schemas compile leniently (such keys are ignored), as agents send all kinds.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use resin_engine::LogitsConstraint;
use resin_model::Tokenizer;
use serde_json::{json, Value};

/// llguidance's view of the vocabulary: the trie of every token's bytes.
struct TrieEnv {
    trie: TokTrie,
}

impl TokenizerEnv for TrieEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Only for forced tokens and prompt healing, which resin does not ask for.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// The grammar engine for one model's vocabulary. Built once per model (a 150k vocabulary's
/// takes a few hundred milliseconds), shared by every request.
pub struct GrammarEnv {
    factory: ParserFactory,
    stop_ids: Vec<u32>,
}

impl GrammarEnv {
    /// `bytes[id]`: token `id`'s bytes (empty for a token that is never allowed; `0xFF` +
    /// name for a special one); `stop_ids`: the ids that end generation.
    pub fn new(bytes: Vec<Vec<u8>>, stop_ids: Vec<u32>) -> anyhow::Result<Self> {
        let n = bytes.len() as u32;
        let stop_ids: Vec<u32> = stop_ids.into_iter().filter(|&s| s < n).collect();
        let eos = stop_ids.first().copied().ok_or_else(|| anyhow::anyhow!("the vocabulary has no end-of-generation token"))?;
        let trie = TokTrie::from(&TokRxInfo::new(n, eos), &bytes).with_eos_tokens(&stop_ids);
        let env: TokEnv = Arc::new(TrieEnv { trie });
        let mut factory = ParserFactory::new_simple(&env)?;
        factory.quiet();
        Ok(GrammarEnv { factory, stop_ids })
    }

    /// The environment of `tok`'s vocabulary.
    pub fn from_tokenizer(tok: &Tokenizer) -> anyhow::Result<Self> {
        let bytes = (0..tok.vocab_size() as u32)
            .map(|id| {
                let plain = tok.token_bytes(id, false);
                if !plain.is_empty() {
                    return plain;
                }
                // A control token: llguidance's special-token form, never produced by a grammar.
                let text = tok.token_bytes(id, true);
                if text.is_empty() {
                    return text;
                }
                let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                b.extend(text);
                b
            })
            .collect();
        Self::new(bytes, tok.stop_ids())
    }

    pub fn vocab(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }

    /// A constraint to output JSON that `schema` accepts; the error names what the schema
    /// asks for that is not supported (or what is wrong with it).
    pub fn json_schema(&self, schema: &Value) -> Result<GrammarConstraint, String> {
        self.compile(with_options(schema, false))
    }

    /// A constraint to output one call of one of `tools` (name, parameters schema) as
    /// `{"name": <name>, "arguments": <object matching its schema>}`.
    pub fn tool_call(&self, tools: &[(String, Value)]) -> Result<GrammarConstraint, String> {
        self.compile(with_options(&tool_call_schema(tools), true))
    }

    fn compile(&self, schema: Value) -> Result<GrammarConstraint, String> {
        let parser = self.factory.create_parser(TopLevelGrammar::from_json_schema(schema)).map_err(|e| format!("{e:#}"))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(e);
        }
        Ok(GrammarConstraint { matcher, stop_ids: self.stop_ids.clone(), broken: false })
    }
}

/// The JSON schema of a call of one of `tools`: an object of `name` (the tool's, as a
/// constant) then `arguments` (an object its schema accepts). The tools' `$defs` (and
/// `definitions`) move to the root, where their `#/$defs/...` references point.
pub fn tool_call_schema(tools: &[(String, Value)]) -> Value {
    let mut defs = serde_json::Map::new();
    let mut definitions = serde_json::Map::new();
    let mut one = |(name, params): &(String, Value)| {
        let mut args = params.clone();
        close_objects(&mut args, 0);
        if let Some(o) = args.as_object_mut() {
            // The arguments are always an object.
            o.entry("type").or_insert_with(|| json!("object"));
            for (key, into) in [("$defs", &mut defs), ("definitions", &mut definitions)] {
                if let Some(Value::Object(d)) = o.remove(key) {
                    into.extend(d);
                }
            }
        }
        json!({
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": args},
            "required": ["name", "arguments"],
            "additionalProperties": false,
        })
    };
    let mut s = match tools {
        [t] => one(t),
        _ => json!({"anyOf": tools.iter().map(&mut one).collect::<Vec<_>>()}),
    };
    if !defs.is_empty() {
        s["$defs"] = Value::Object(defs);
    }
    if !definitions.is_empty() {
        s["definitions"] = Value::Object(definitions);
    }
    s
}

/// Objects that declare `properties` and say nothing of other members take no others
/// (`additionalProperties: false`), through the whole schema: a tool's arguments are the
/// parameters it declares (as OpenAI's strict function calling has it), and a small model
/// cannot wander off into invented keys.
fn close_objects(s: &mut Value, depth: usize) {
    let Some(o) = s.as_object_mut().filter(|_| depth < 64) else {
        return;
    };
    if o.contains_key("properties") && !o.contains_key("additionalProperties") && !o.contains_key("patternProperties") {
        o.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (k, v) in o.iter_mut() {
        match (k.as_str(), v) {
            ("properties" | "$defs" | "definitions", Value::Object(m)) => m.values_mut().for_each(|v| close_objects(v, depth + 1)),
            ("items" | "additionalProperties" | "not", v) => close_objects(v, depth + 1),
            ("prefixItems" | "anyOf" | "oneOf" | "allOf", Value::Array(a)) => a.iter_mut().for_each(|v| close_objects(v, depth + 1)),
            _ => {}
        }
    }
}

/// OpenAI's strict mode (`json_schema.strict: true`), resin's reading of it: every object takes
/// only the members it declares and must name them all in `required`, so what the output holds
/// is fixed by the schema. An object that says nothing of `additionalProperties` gets `false`
/// (the grammar then allows no other member; OpenAI would refuse such a schema, resin reads the
/// omission as the only value strict mode allows); one whose `additionalProperties` is anything
/// else, one with `patternProperties`, one that declares no `properties` (and is not closed
/// explicitly: a free-form object) and one whose `required` misses a declared property are
/// refused, the message naming the rule and where it is broken (`name`: the schema's name).
/// OpenAI's other limits (the root an object, nesting depth, property counts, the keyword
/// subset) are not imposed: llguidance enforces more than OpenAI accepts, and what it cannot
/// enforce is refused by name anyway. Returns the schema with those objects closed.
pub fn strict_schema(schema: &Value, name: &str) -> Result<Value, String> {
    let mut s = schema.clone();
    let mut path = Vec::new();
    strict_walk(&mut s, &mut path).map_err(|e| format!("Invalid schema for response_format '{name}' (strict: true): {e}"))?;
    Ok(s)
}

/// The rules of [`strict_schema`] on `s` (at `path`) and every schema inside it.
fn strict_walk(s: &mut Value, path: &mut Vec<String>) -> Result<(), String> {
    let Some(o) = s.as_object_mut() else { return Ok(()) };
    if path.len() > 128 {
        return Err("the schema nests too deeply".into());
    }
    let at = |path: &[String]| if path.is_empty() { "at the root".to_string() } else { format!("in context ({})", path.join(", ")) };
    let is_object = match o.get("type") {
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        _ => o.contains_key("properties"),
    };
    if is_object {
        if o.contains_key("patternProperties") {
            return Err(format!(
                "{}, 'patternProperties' is not allowed: strict mode's objects take only the members they declare in 'properties'. Send strict: false for it.",
                at(path)
            ));
        }
        match o.get("additionalProperties") {
            None if o.contains_key("properties") => {
                o.insert("additionalProperties".into(), Value::Bool(false));
            }
            None => {
                return Err(format!(
                "{}, an object must declare its 'properties' (with 'additionalProperties': false); a free-form object is not allowed in strict mode. Send strict: false for it.",
                at(path)
            ))
            }
            Some(Value::Bool(false)) => {}
            Some(_) => {
                return Err(format!(
                    "{}, 'additionalProperties' must be false: strict mode's objects take only the members they declare. Send strict: false to allow others.",
                    at(path)
                ))
            }
        }
        let declared: Vec<String> = o.get("properties").and_then(Value::as_object).map(|p| p.keys().cloned().collect()).unwrap_or_default();
        let required: Vec<&str> = o.get("required").and_then(Value::as_array).map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        let missing: Vec<String> = declared.iter().filter(|k| !required.contains(&k.as_str())).map(|k| format!("'{k}'")).collect();
        if !missing.is_empty() {
            return Err(format!(
                "{}, 'required' must list every key in 'properties'; missing {}. Make an optional member nullable (e.g. {{\"type\": [\"string\", \"null\"]}}) and list it, or send strict: false.",
                at(path),
                missing.join(", ")
            ));
        }
    }
    for (k, v) in o.iter_mut() {
        match (k.as_str(), v) {
            ("properties" | "$defs" | "definitions" | "dependentSchemas", Value::Object(m)) => {
                for (name, sub) in m.iter_mut() {
                    path.extend([k.clone(), name.clone()]);
                    strict_walk(sub, path)?;
                    path.truncate(path.len() - 2);
                }
            }
            ("items" | "additionalItems" | "contains" | "not" | "if" | "then" | "else" | "propertyNames", v @ Value::Object(_)) => {
                path.push(k.clone());
                strict_walk(v, path)?;
                path.pop();
            }
            ("items" | "prefixItems" | "anyOf" | "oneOf" | "allOf", Value::Array(a)) => {
                for (i, sub) in a.iter_mut().enumerate() {
                    path.extend([k.clone(), i.to_string()]);
                    strict_walk(sub, path)?;
                    path.truncate(path.len() - 2);
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// `schema` with resin's JSON layout (unless it brings its own `x-guidance`); `lenient`:
/// features llguidance does not implement are ignored instead of refused.
fn with_options(schema: &Value, lenient: bool) -> Value {
    let mut s = match schema {
        // `true` / `false` schemas: any value / none.
        Value::Bool(true) => json!({}),
        Value::Bool(false) => json!({"not": {}}),
        s => s.clone(),
    };
    if let Some(o) = s.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ", "lenient": lenient}));
    }
    s
}

/// One request's grammar state: the engine masks each draw with it.
pub struct GrammarConstraint {
    matcher: Matcher,
    stop_ids: Vec<u32>,
    /// A token the grammar refused was fed (not reached: the mask allows none): from then on
    /// only the end-of-generation ids.
    broken: bool,
}

impl GrammarConstraint {
    /// Which of the first `n` token ids may come next (true = allowed); only the
    /// end-of-generation ids once the grammar is complete or stuck.
    pub fn allowed(&mut self, n: usize) -> Vec<bool> {
        let mut ok = vec![false; n];
        let mask = self.next_mask();
        match mask {
            Some(m) if !m.is_zero() => m.iter_set_entries(|i| {
                if let Some(o) = ok.get_mut(i) {
                    *o = true;
                }
            }),
            _ => {
                for &s in &self.stop_ids {
                    if let Some(o) = ok.get_mut(s as usize) {
                        *o = true;
                    }
                }
            }
        }
        ok
    }

    /// The grammar's set of next tokens; None once it is complete or stuck (then only the
    /// end-of-generation ids may follow).
    fn next_mask(&mut self) -> Option<llguidance::toktrie::SimpleVob> {
        if self.broken || self.matcher.is_stopped() {
            return None;
        }
        self.matcher.compute_mask().ok()
    }

    /// Whether the grammar has reached its end (nothing but end-of-generation may follow).
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped() && !self.broken
    }

    /// The parser's error, if a token it refused was fed.
    pub fn error(&self) -> Option<String> {
        self.matcher.get_error()
    }
}

impl LogitsConstraint for GrammarConstraint {
    fn mask(&mut self, logits: &mut [f32]) {
        let mask = self.next_mask();
        match mask {
            Some(m) if !m.is_zero() => {
                // 32 tokens a word of the bit set; ids past the vocabulary are never allowed.
                let words = m.as_slice();
                for (chunk, w) in logits.chunks_mut(32).zip(words.iter().copied().chain(std::iter::repeat(0))) {
                    if w == u32::MAX {
                        continue;
                    }
                    for (j, l) in chunk.iter_mut().enumerate() {
                        if w >> j & 1 == 0 {
                            *l = f32::NEG_INFINITY;
                        }
                    }
                }
            }
            _ => {
                // Complete or stuck: only the end of generation.
                for (i, l) in logits.iter_mut().enumerate() {
                    if !self.stop_ids.contains(&(i as u32)) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }

    fn accept(&mut self, token: u32) -> bool {
        if self.stop_ids.contains(&token) {
            return true;
        }
        if self.broken || self.matcher.consume_token(token).is_err() {
            self.broken = true;
            return true;
        }
        self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level vocabulary: every printable byte alone (so no prefix is a dead end), JSON
    /// pieces and words with shared prefixes, multi-byte UTF-8, whitespace runs, and last two
    /// control tokens: an end-of-generation one and another.
    fn vocab() -> (Vec<Vec<u8>>, Vec<u32>) {
        let mut v: Vec<Vec<u8>> = (0x20u8..0x7f).map(|b| vec![b]).collect();
        for w in [
            "{\"",
            "\": ",
            "\", \"",
            "\"}",
            "}}",
            "]}",
            "[\"",
            "\"]",
            ", ",
            "true",
            "false",
            "null",
            "name",
            "arguments",
            "get_weather",
            "get_time",
            "city",
            "Paris",
            "Par",
            "\"city\": \"",
            "celsius",
            "12",
            "3.5",
            "e-2",
            "\\n",
            "\\u00e9",
            "é",
            "日本",
            "    ",
            "\n",
            "\n\n  ",
            "\t",
            "tier",
            "pro",
            "items",
            "sku",
            "1",
        ] {
            v.push(w.as_bytes().to_vec());
        }
        v.push(b"\xFF<|end|>".to_vec());
        v.push(b"\xFF<|other|>".to_vec());
        let end = v.len() as u32 - 2;
        (v, vec![end])
    }

    fn env() -> (GrammarEnv, Vec<Vec<u8>>) {
        let (v, stops) = vocab();
        (GrammarEnv::new(v.clone(), stops).unwrap(), v)
    }

    /// Random walks over what the mask allows: the text of each walk that ended (the grammar
    /// complete, or an end-of-generation token chosen), and checks at every step that the
    /// mask allows what `allowed` says and never a control token but the stop id.
    fn walks(v: &[Vec<u8>], make: &dyn Fn() -> GrammarConstraint, n: usize, seed: u64) -> Vec<String> {
        let mut rng = resin_engine::Rng::new(seed);
        let stop = v.len() as u32 - 2;
        let mut out = Vec::new();
        for _ in 0..n {
            let mut c = make();
            let mut text = Vec::new();
            let mut ended = false;
            for _ in 0..300 {
                let ok = c.allowed(v.len() + 5);
                let mut logits = vec![0.0f32; v.len() + 5];
                c.mask(&mut logits);
                assert_eq!(ok, logits.iter().map(|l| l.is_finite()).collect::<Vec<_>>(), "mask and allowed agree");
                assert!(!ok[v.len() - 1] && ok[v.len()..].iter().all(|&o| !o), "control tokens and ids past the vocabulary are never allowed");
                let ids: Vec<usize> = (0..ok.len()).filter(|&i| ok[i]).collect();
                assert!(!ids.is_empty(), "stuck after {:?}", String::from_utf8_lossy(&text));
                let t = ids[(rng.next_u64() % ids.len() as u64) as usize] as u32;
                if t == stop {
                    ended = true;
                    break;
                }
                text.extend_from_slice(&v[t as usize]);
                if c.accept(t) {
                    assert!(c.is_done(), "{:?}", c.error());
                    ended = true;
                    break;
                }
            }
            if ended {
                out.push(String::from_utf8(text).expect("the grammar keeps UTF-8 whole"));
            }
        }
        assert!(out.len() >= n / 10, "only {} of {n} walks ended", out.len());
        out
    }

    /// Parse a walk's JSON. Random walks write numbers of any size (`3.5e494612`, valid JSON
    /// that serde_json refuses as out of range): exponents of three digits or more become `e0`
    /// first (inside strings too, which only shortens them).
    fn parse(t: &str) -> Value {
        let b = t.as_bytes();
        let mut out = String::new();
        let mut i = 0;
        while i < b.len() {
            out.push(b[i] as char);
            if (b[i] == b'e' || b[i] == b'E') && i > 0 && b[i - 1].is_ascii_digit() {
                let mut j = i + 1;
                while j < b.len() && (b[j] == b'+' || b[j] == b'-') {
                    j += 1;
                }
                let k = (j..b.len()).find(|&k| !b[k].is_ascii_digit()).unwrap_or(b.len());
                if k - j >= 3 {
                    out.push('0');
                    i = k;
                    continue;
                }
            }
            i += 1;
        }
        // (Bytes pushed as chars: rebuild the UTF-8 of non-ASCII text.)
        let out: Vec<u8> = out.chars().map(|c| c as u32 as u8).collect();
        serde_json::from_slice(&out).unwrap_or_else(|e| panic!("{t:?}: {e}"))
    }

    #[test]
    fn json_schema_walks_always_validate() {
        let (env, v) = env();
        let schema = json!({
            "type": "object",
            "properties": {
                "customer": {"type": "object", "properties": {
                    "name": {"type": "string", "maxLength": 8},
                    "tier": {"enum": ["free", "pro"]},
                    "age": {"type": "integer", "minimum": 0, "maximum": 99}},
                    "required": ["name", "tier"], "additionalProperties": false},
                "items": {"type": "array", "items": {"type": "number"}, "maxItems": 3},
                "paid": {"type": "boolean"}
            },
            "required": ["customer", "items"],
            "additionalProperties": false
        });
        let texts = walks(&v, &|| env.json_schema(&schema).unwrap(), 200, 7);
        for t in &texts {
            let j = parse(t);
            let c = &j["customer"];
            assert!(c["name"].as_str().is_some_and(|n| n.chars().count() <= 8), "{t}");
            assert!(["free", "pro"].contains(&c["tier"].as_str().unwrap()), "{t}");
            assert!(c.get("age").is_none_or(|a| a.as_u64().is_some_and(|a| a <= 99)), "{t}");
            assert!(c.as_object().unwrap().keys().all(|k| ["name", "tier", "age"].contains(&k.as_str())), "{t}");
            let items = j["items"].as_array().unwrap();
            assert!(items.len() <= 3 && items.iter().all(Value::is_number), "{t}");
            assert!(j.get("paid").is_none_or(Value::is_boolean), "{t}");
            // The layout: compact with a space after ',' and ':'.
            assert!(t.starts_with("{\"customer\": {\"name\": \""), "{t}");
        }
    }

    #[test]
    fn json_object_walks_parse() {
        let (env, v) = env();
        for t in walks(&v, &|| env.json_schema(&json!({"type": "object"})).unwrap(), 100, 3) {
            assert!(parse(&t).is_object());
        }
    }

    #[test]
    fn tool_call_walks_are_calls() {
        let (env, v) = env();
        let tools = vec![
            (
                "get_weather".to_string(),
                json!({"type": "object", "properties": {"city": {"$ref": "#/$defs/city"}, "unit": {"enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer"}},
                    "required": ["city"], "$defs": {"city": {"type": "string", "maxLength": 10}}}),
            ),
            ("get_time".to_string(), json!({"properties": {"tz": {"type": "string"}}, "uniqueItems": true})),
        ];
        let names = vec!["get_weather".to_string(), "get_time".to_string()];
        for t in walks(&v, &|| env.tool_call(&tools).unwrap(), 200, 11) {
            let j = parse(&t);
            assert!(t.starts_with("{\"name\": \""), "{t}");
            let calls = crate::tools::parse_tool_calls(&j.to_string(), &names).unwrap_or_else(|| panic!("not a call: {t}")).1;
            assert_eq!(calls.len(), 1);
            if j["name"] == "get_weather" {
                assert!(j["arguments"]["city"].as_str().is_some_and(|c| c.chars().count() <= 10), "{t}");
                assert!(j["arguments"].get("days").is_none_or(|d| d.as_f64().is_some_and(|f| f.fract() == 0.0)), "{t}");
                assert!(j["arguments"].as_object().unwrap().keys().all(|k| ["city", "unit", "days"].contains(&k.as_str())), "{t}");
            }
        }
    }

    #[test]
    fn tool_arguments_take_only_declared_members() {
        let mut s = json!({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}},
            "c": {"type": "array", "items": {"properties": {"d": {}}}}, "e": {"type": "object", "additionalProperties": true, "properties": {}}},
            "$defs": {"x": {"properties": {"y": {}}}}});
        close_objects(&mut s, 0);
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["properties"]["a"]["additionalProperties"], false);
        assert_eq!(s["properties"]["c"]["items"]["additionalProperties"], false);
        assert_eq!(s["properties"]["e"]["additionalProperties"], true);
        assert_eq!(s["$defs"]["x"]["additionalProperties"], false);
        // Free objects stay free.
        let mut free = json!({"type": "object"});
        close_objects(&mut free, 0);
        assert_eq!(free, json!({"type": "object"}));
    }

    #[test]
    fn strict_mode_closes_objects_and_names_its_rules() {
        let order = json!({"type": "object", "properties": {
                "customer": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": ["integer", "null"]}}, "required": ["name", "age"]},
                "items": {"type": "array", "items": {"$ref": "#/$defs/item"}}},
            "required": ["customer", "items"],
            "$defs": {"item": {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"], "additionalProperties": false}}});
        let s = strict_schema(&order, "order").unwrap();
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["properties"]["customer"]["additionalProperties"], false);
        assert_eq!(s["$defs"]["item"], order["$defs"]["item"]);
        // What it refuses, named with where.
        let refused = |schema: Value, needle: &str, context: &str| {
            let e = strict_schema(&schema, "x").unwrap_err();
            assert!(e.contains(needle) && e.contains(context) && e.contains("'x'") && e.contains("strict: false"), "{e}");
        };
        let mut partial = order.clone();
        partial["properties"]["customer"]["required"] = json!(["name"]);
        refused(partial, "missing 'age'", "in context (properties, customer)");
        refused(json!({"type": "object", "properties": {"a": {}, "b": {}}}), "missing 'a', 'b'", "at the root");
        refused(json!({"type": "object", "properties": {"a": {}}, "required": ["a"], "additionalProperties": true}), "'additionalProperties' must be false", "at the root");
        refused(json!({"type": "array", "items": {"type": "object"}}), "free-form object", "in context (items)");
        refused(json!({"anyOf": [{"type": "object", "properties": {}, "patternProperties": {"^x": {}}}]}), "patternProperties", "in context (anyOf, 0)");
        refused(json!({"$defs": {"d": {"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"}}}}), "must be false", "($defs, d)");
        // Closed explicitly, empty, or no object at all: fine.
        assert!(strict_schema(&json!({"type": "object", "additionalProperties": false}), "x").is_ok());
        assert!(strict_schema(&json!({"type": "object", "properties": {}}), "x").is_ok());
        assert!(strict_schema(&json!({"type": "array", "items": {"enum": [1, 2]}}), "x").is_ok());
        assert!(strict_schema(&json!(true), "x").is_ok());
    }

    /// Under strict mode an object whose schema omits `additionalProperties` gets no member
    /// it does not declare; without, random walks write others.
    #[test]
    fn strict_walks_write_only_declared_members() {
        let (env, v) = env();
        let schema = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"]});
        let strict = strict_schema(&schema, "x").unwrap();
        let keys = |t: &String| parse(t).as_object().unwrap().keys().cloned().collect::<Vec<_>>();
        for t in walks(&v, &|| env.json_schema(&strict).unwrap(), 200, 5) {
            assert_eq!(keys(&t), ["city"], "{t}");
        }
        let open = walks(&v, &|| env.json_schema(&schema).unwrap(), 200, 5);
        assert!(open.iter().any(|t| keys(t).len() > 1), "no walk of the open schema wrote another member");
    }

    #[test]
    fn unsupported_features_are_named() {
        let (env, _) = env();
        let e = env.json_schema(&json!({"type": "array", "uniqueItems": true, "contains": {"const": 1}})).err().unwrap();
        assert!(e.contains("uniqueItems") && e.contains("contains"), "{e}");
        let e = env.json_schema(&json!({"type": "object", "properties": 3})).err().unwrap();
        assert!(e.contains("properties"), "{e}");
        // Tool schemas are lenient: the same key is ignored there.
        assert!(env.tool_call(&[("f".into(), json!({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": true}}}))]).is_ok());
        assert!(env.json_schema(&json!(true)).is_ok());
    }

    /// A value that is complete ends the constraint at its last byte; afterwards only the
    /// end-of-generation id is allowed.
    #[test]
    fn complete_output_ends_the_constraint() {
        let (env, v) = env();
        let id = |s: &str| v.iter().position(|w| w == s.as_bytes()).unwrap() as u32;
        let mut c = env.json_schema(&json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false})).unwrap();
        let first = c.allowed(v.len());
        assert!(first[id("{\"") as usize] && first[id("{") as usize] && !first[id("[") as usize] && !first[v.len() - 2]);
        for t in ["{\"", "city", "\": ", "\"", "Paris"] {
            assert!(c.allowed(v.len())[id(t) as usize], "{t}");
            assert!(!c.accept(id(t)), "{t}");
        }
        assert!(c.accept(id("\"}")));
        assert!(c.is_done());
        let ok = c.allowed(v.len());
        assert_eq!((0..ok.len()).filter(|&i| ok[i]).collect::<Vec<_>>(), vec![v.len() - 2]);
    }
}
