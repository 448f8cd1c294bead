//! The chat template a GGUF file carries in `tokenizer.chat_template`, rendered with minijinja
//! the way Hugging Face transformers renders it with Jinja2 (`apply_chat_template`):
//! `trim_blocks` and `lstrip_blocks` on, a single trailing newline of the template dropped,
//! `loopcontrols`, `raise_exception(msg)`, `strftime_now(fmt)`, and a `tojson` filter that is
//! Python's `json.dumps(x, ensure_ascii=False)` (key order kept, `indent`, `separators`,
//! `sort_keys` and `ensure_ascii` accepted). Python string and dict methods (`.strip()`,
//! `.startswith()`, `.split()`, `.items()`, ...) come from minijinja-contrib's pycompat.

use std::fmt::Write as _;

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};
use resin_gguf::GgufFile;

use crate::{ModelError, Result};

const NAME: &str = "chat_template";
const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

/// Gemma's turn format, for a gemma3 file that carries no template of its own (the base 270M):
/// the template Google ships with the instruction-tuned Gemma 3 models, for text turns. A
/// system message becomes the head of the first user turn, the assistant's role is `model`,
/// and roles must alternate.
const GEMMA_TURNS: &str = "{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = '' -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}
    {%- endif -%}
    {%- if message['role'] == 'assistant' -%}
        {%- set role = 'model' -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{- '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') -}}
    {{- (message['content'] or '') | trim -}}
    {{- '<end_of_turn>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<start_of_turn>model\n' -}}
{%- endif -%}";

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("bytes", &self.source.len()).field("bos_token", &self.bos_token).field("eos_token", &self.eos_token).finish()
    }
}

fn terr(e: impl std::fmt::Display) -> ModelError {
    ModelError::Template(e.to_string())
}

fn token_text(f: &GgufFile, key: &str) -> Result<Option<String>> {
    let Some(id) = f.get_u64(key)? else { return Ok(None) };
    let text = f.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()).and_then(|a| a.get(usize::try_from(id).ok()?)).and_then(|v| v.as_str());
    Ok(text.map(str::to_owned))
}

impl ChatTemplate {
    /// The template of `tokenizer.chat_template`, with `bos_token` / `eos_token` set to the texts
    /// of `tokenizer.ggml.bos_token_id` / `eos_token_id`. A gemma3 file without one gets
    /// Gemma's turn format (`<start_of_turn>user ... <end_of_turn>`, then `<start_of_turn>model`).
    /// `None` when the file has no template and its family has no known turn format.
    pub fn from_gguf(f: &GgufFile) -> Result<Option<Self>> {
        let source = match f.get_str("tokenizer.chat_template")? {
            Some(source) => source,
            None if f.get_str("general.architecture")? == Some("gemma3") => GEMMA_TURNS,
            None => return Ok(None),
        };
        let bos = token_text(f, "tokenizer.ggml.bos_token_id")?;
        let eos = token_text(f, "tokenizer.ggml.eos_token_id")?;
        Self::new(source, bos.as_deref(), eos.as_deref()).map(Some)
    }

    /// Compiles `source`. `bos_token` / `eos_token` become template variables when given.
    pub fn new(source: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(NAME, source.to_owned()).map_err(terr)?;
        Ok(ChatTemplate { env, source: source.to_owned(), bos_token: bos_token.map(str::to_owned), eos_token: eos_token.map(str::to_owned) })
    }

    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The tags that enclose the model's reasoning when the template is one that thinks
    /// (Qwen3, QwQ, DeepSeek-R1 distills: `<think>` ... `</think>`, which the template writes
    /// or strips in assistant turns); None for a template that does not mention them.
    pub fn reasoning_tags(&self) -> Option<(&'static str, &'static str)> {
        (self.source.contains(THINK_OPEN) && self.source.contains(THINK_CLOSE)).then_some((THINK_OPEN, THINK_CLOSE))
    }

