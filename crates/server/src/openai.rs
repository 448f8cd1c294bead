//! The OpenAI request bodies and their checks.

use resin_engine::SamplingParams;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;

/// `stop`: one string or several.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The fields both completion endpoints share (unknown fields are ignored, as OpenAI's
/// compatible servers do).
#[derive(Debug, Default, Deserialize)]
pub struct CommonRequest {
    pub model: Option<String>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub stop: Option<Stop>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// llama.cpp's name; `repetition_penalty` is accepted too.
    #[serde(alias = "repetition_penalty")]
    pub repeat_penalty: Option<f32>,
    pub n: Option<i64>,
    /// llama.cpp's extension: keep generating past end-of-generation tokens (benchmarks).
    pub ignore_eos: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// `{"type": "text" | "json_object" | "json_schema", ...}` (see [`response_schema`]).
    pub response_format: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Value>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    /// Extra variables for the chat template (vLLM's and llama.cpp's extension), e.g.
    /// `{"enable_thinking": false}` for Qwen3.
    pub chat_template_kwargs: Option<Value>,
    #[serde(flatten)]
    pub common: CommonRequest,
}

/// The variables a request may not set through `chat_template_kwargs` (the server sets them).
const RESERVED_TEMPLATE_VARS: [&str; 3] = ["messages", "tools", "add_generation_prompt"];

impl ChatRequest {
    /// `chat_template_kwargs`, checked: an object (absent or null: none), not naming the
    /// variables the server sets.
    pub fn template_kwargs(&self) -> Result<serde_json::Map<String, Value>, ApiError> {
        let bad = |m: String| ApiError::invalid(m).param("chat_template_kwargs");
        match &self.chat_template_kwargs {
            None | Some(Value::Null) => Ok(serde_json::Map::new()),
            Some(Value::Object(m)) => match m.keys().find(|k| RESERVED_TEMPLATE_VARS.contains(&k.as_str())) {
                Some(k) => Err(bad(format!("chat_template_kwargs may not set {k:?}; the request's own fields set it."))),
                None => Ok(m.clone()),
            },
            Some(_) => Err(bad("chat_template_kwargs must be an object of template variables.".into())),
        }
    }
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Value,
    /// The legacy shape: how many most likely tokens each position lists (0..=20).
    pub logprobs: Option<i64>,
    #[serde(flatten)]
    pub common: CommonRequest,
}

/// Parse a body: invalid JSON and wrong types are 400s naming the field.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| ApiError::invalid(format!("The body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::invalid("The body must be a JSON object."));
    }
    // Check the shared fields first, without `flatten` (whose errors lose the field's name).
    let _: CommonRequest = from_value(v.clone())?;
    from_value(v)
}

fn from_value<T: DeserializeOwned>(v: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize::<_, T>(v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        let mut err = ApiError::invalid(if path == "." { format!("Invalid request: {inner}") } else { format!("Invalid value for '{path}': {inner}") });
        if path != "." {
            err = err.param(path);
        }
        err
    })
}

/// What a request asks of the engine, checked.
#[derive(Debug, Clone)]
pub struct Plan {
    pub params: SamplingParams,
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
    /// Some(k): each token's log-probability and the k most likely at its position.
    pub logprobs: Option<usize>,
}

/// The most `top_logprobs` (chat) or `logprobs` (completions) a request may ask for.
pub const MAX_TOP_LOGPROBS: i64 = 20;

impl ChatRequest {
    /// `logprobs` and `top_logprobs`, checked: Some(k) when log-probabilities are asked for.
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        let on = self.logprobs.unwrap_or(false);
        match self.top_logprobs {
            Some(k) if !(0..=MAX_TOP_LOGPROBS).contains(&k) => {
                Err(ApiError::invalid(format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS} (got {k}).")).param("top_logprobs"))
            }
            Some(_) if !on => Err(ApiError::invalid("top_logprobs needs logprobs: true.").param("top_logprobs")),
            k => Ok(on.then_some(k.unwrap_or(0) as usize)),
        }
    }
}

