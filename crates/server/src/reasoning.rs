//! Reasoning kept apart from the answer, for chat templates that think (Qwen3's
//! `<think>` ... `</think>`): what the model writes between the tags is its reasoning
//! (`reasoning_content` on OpenAI's routes, a `thinking` block on Anthropic's), the rest is the
//! answer (`content`, which the tool-call recogniser then reads).
//!
//! [`ReasoningSplitter`] is fed the generated text piece by piece, as it streams, and holds back
//! only what may still be the start of a tag (or whitespace that trimming may drop), so streamed
//! and whole responses split the same text the same way. The reasoning opens either where the
//! model writes the opening tag first thing, or in the prompt itself when the template's
//! generation prompt ends with it (`<|im_start|>assistant\n<think>\n`): then the output begins
//! inside the reasoning and only the closing tag ends it. Output that starts with anything
//! else is all answer, exactly as for a template that does not think. The reasoning is trimmed of
//! the whitespace around it, and the answer of the whitespace after the closing tag (Qwen3 writes
//! `<think>\n...\n</think>\n\n`). A generation cut inside the reasoning (`max_tokens`) has
//! reasoning and no answer.

use resin_engine::partial_tail;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: the opening tag may come.
    Start,
    /// Inside the reasoning: the closing tag ends it.
    Thinking,
    /// The answer.
    Content,
}

/// What one piece of output (or the end) gives to show.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

/// Splits streamed model output into reasoning and content.
#[derive(Debug)]
pub struct ReasoningSplitter {
    open: &'static str,
    close: &'static str,
    state: State,
    /// Text not yet given out.
    buf: String,
    /// Some reasoning has been given out (its leading whitespace is behind).
    reasoned: bool,
    /// The closing tag was just passed: the answer's leading whitespace is dropped.
    after_close: bool,
}

/// Whether a rendered prompt leaves the reasoning open: it ends with the opening tag (and
/// whitespace), as a generation prompt that starts the model thinking does.
pub fn prompt_opens(prompt: &str, open: &str, close: &str) -> bool {
    match prompt.rfind(open) {
        Some(o) => prompt[o + open.len()..].trim().is_empty() && prompt.rfind(close).is_none_or(|c| c < o),
        None => false,
    }
}

impl ReasoningSplitter {
    /// A splitter for the tags `open` / `close`; `thinking`: the prompt left the reasoning open.
    pub fn new(open: &'static str, close: &'static str, thinking: bool) -> Self {
        ReasoningSplitter { open, close, state: if thinking { State::Thinking } else { State::Start }, buf: String::new(), reasoned: false, after_close: false }
    }

    fn reason(&mut self, s: &str, out: &mut Split) {
        let s = if self.reasoned { s } else { s.trim_start() };
        if !s.is_empty() {
            self.reasoned = true;
            out.reasoning.push_str(s);
        }
    }

    /// Add generated text; returns the reasoning and the content that may be shown now.
    pub fn push(&mut self, text: &str) -> Split {
        self.buf.push_str(text);
        let mut out = Split::default();
        loop {
            match self.state {
                State::Start => {
                    let t = self.buf.trim_start();
                    if t.is_empty() || (t.len() < self.open.len() && self.open.starts_with(t)) {
                        return out;
                    }
                    if let Some(rest) = t.strip_prefix(self.open) {
                        self.buf = rest.to_string();
                        self.state = State::Thinking;
                        continue;
                    }
                    self.state = State::Content;
                    out.content = std::mem::take(&mut self.buf);
                    return out;
                }
                State::Thinking => {
                    if let Some(i) = self.buf.find(self.close) {
                        let piece = self.buf[..i].trim_end().to_string();
                        self.reason(&piece, &mut out);
                        self.buf.drain(..i + self.close.len());
                        self.state = State::Content;
                        self.after_close = true;
                        continue;
                    }
                    // Hold back a closing tag that may be forming and the whitespace before it.
                    let keep = partial_tail(&self.buf, self.close);
                    let cut = self.buf[..self.buf.len() - keep].trim_end().len();
                    let piece: String = self.buf.drain(..cut).collect();
                    self.reason(&piece, &mut out);
                    return out;
                }
                State::Content => {
                    if self.after_close {
                        let t = self.buf.trim_start();
                        if t.is_empty() {
                            self.buf.clear();
                            return out;
                        }
                        self.buf = t.to_string();
                        self.after_close = false;
                    }
                    out.content.push_str(&self.buf);
                    self.buf.clear();
                    return out;
                }
            }
        }
    }

    /// The end of the output: what was held back.
    pub fn finish(mut self) -> Split {
        let mut out = Split::default();
        let rest = std::mem::take(&mut self.buf);
        match self.state {
            State::Start => out.content = rest,
            State::Thinking => self.reason(rest.trim_end(), &mut out),
            State::Content if self.after_close => out.content = rest.trim_start().to_string(),
            State::Content => out.content = rest,
        }
        out
    }

