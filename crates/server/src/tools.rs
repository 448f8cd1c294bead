//! Recognising tool calls in model output, however the model writes them:
//! Hermes `<tool_call>{...}</tool_call>` (one or several), a bare JSON object
//! `{"name": <a declared tool>, "arguments": {...}}` (or an array of them, or several), or such
//! JSON inside a ```json fence. Output that is not a valid call of a declared tool stays text.
//!
//! [`ToolStreamer`] is the one code path for streamed and whole responses: text streams out
//! as content until something that may be a call begins; from there it is held back, and at the
//! end it becomes tool calls (when it parses as calls) or content (when it does not).

use rand::distributions::Alphanumeric;
use rand::Rng;
use serde_json::Value;

/// One recognised call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text (an object), as OpenAI returns them.
    pub arguments: String,
}

/// `call_` and 24 random letters and digits.
pub fn call_id() -> String {
    let r: String = rand::thread_rng().sample_iter(&Alphanumeric).take(24).map(char::from).collect();
    format!("call_{r}")
}

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const FENCE: &str = "```";
/// Texts that may begin a call after some prose.
const MARKERS: [&str; 2] = [HERMES_OPEN, FENCE];

/// A JSON value as a call of one of `names`, or None.
fn as_call(v: &Value, names: &[String]) -> Option<ToolCall> {
    let obj = v.as_object()?;
    // {"type": "function", "function": {...}} wraps the same thing.
    if let Some(f) = obj.get("function").filter(|f| f.is_object()) {
        if !obj.contains_key("name") {
            return as_call(f, names);
        }
    }
    let name = obj.get("name")?.as_str()?;
    if !names.iter().any(|n| n == name) {
        return None;
    }
    let args = match obj.get("arguments").or_else(|| obj.get("parameters")) {
        None => Value::Object(Default::default()),
        Some(Value::String(s)) => serde_json::from_str::<Value>(s).ok().filter(Value::is_object)?,
        Some(a @ Value::Object(_)) => a.clone(),
        Some(_) => return None,
    };
    Some(ToolCall { id: call_id(), name: name.to_string(), arguments: serde_json::to_string(&args).ok()? })
}

/// Every JSON value in `s` (objects and arrays of objects), which must hold nothing else.
fn json_calls(s: &str, names: &[String]) -> Option<Vec<ToolCall>> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let mut calls = Vec::new();
    for v in serde_json::Deserializer::from_str(s).into_iter::<Value>() {
        match v.ok()? {
            Value::Array(items) if !items.is_empty() => {
                for i in &items {
                    calls.push(as_call(i, names)?);
                }
            }
            v => calls.push(as_call(&v, names)?),
        }
    }
    (!calls.is_empty()).then_some(calls)
}

/// Strip a ``` fence (with an optional language tag) around `s`, if there is one.
fn unfence(s: &str) -> Option<&str> {
    let s = s.trim();
    let inner = s.strip_prefix(FENCE)?;
    let inner = inner.trim_start_matches(|c: char| c.is_ascii_alphanumeric());
    let end = inner.rfind(FENCE)?;
    Some(&inner[..end])
}

/// Calls in `text`, with the prose before them (possibly empty); None when `text` is no call.
pub fn parse_tool_calls(text: &str, names: &[String]) -> Option<(String, Vec<ToolCall>)> {
    if names.is_empty() {
        return None;
    }
    // Hermes: <tool_call>{...}</tool_call>, several allowed; the last may lack its closing tag.
    if let Some(start) = text.find(HERMES_OPEN) {
        let prose = text[..start].trim().to_string();
        let mut calls = Vec::new();
        let mut rest = &text[start..];
        while let Some(r) = rest.trim_start().strip_prefix(HERMES_OPEN) {
            let (inner, after) = match r.find(HERMES_CLOSE) {
                Some(e) => (&r[..e], &r[e + HERMES_CLOSE.len()..]),
                None => (r, ""),
            };
            let inner = unfence(inner).unwrap_or(inner);
            calls.extend(json_calls(inner, names)?);
            rest = after;
        }
        return rest.trim().is_empty().then_some((prose, calls));
    }
    // Bare JSON: the whole output is calls.
    if let Some(calls) = json_calls(text, names) {
        return Some((String::new(), calls));
    }
    // Fenced JSON, possibly after some prose, possibly several fences.
    let first = text.find(FENCE)?;
    let prose = text[..first].trim().to_string();
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while !rest.trim().is_empty() {
        let r = rest.trim_start().strip_prefix(FENCE)?;
        let r = r.trim_start_matches(|c: char| c.is_ascii_alphanumeric());
        let end = r.find(FENCE)?;
        calls.extend(json_calls(&r[..end], names)?);
        rest = &r[end + FENCE.len()..];
    }
    (!calls.is_empty()).then_some((prose, calls))
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Nothing but whitespace yet.
    Start,
    /// Streaming text; watching for a marker.
    Text,
    /// Holding everything back until the end.
    Held,
}

/// Splits streamed model output into content to show now and calls decided at the end.
#[derive(Debug)]
pub struct ToolStreamer {
    names: Vec<String>,
    mode: Mode,
    /// Start: all so far; Text: what is held back (a possible marker's beginning); Held: the rest.
    buf: String,
}

/// What [`ToolStreamer::finish`] decides.
#[derive(Debug, Default, PartialEq)]
pub struct Finished {
    /// Content not yet shown.
    pub content: String,
    pub calls: Vec<ToolCall>,
}

impl ToolStreamer {
    pub fn new(names: Vec<String>) -> Self {
        ToolStreamer { names, mode: Mode::Start, buf: String::new() }
    }

    /// True while nothing has been shown (the output may yet be only calls).
    pub fn holding_all(&self) -> bool {
        self.mode != Mode::Text
    }