impl CompletionRequest {
    /// `logprobs` (the legacy integer), checked.
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        match self.logprobs {
            Some(k) if !(0..=MAX_TOP_LOGPROBS).contains(&k) => Err(ApiError::invalid(format!("logprobs must be between 0 and {MAX_TOP_LOGPROBS} (got {k}).")).param("logprobs")),
            k => Ok(k.map(|k| k as usize)),
        }
    }
}

impl CommonRequest {
    /// Check the model name and the parameters' ranges.
    pub fn plan(&self, model_id: &str, n_ctx: usize, max_stop: usize) -> Result<Plan, ApiError> {
        if let Some(m) = &self.model {
            if !m.is_empty() && m != model_id && m.strip_suffix(".gguf") != Some(model_id) {
                return Err(ApiError::not_found(format!("The model '{m}' does not exist; this server serves '{model_id}'.")).param("model").code("model_not_found"));
            }
        }
        if let Some(n) = self.n {
            if n != 1 {
                return Err(ApiError::invalid(format!("n must be 1 (got {n}); this server returns one choice.")).param("n"));
            }
        }
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(v), _) => Some(("max_completion_tokens", v)),
            (None, Some(v)) => Some(("max_tokens", v)),
            _ => None,
        };
        let max_tokens = match max_tokens {
            Some((name, v)) if v < 1 || v as u64 > n_ctx as u64 => {
                return Err(ApiError::invalid(format!("{name} must be between 1 and the context length {n_ctx} (got {v}).")).param(name));
            }
            Some((_, v)) => Some(v as usize),
            None => None,
        };
        // Defaults for what the request leaves out: llama.cpp's.
        let mut p = SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, ..SamplingParams::default() };
        if let Some(t) = self.temperature {
            p.temperature = t;
        }
        if let Some(v) = self.top_p {
            p.top_p = v;
        }
        if let Some(k) = self.top_k {
            if k < 0 {
                return Err(ApiError::invalid(format!("top_k must be 0 (off) or positive (got {k}).")).param("top_k"));
            }
            p.top_k = k as usize;
        }
        if let Some(v) = self.min_p {
            p.min_p = v;
        }
        if let Some(v) = self.presence_penalty {
            p.presence_penalty = v;
        }
        if let Some(v) = self.frequency_penalty {
            p.frequency_penalty = v;
        }
        if let Some(v) = self.repeat_penalty {
            p.repetition_penalty = v;
        }
        p.seed = self.seed.map(|s| s as u64);
        p.validate().map_err(|m| ApiError::invalid(format!("Invalid sampling parameters: {m}.")))?;
        let stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        let stop: Vec<String> = stop.into_iter().filter(|s| !s.is_empty()).collect();
        if stop.len() > max_stop {
            return Err(ApiError::invalid(format!("At most {max_stop} stop sequences are allowed (got {}).", stop.len())).param("stop"));
        }
        Ok(Plan {
            params: p,
            max_tokens,
            stop,
            stream: self.stream.unwrap_or(false),
            include_usage: self.stream_options.as_ref().is_some_and(|o| o.include_usage),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            logprobs: None,
        })
    }
}

