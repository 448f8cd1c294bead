//! Chat messages through the model's chat template, and prompts into tokens.

use resin_model::{ChatTemplate, Tokenizer};
use serde_json::{Map, Value};

use crate::error::ApiError;

/// Check OpenAI messages and put them in the form chat templates expect: `content` a string,
/// `developer` as `system`, assistant `tool_calls` with their arguments as objects, tool
/// results with the function's `name` when the request left it out.
pub fn normalize_messages(messages: &[Value]) -> Result<Vec<Value>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages must not be empty.").param("messages"));
    }
    let mut out: Vec<Value> = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let at = |field: &str| format!("messages[{i}].{field}");
        let obj = m.as_object().ok_or_else(|| ApiError::invalid(format!("messages[{i}] must be an object.")).param(format!("messages[{i}]")))?;
        let role = obj.get("role").and_then(Value::as_str).ok_or_else(|| ApiError::invalid(format!("messages[{i}] needs a string 'role'.")).param(at("role")))?;
        let role = match role {
            "system" | "user" | "assistant" | "tool" => role,
            "developer" => "system",
            r => return Err(ApiError::invalid(format!("messages[{i}].role {r:?} is not one of system, developer, user, assistant, tool.")).param(at("role"))),
        };
        let content = match obj.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut texts = Vec::new();
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                        (Some("text") | None, Some(t)) => texts.push(t),
                        (Some(kind), _) if kind != "text" => {
                            return Err(ApiError::invalid(format!("Content parts of type {kind:?} are not supported; this model reads text.")).param(at("content")))
                        }
                        _ => return Err(ApiError::invalid("A text content part needs a string 'text'.").param(at("content"))),
                    }
                }
                texts.join("\n")
            }
            Some(_) => return Err(ApiError::invalid("content must be a string or an array of text parts.").param(at("content"))),
        };
        if role == "user" && obj.get("content").is_none() {
            return Err(ApiError::invalid(format!("messages[{i}] (user) needs 'content'.")).param(at("content")));
        }
        let mut n = Map::new();
        n.insert("role".into(), role.into());
        n.insert("content".into(), content.into());
        if let Some(name) = obj.get("name").and_then(Value::as_str) {
            n.insert("name".into(), name.into());
        }
        if role == "assistant" {
            // An earlier turn's reasoning, which templates that think may render (Qwen3 does
            // for the turns after the last user message).
            if let Some(r) = obj.get("reasoning_content").and_then(Value::as_str) {
                n.insert("reasoning_content".into(), r.into());
            }
            if let Some(calls) = obj.get("tool_calls").filter(|c| !c.is_null()) {
                let calls = calls.as_array().ok_or_else(|| ApiError::invalid("tool_calls must be an array.").param(at("tool_calls")))?;
                let mut norm = Vec::new();
                for c in calls {
                    let f = c.get("function").ok_or_else(|| ApiError::invalid("Each tool call needs a 'function'.").param(at("tool_calls")))?;
                    let name = f.get("name").and_then(Value::as_str).ok_or_else(|| ApiError::invalid("A tool call's function needs a 'name'.").param(at("tool_calls")))?;
                    let args = match f.get("arguments") {
                        Some(Value::String(s)) => serde_json::from_str::<Value>(s).unwrap_or_else(|_| Value::String(s.clone())),
                        Some(v) => v.clone(),
                        None => Value::Object(Map::new()),
                    };
                    let mut fc = Map::new();
                    fc.insert("name".into(), name.into());
                    fc.insert("arguments".into(), args);
                    let mut call = Map::new();
                    if let Some(id) = c.get("id") {
                        call.insert("id".into(), id.clone());
                    }
                    call.insert("type".into(), "function".into());
                    call.insert("function".into(), Value::Object(fc));
                    norm.push(Value::Object(call));
                }
                n.insert("tool_calls".into(), Value::Array(norm));
            }
        }
        if role == "tool" {
            if let Some(id) = obj.get("tool_call_id").and_then(Value::as_str) {
                n.insert("tool_call_id".into(), id.into());
                if !n.contains_key("name") {
                    // The function's name from the assistant turn that made this call.
                    let name = out
                        .iter()
                        .rev()
                        .filter_map(|m| m.get("tool_calls")?.as_array())
                        .flatten()
                        .find_map(|c| (c.get("id")?.as_str()? == id).then(|| c.get("function")?.get("name").cloned()).flatten());
                    if let Some(name) = name {
                        n.insert("name".into(), name);
                    }
                }
            }
        }
        out.push(Value::Object(n));
    }
    Ok(out)
}