    /// Renders a conversation: `messages` (OpenAI-style objects: role, content, tool_calls, ...),
    /// `tools` (function schemas; `None` renders as Python's None, as HF passes it) and whether
    /// to open the assistant's turn.
    pub fn render(&self, messages: &[serde_json::Value], tools: Option<&[serde_json::Value]>, add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, tools, add_generation_prompt, &serde_json::Map::new())
    }

    /// As [`render`](Self::render), with extra template variables (e.g. `enable_thinking`,
    /// `date_string`); they override the defaults.
    pub fn render_with(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), Value::from_serialize(messages)),
            ("tools".into(), tools.map(Value::from_serialize).unwrap_or(Value::from(()))),
            ("documents".into(), Value::from(())),
            ("add_generation_prompt".into(), Value::from(add_generation_prompt)),
        ];
        if let Some(b) = &self.bos_token {
            ctx.push(("bos_token".into(), Value::from(b.as_str())));
        }
        if let Some(e) = &self.eos_token {
            ctx.push(("eos_token".into(), Value::from(e.as_str())));
        }
        for (k, v) in extra {
            ctx.retain(|(name, _)| name != k);
            ctx.push((k.clone(), Value::from_serialize(v)));
        }
        let ctx: Value = ctx.into_iter().collect();
        let tmpl = self.env.get_template(NAME).map_err(terr)?;
        tmpl.render(ctx).map_err(|e| {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                let _ = write!(msg, ": {s}");
                src = s.source();
            }
            ModelError::Template(msg)
        })
    }
}

/// Prints none and booleans as Python does (`None`, `True`, `False`).
fn python_formatter(out: &mut minijinja::Output, state: &State, value: &Value) -> std::result::Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.write_str("None")?,
        ValueKind::Bool => out.write_str(if value.is_true() { "True" } else { "False" })?,
        _ => minijinja::escape_formatter(out, state, value)?,
    }
    Ok(())
}

fn raise_exception(msg: String) -> std::result::Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// The current UTC time formatted with a strftime subset (%Y %y %m %d %e %H %I %M %S %p %j %b %B
/// %a %A %%).
fn strftime_now(fmt: String) -> std::result::Result<String, Error> {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    Ok(strftime(&fmt, secs))
}

fn strftime(fmt: &str, secs: i64) -> String {
    const MONTHS: [&str; 12] = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (hour, min, sec) = (sod / 3600, sod % 3600 / 60, sod % 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy0 = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy0 + 2) / 153;
    let day = doy0 - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + if month <= 2 { 1 } else { 0 };
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let cum = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = cum[(month - 1) as usize] + day + if leap && month > 2 { 1 } else { 0 };
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mname = MONTHS[(month - 1) as usize];
        let dname = DAYS[weekday];
        match chars.next() {
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('m') => write!(out, "{month:02}"),
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:2}"),
            Some('H') => write!(out, "{hour:02}"),
            Some('I') => write!(out, "{:02}", if hour % 12 == 0 { 12 } else { hour % 12 }),
            Some('M') => write!(out, "{min:02}"),
            Some('S') => write!(out, "{sec:02}"),
            Some('p') => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            Some('j') => write!(out, "{yday:03}"),
            Some('b') => write!(out, "{}", &mname[..3]),
            Some('B') => write!(out, "{mname}"),
            Some('a') => write!(out, "{}", &dname[..3]),
            Some('A') => write!(out, "{dname}"),
            Some('%') => write!(out, "%"),
            Some(o) => write!(out, "%{o}"),
            None => write!(out, "%"),
        }
        .unwrap();
    }
    out
}

/// `tojson` as HF defines it: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.is_integer() => Some(" ".repeat(i64::try_from(v)?.max(0) as usize)),
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_owned()),
            None => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: indent must be an integer or a string")),
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(s) if !s.is_none() => {
            let a = s.get_item_by_index(0)?;
            let b = s.get_item_by_index(1)?;
            match (a.as_str(), b.as_str()) {
                (Some(a), Some(b)) => (a.to_owned(), b.to_owned()),
                _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings")),
            }
        }
        _ => ((if indent.is_some() { "," } else { ", " }).to_owned(), ": ".to_owned()),
    };
    let opts = JsonOpts { ensure_ascii: ensure_ascii.unwrap_or(false), indent, item_sep, key_sep, sort_keys: sort_keys.unwrap_or(false) };
    let mut out = String::new();
    py_json(value, &opts, 0, &mut out)?;
    Ok(Value::from(out))
}