    /// A whole output split at once.
    pub fn split(mut self, text: &str) -> Split {
        let mut a = self.push(text);
        let b = self.finish();
        a.reasoning.push_str(&b.reasoning);
        a.content.push_str(&b.content);
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn splitter(thinking: bool) -> ReasoningSplitter {
        ReasoningSplitter::new("<think>", "</think>", thinking)
    }

    /// Feeds `pieces` one by one; returns what was shown as it streamed (reasoning, content).
    fn stream(thinking: bool, pieces: &[&str]) -> (String, String) {
        let mut s = splitter(thinking);
        let (mut r, mut c) = (String::new(), String::new());
        for p in pieces {
            let o = s.push(p);
            r += &o.reasoning;
            c += &o.content;
        }
        let o = s.finish();
        (r + &o.reasoning, c + &o.content)
    }

    /// Every way of cutting `text` into two pieces and into single characters splits as the
    /// whole does.
    fn all_cuts(thinking: bool, text: &str) -> (String, String) {
        let whole = splitter(thinking).split(text);
        let want = (whole.reasoning.clone(), whole.content.clone());
        for (i, _) in text.char_indices() {
            assert_eq!(stream(thinking, &[&text[..i], &text[i..]]), want, "cut at {i} of {text:?}");
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(stream(thinking, &refs), want, "char by char: {text:?}");
        want
    }

    fn pair(r: &str, c: &str) -> (String, String) {
        (r.to_string(), c.to_string())
    }

    #[test]
    fn qwen3_output_splits() {
        // What Qwen3 writes with thinking on: the model opens the block itself.
        assert_eq!(all_cuts(false, "<think>\nThe user wants Paris.\nSo: Paris.\n</think>\n\nParis."), pair("The user wants Paris.\nSo: Paris.", "Paris."));
        // The empty block Qwen3 writes when it does not think.
        assert_eq!(all_cuts(false, "<think>\n\n</think>\n\nHello!"), pair("", "Hello!"));
        // Whitespace before the tag.
        assert_eq!(all_cuts(false, "\n<think>a b</think>c"), pair("a b", "c"));
        // Content keeps its inner whitespace and later tags are text.
        assert_eq!(all_cuts(false, "<think>x</think>\n\nline 1\n\nline <think> 2 </think>\n"), pair("x", "line 1\n\nline <think> 2 </think>\n"));
        // Multi-byte text around the tags.
        assert_eq!(all_cuts(false, "<think>日本語 🦙</think>🦙 ok"), pair("日本語 🦙", "🦙 ok"));
    }

    #[test]
    fn output_without_the_tag_is_all_content() {
        for t in ["Hello there.", "  Hello", "<thought>no</thought>", "<thin", "a <think>b</think>", "", "\n\n"] {
            assert_eq!(all_cuts(false, t), pair("", t), "{t:?}");
        }
    }

    #[test]
    fn reasoning_opened_by_the_prompt() {
        // A generation prompt that ends with `<think>\n`: the output is reasoning until the tag.
        assert_eq!(all_cuts(true, "Let me think.\nOK.\n</think>\n\nThe answer."), pair("Let me think.\nOK.", "The answer."));
        assert_eq!(all_cuts(true, "</think>answer"), pair("", "answer"));
        // `<` inside the reasoning that is no tag stays reasoning.
        assert_eq!(all_cuts(true, "a < b and </b> </thin k</think>c"), pair("a < b and </b> </thin k", "c"));
    }

    #[test]
    fn a_stream_cut_inside_the_reasoning() {
        // max_tokens ends the output before the closing tag: all of it is reasoning.
        assert_eq!(all_cuts(true, "step one\nstep two\n"), pair("step one\nstep two", ""));
        assert_eq!(all_cuts(false, "<think>\nstep one</thi"), pair("step one</thi", ""));
        assert_eq!(all_cuts(false, "<think>"), pair("", ""));
        // As it streams, the reasoning shows before the end and a forming tag is held back.
        let mut s = splitter(false);
        assert_eq!(s.push("<thi"), Split::default());
        assert_eq!(s.push("nk>\nWe"), Split { reasoning: "We".into(), content: String::new() });
        assert_eq!(s.push(" need </th"), Split { reasoning: " need".into(), content: String::new() });
        assert_eq!(s.push("ink>\n\nDone"), Split { reasoning: String::new(), content: "Done".into() });
        assert_eq!(s.finish(), Split::default());
    }

    #[test]
    fn prompts_that_open_the_reasoning() {
        let (o, c) = ("<think>", "</think>");
        assert!(prompt_opens("<|im_start|>assistant\n<think>\n", o, c));
        assert!(!prompt_opens("<|im_start|>assistant\n", o, c));
        // Qwen3 with enable_thinking false: the block is closed.
        assert!(!prompt_opens("<|im_start|>assistant\n<think>\n\n</think>\n\n", o, c));
        // A tag in an earlier turn does not open this one.
        assert!(!prompt_opens("<|im_start|>user\nsay <think><|im_end|>\n<|im_start|>assistant\n", o, c));
    }
}