/// ChatML, for models without a template of their own.
fn chatml(messages: &[Value]) -> String {
    let mut s = String::new();
    for m in messages {
        let role = m["role"].as_str().unwrap_or("user");
        s += &format!("<|im_start|>{role}\n{}<|im_end|>\n", m["content"].as_str().unwrap_or(""));
    }
    s + "<|im_start|>assistant\n"
}

/// The prompt text for `messages` (already normalized) and `tools`, with the request's extra
/// template variables (`chat_template_kwargs`; the ChatML fallback has none).
pub fn render(template: Option<&ChatTemplate>, messages: &[Value], tools: Option<&[Value]>, extra: &Map<String, Value>) -> Result<String, ApiError> {
    match template {
        Some(t) => t.render_with(messages, tools, true, extra).map_err(|e| ApiError::invalid(format!("The chat template could not render these messages: {e}")).param("messages")),
        None => Ok(chatml(messages)),
    }
}

/// Token ids of a prompt text. Special tokens written in the text become those tokens; BOS is
/// added as the model says, but not twice when the text (a template's output) starts with it.
/// A text too long for a context of `n_ctx` positions whatever its tokens (`param` names it) is
/// refused by its length before it is tokenized.
pub fn encode(tok: &Tokenizer, text: &str, n_ctx: usize, param: &'static str) -> Result<Vec<u32>, ApiError> {
    let least = tok.min_tokens(text.len());
    if least >= n_ctx {
        return Err(ApiError::invalid(format!(
            "This model's maximum context length is {n_ctx} tokens; the prompt ({} bytes) has at least {least} tokens (at least one more position is needed to generate).",
            text.len()
        ))
        .param(param)
        .code("context_length_exceeded"));
    }
    let mut ids = tok.encode(text, true, true).map_err(|e| ApiError::invalid(format!("The prompt could not be tokenized: {e}")))?;
    if let Some(bos) = tok.bos() {
        if ids.len() >= 2 && ids[0] == bos && ids[1] == bos {
            ids.remove(0);
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_are_normalized() {
        let m = normalize_messages(&[
            json!({"role": "developer", "content": [{"type": "text", "text": "be brief"}, {"type": "text", "text": "and kind"}]}),
            json!({"role": "user", "content": "weather?"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "call_1", "content": "sunny"}),
        ])
        .unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "be brief\nand kind"}));
        assert_eq!(m[2]["content"], "");
        assert_eq!(m[2]["tool_calls"][0]["function"]["arguments"], json!({"city": "Paris"}));
        assert_eq!(m[3]["name"], "get_weather");
        assert!(m[2].get("reasoning_content").is_none());
        let m = normalize_messages(&[json!({"role": "assistant", "content": "4", "reasoning_content": "2+2"})]).unwrap();
        assert_eq!(m[0]["reasoning_content"], "2+2");
        assert!(normalize_messages(&[]).is_err());
        assert!(normalize_messages(&[json!({"role": "wizard", "content": "x"})]).is_err());
        assert!(normalize_messages(&[json!({"role": "user", "content": 5})]).is_err());
        assert!(normalize_messages(&[json!({"role": "user", "content": [{"type": "image_url", "image_url": {}}]})]).is_err());
        assert!(normalize_messages(&[json!("hi")]).is_err());
    }
}