struct JsonOpts {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

fn py_json(v: &Value, o: &JsonOpts, level: usize, out: &mut String) -> std::result::Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Undefined => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: Object of type Undefined is not JSON serializable")),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                write!(out, "{v}").unwrap();
            } else {
                out.push_str(&py_float(f64::try_from(v.clone())?));
            }
        }
        ValueKind::String => py_str(v.as_str().unwrap_or_default(), o.ensure_ascii, out),
        ValueKind::Map => {
            let mut items = Vec::new();
            for k in v.try_iter()? {
                let val = v.get_item(&k)?;
                items.push((py_key(&k)?, val));
            }
            if o.sort_keys {
                items.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if items.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (k, val)) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(o, level + 1, out);
                py_str(k, o.ensure_ascii, out);
                out.push_str(&o.key_sep);
                py_json(val, o, level + 1, out)?;
            }
            newline(o, level, out);
            out.push('}');
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, val) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&o.item_sep);
                }
                newline(o, level + 1, out);
                py_json(val, o, level + 1, out)?;
            }
            newline(o, level, out);
            out.push(']');
        }
        _ => return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: Object of kind {} is not JSON serializable", v.kind()))),
    }
    Ok(())
}

fn newline(o: &JsonOpts, level: usize, out: &mut String) {
    if let Some(ind) = &o.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
}

/// A dict key as json.dumps writes it (str keys as they are, numbers and constants converted).
fn py_key(k: &Value) -> std::result::Result<String, Error> {
    Ok(match k.kind() {
        ValueKind::String => k.as_str().unwrap_or_default().to_owned(),
        ValueKind::None => "null".into(),
        ValueKind::Bool => (if k.is_true() { "true" } else { "false" }).into(),
        ValueKind::Number if k.is_integer() => k.to_string(),
        ValueKind::Number => py_float(f64::try_from(k.clone())?),
        _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: keys must be str, int, float, bool or None")),
    })
}

fn py_str(s: &str, ensure_ascii: bool, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => write!(out, "\\u{:04x}", c as u32).unwrap(),
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut buf = [0u16; 2];
                for u in c.encode_utf16(&mut buf) {
                    write!(out, "\\u{:04x}", u).unwrap();
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `repr(float)`: the shortest digits that round-trip, exponent form outside
/// 1e-4 <= |x| < 1e16.
fn py_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    // Rust's {:e} gives the shortest round-trip digits as d.ddde[-]x.
    let e = format!("{:e}", x);
    let (mant, exp) = e.split_once('e').unwrap();
    let exp: i32 = exp.parse().unwrap();
    let (sign, mant) = match mant.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mant),
    };
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let n = digits.len() as i32;
        let s = if exp >= 0 {
            let int_len = exp + 1;
            if n <= int_len {
                format!("{digits}{}.0", "0".repeat((int_len - n) as usize))
            } else {
                format!("{}.{}", &digits[..int_len as usize], &digits[int_len as usize..])
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        };
        format!("{sign}{s}")
    } else {
        let m = if digits.len() > 1 { format!("{}.{}", &digits[..1], &digits[1..]) } else { digits.clone() };
        format!("{sign}{m}e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_like_python() {
        for (x, want) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (-2.5, "-2.5"),
            (1e16, "1e+16"),
            (1234567890123456.0, "1234567890123456.0"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1.5e-7, "1.5e-07"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1e100, "1e+100"),
            (123.456, "123.456"),
        ] {
            assert_eq!(py_float(x), want, "{x}");
        }
    }

    #[test]
    fn strftime_known_date() {
        // 2024-07-26 13:05:09 UTC, a Friday.
        assert_eq!(strftime("%d %b %Y %H:%M:%S %A %j %%", 1_722_000_309), "26 Jul 2024 13:25:09 Friday 208 %");
    }
}