/// The JSON schema `response_format` asks the output to follow: None for free text (absent,
/// null or `{"type": "text"}`); `{"type": "object"}` for `json_object` (or its `schema`,
/// llama.cpp's extension); `json_schema.schema` for `json_schema` (any JSON value where it
/// has none). With `strict: true` the schema follows OpenAI's strict mode (see
/// [`crate::grammar::strict_schema`]: objects closed, every property required, a 400 naming the
/// rule a schema breaks); otherwise it means what JSON Schema says (members not declared are
/// allowed unless `additionalProperties` says otherwise, properties not `required` are optional).
pub fn response_schema(v: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let bad = |m: &str| Err(ApiError::invalid(m.to_string()).param("response_format"));
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let Some(kind) = v.get("type").and_then(Value::as_str) else {
        return bad("response_format must be an object with a 'type': \"text\", \"json_object\" or \"json_schema\".");
    };
    let schema_of = |s: Option<&Value>, default: Value| match s {
        None | Some(Value::Null) => Ok(Some(default)),
        Some(s @ (Value::Object(_) | Value::Bool(_))) => Ok(Some(s.clone())),
        Some(_) => bad("response_format's schema must be a JSON schema (an object)."),
    };
    match kind {
        "text" => Ok(None),
        "json_object" => schema_of(v.get("schema"), serde_json::json!({"type": "object"})),
        "json_schema" => match v.get("json_schema") {
            Some(js @ Value::Object(_)) => {
                let strict = match js.get("strict") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(_) => return bad("response_format.json_schema.strict must be a boolean."),
                };
                let schema = schema_of(js.get("schema"), serde_json::json!({}))?;
                match schema {
                    Some(s) if strict => {
                        let name = js.get("name").and_then(Value::as_str).unwrap_or("");
                        crate::grammar::strict_schema(&s, name).map(Some).or_else(|e| bad(&e))
                    }
                    s => Ok(s),
                }
            }
            _ => bad("response_format of type \"json_schema\" needs a 'json_schema' object ({\"name\", \"schema\", \"strict\"})."),
        },
        other => bad(&format!("response_format type {other:?} is not one of \"text\", \"json_object\", \"json_schema\".")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_types_name_the_field() {
        let e = parse::<ChatRequest>(br#"{"messages": [], "temperature": "hot"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = parse::<ChatRequest>(br#"{"messages": "hi"}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = parse::<ChatRequest>(br#"{"model": "x"}"#).unwrap_err();
        assert!(e.message.contains("messages"), "{}", e.message);
        assert!(parse::<ChatRequest>(b"{not json").unwrap_err().message.contains("not valid JSON"));
        let r = parse::<ChatRequest>(br#"{"messages": [], "stop": ["a", "b"], "max_tokens": 5, "extra": 1}"#).unwrap();
        assert!(matches!(r.common.stop, Some(Stop::Many(ref v)) if v.len() == 2));
    }

    #[test]
    fn plan_checks_ranges() {
        let c = |j: &str| parse::<CompletionRequest>(j.as_bytes()).unwrap().common;
        assert_eq!(c(r#"{"prompt": "a", "model": "other"}"#).plan("m", 100, 4).unwrap_err().status.as_u16(), 404);
        assert!(c(r#"{"prompt": "a", "model": "m"}"#).plan("m", 100, 4).is_ok());
        assert_eq!(c(r#"{"prompt": "a", "n": 2}"#).plan("m", 100, 4).unwrap_err().param.as_deref(), Some("n"));
        assert!(c(r#"{"prompt": "a", "max_tokens": 0}"#).plan("m", 100, 4).is_err());
        assert!(c(r#"{"prompt": "a", "max_tokens": 101}"#).plan("m", 100, 4).is_err());
        assert_eq!(c(r#"{"prompt": "a", "max_tokens": 100}"#).plan("m", 100, 4).unwrap().max_tokens, Some(100));
        assert!(c(r#"{"prompt": "a", "temperature": -1}"#).plan("m", 100, 4).is_err());
        assert!(c(r#"{"prompt": "a", "stop": ["1","2","3","4","5"]}"#).plan("m", 100, 4).is_err());
        let p = c(r#"{"prompt": "a", "temperature": 0, "stop": "x", "stream": true, "stream_options": {"include_usage": true}}"#).plan("m", 100, 4).unwrap();
        assert!(p.params.is_greedy() && p.stream && p.include_usage && p.stop == vec!["x".to_string()]);
    }

    #[test]
    fn response_format_gives_the_schema() {
        let f = |j: &str| response_schema(Some(&serde_json::from_str::<Value>(j).unwrap()));
        assert_eq!(response_schema(None).unwrap(), None);
        assert_eq!(f("null").unwrap(), None);
        assert_eq!(f(r#"{"type": "text"}"#).unwrap(), None);
        assert_eq!(f(r#"{"type": "json_object"}"#).unwrap(), Some(serde_json::json!({"type": "object"})));
        let s = serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
        let js = |strict: &str| format!(r#"{{"type": "json_schema", "json_schema": {{"name": "x", "schema": {s}{strict}}}}}"#);
        // Strict: the object is closed; otherwise the schema means what JSON Schema says.
        let mut closed = s.clone();
        closed["additionalProperties"] = serde_json::json!(false);
        assert_eq!(f(&js(r#", "strict": true"#)).unwrap(), Some(closed));
        assert_eq!(f(&js(r#", "strict": false"#)).unwrap(), Some(s.clone()));
        assert_eq!(f(&js("")).unwrap(), Some(s.clone()));
        let e = f(r#"{"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {"type": "object", "properties": {"a": {}}}}}"#).unwrap_err();
        assert!(e.param.as_deref() == Some("response_format") && e.message.contains("missing 'a'"), "{e:?}");
        assert_eq!(f(&format!(r#"{{"type": "json_object", "schema": {s}}}"#)).unwrap(), Some(s));
        assert_eq!(f(r#"{"type": "json_schema", "json_schema": {"name": "x"}}"#).unwrap(), Some(serde_json::json!({})));
        for bad in [
            r#"{"type": "xml"}"#,
            r#"{"type": "json_schema"}"#,
            r#""json""#,
            r#"{"type": "json_schema", "json_schema": {"schema": 3}}"#,
            r#"{"type": "json_schema", "json_schema": {"strict": "yes"}}"#,
        ] {
            assert_eq!(f(bad).unwrap_err().param.as_deref(), Some("response_format"), "{bad}");
        }
    }

    #[test]
    fn logprobs_are_checked() {
        let chat = |j: &str| parse::<ChatRequest>(j.as_bytes()).unwrap().logprobs();
        assert_eq!(chat(r#"{"messages": []}"#).unwrap(), None);
        assert_eq!(chat(r#"{"messages": [], "logprobs": false}"#).unwrap(), None);
        assert_eq!(chat(r#"{"messages": [], "logprobs": true}"#).unwrap(), Some(0));
        assert_eq!(chat(r#"{"messages": [], "logprobs": true, "top_logprobs": 20}"#).unwrap(), Some(20));
        assert_eq!(chat(r#"{"messages": [], "logprobs": true, "top_logprobs": 21}"#).unwrap_err().param.as_deref(), Some("top_logprobs"));
        assert_eq!(chat(r#"{"messages": [], "logprobs": true, "top_logprobs": -1}"#).unwrap_err().param.as_deref(), Some("top_logprobs"));
        assert_eq!(chat(r#"{"messages": [], "top_logprobs": 3}"#).unwrap_err().param.as_deref(), Some("top_logprobs"));
        assert_eq!(parse::<ChatRequest>(br#"{"messages": [], "logprobs": 3}"#).unwrap_err().param.as_deref(), Some("logprobs"));
        let cmpl = |j: &str| parse::<CompletionRequest>(j.as_bytes()).unwrap().logprobs();
        assert_eq!(cmpl(r#"{"prompt": "a"}"#).unwrap(), None);
        assert_eq!(cmpl(r#"{"prompt": "a", "logprobs": 0}"#).unwrap(), Some(0));
        assert_eq!(cmpl(r#"{"prompt": "a", "logprobs": 5}"#).unwrap(), Some(5));
        assert_eq!(cmpl(r#"{"prompt": "a", "logprobs": 21}"#).unwrap_err().param.as_deref(), Some("logprobs"));
        assert_eq!(cmpl(r#"{"prompt": "a", "logprobs": -2}"#).unwrap_err().status.as_u16(), 400);
    }
}