    /// Add generated text; returns the content that may be shown now.
    pub fn push(&mut self, text: &str) -> String {
        self.buf.push_str(text);
        match self.mode {
            Mode::Held => String::new(),
            Mode::Start => {
                let t = self.buf.trim_start();
                if t.is_empty() {
                    return String::new();
                }
                let maybe_call = t.starts_with('{') || t.starts_with('[') || MARKERS.iter().any(|m| t.starts_with(m) || m.starts_with(t));
                if maybe_call {
                    self.mode = Mode::Held;
                    String::new()
                } else {
                    self.mode = Mode::Text;
                    self.text_step()
                }
            }
            Mode::Text => self.text_step(),
        }
    }

    /// In text mode: show everything before a marker (or a possible marker's beginning).
    fn text_step(&mut self) -> String {
        if let Some(i) = MARKERS.iter().filter_map(|m| self.buf.find(m)).min() {
            let shown = self.buf[..i].to_string();
            self.buf.drain(..i);
            self.mode = Mode::Held;
            return shown;
        }
        // Hold back the longest tail that a marker starts with.
        let keep = MARKERS.iter().map(|m| resin_engine::partial_tail(&self.buf, m)).max().unwrap_or(0);
        let cut = self.buf.len() - keep;
        let shown = self.buf[..cut].to_string();
        self.buf.drain(..cut);
        shown
    }

    /// The end of the output: the calls (if what was held parses as calls) and the content left.
    pub fn finish(self) -> Finished {
        if self.mode == Mode::Held {
            if let Some((prose, calls)) = parse_tool_calls(&self.buf, &self.names) {
                return Finished { content: prose, calls };
            }
        }
        Finished { content: self.buf, calls: Vec::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["get_weather".into(), "get_time".into()]
    }

    fn parsed(text: &str) -> Option<(String, Vec<(String, Value)>)> {
        parse_tool_calls(text, &names()).map(|(p, c)| (p, c.into_iter().map(|c| (c.name, serde_json::from_str(&c.arguments).unwrap())).collect()))
    }

    #[test]
    fn hermes_calls() {
        let t = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (p, c) = parsed(t).unwrap();
        assert_eq!(p, "");
        assert_eq!(c, vec![("get_weather".to_string(), serde_json::json!({"city": "Paris"}))]);
        let t2 = "Let me check.\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>\n<tool_call>{\"name\": \"get_time\", \"arguments\": \"{\\\"tz\\\": \\\"CET\\\"}\"}";
        let (p, c) = parsed(t2).unwrap();
        assert_eq!(p, "Let me check.");
        assert_eq!(c.len(), 2);
        assert_eq!(c[1], ("get_time".to_string(), serde_json::json!({"tz": "CET"})));
        // Ids look like OpenAI's.
        let calls = parse_tool_calls(t, &names()).unwrap().1;
        assert!(calls[0].id.starts_with("call_") && calls[0].id.len() == 29);
    }

    #[test]
    fn bare_and_fenced_json() {
        let (_, c) = parsed("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}").unwrap();
        assert_eq!(c[0].1["city"], "Oslo");
        let (_, c) = parsed("```json\n{\"name\": \"get_time\", \"arguments\": {}}\n```").unwrap();
        assert_eq!(c[0].0, "get_time");
        let (p, c) = parsed(
            "Sure:\n```json\n{\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}\n```\n```json\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n```",
        )
        .unwrap();
        assert_eq!(p, "Sure:");
        assert_eq!(c.len(), 2);
        let (_, c) = parsed("[{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"X\"}}]").unwrap();
        assert_eq!(c.len(), 2);
        let (_, c) = parsed("{\"name\": \"get_time\", \"arguments\": {}}\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Z\"}}").unwrap();
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn not_calls_stay_text() {
        for t in [
            "",
            "The weather is nice.",
            "{\"name\": \"launch_rockets\", \"arguments\": {}}",
            "{\"name\": \"get_time\", \"arguments\": [1]}",
            "{\"name\": \"get_time\", \"arguments\": {}",
            "<tool_call>{\"name\": \"get_time\"</tool_call>",
            "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call> and then some words",
            "```python\nprint(1)\n```",
            "{\"city\": \"Paris\"}",
        ] {
            assert!(parsed(t).is_none(), "{t}");
        }
    }

    fn stream(pieces: &[&str]) -> (String, Finished) {
        let mut s = ToolStreamer::new(names());
        let mut shown = String::new();
        for p in pieces {
            shown += &s.push(p);
        }
        (shown, s.finish())
    }

    #[test]
    fn streamer_text_passes_and_calls_are_held() {
        let (shown, f) = stream(&["Hello", " there", ", friend."]);
        assert_eq!(shown + &f.content, "Hello there, friend.");
        assert!(f.calls.is_empty());

        let (shown, f) = stream(&["  <tool", "_call>{\"name\": \"get_time\", ", "\"arguments\": {}}</tool_call>"]);
        assert_eq!(shown, "");
        assert_eq!(f.calls.len(), 1);
        assert_eq!(f.content, "");

        let (shown, f) = stream(&["I will look. <to", "ol_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>"]);
        assert_eq!(shown, "I will look. ");
        assert_eq!(f.calls.len(), 1);

        // A held beginning that turns out not to be a call comes out as content at the end.
        let (shown, f) = stream(&["{\"answer\": ", "42}"]);
        assert_eq!(shown, "");
        assert_eq!(f.content, "{\"answer\": 42}");
        assert!(f.calls.is_empty());

        // A `<` that is not a marker is shown once it is clear.
        let (shown, f) = stream(&["a <", "b"]);
        assert_eq!(shown + &f.content, "a <b");
    }
}
