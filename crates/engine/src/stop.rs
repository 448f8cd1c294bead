//! Stop strings over streamed text: text that could still become a stop string is held back,
//! so a partial match never leaks into the stream.

#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    /// The stop string that matched, once one has.
    matched: Option<String>,
}

/// What to do with new text.
#[derive(Debug, PartialEq, Eq)]
pub enum StopOutcome {
    /// Emit this text (possibly empty) and go on.
    Emit(String),
    /// A stop string matched: emit this text (what came before it) and finish.
    Stop(String),
}

/// The length of the longest tail of `s` that is a proper beginning of `tag` (text that may
/// still grow into `tag`, so a stream holds it back).
pub fn partial_tail(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1)).rev().find(|&k| s.is_char_boundary(s.len() - k) && tag.starts_with(&s[s.len() - k..])).unwrap_or(0)
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new(), matched: None }
    }

    pub fn push(&mut self, text: &str) -> StopOutcome {
        self.held.push_str(text);
        if self.stops.is_empty() {
            return StopOutcome::Emit(std::mem::take(&mut self.held));
        }
        // Earliest full match wins (the first listed of those that match there).
        if let Some((at, i)) = self.stops.iter().enumerate().filter_map(|(i, s)| Some((self.held.find(s.as_str())?, i))).min() {
            let out = self.held[..at].to_string();
            self.held.clear();
            self.matched = Some(self.stops[i].clone());
            return StopOutcome::Stop(out);
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let keep = self.stops.iter().map(|s| partial_tail(&self.held, s)).max().unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        StopOutcome::Emit(out)
    }

    /// The stop string that matched (after a [`StopOutcome::Stop`]).
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Generation ended for another reason: what was held back is plain text after all.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_partial_matches_and_stops_on_full_ones() {
        let mut m = StopMatcher::new(vec!["</end>".into()]);
        assert_eq!(m.push("hello <"), StopOutcome::Emit("hello ".into()));
        assert_eq!(m.push("/en"), StopOutcome::Emit("".into()));
        assert_eq!(m.push("d> tail"), StopOutcome::Stop("".into()));
        let mut m = StopMatcher::new(vec!["</end>".into()]);
        assert_eq!(m.push("a </e"), StopOutcome::Emit("a ".into()));
        assert_eq!(m.push("x"), StopOutcome::Emit("</ex".into()));
        assert_eq!(m.push(" <"), StopOutcome::Emit(" ".into()));
        assert_eq!(m.flush(), "<");
    }

    #[test]
    fn earliest_of_several_stops() {
        let mut m = StopMatcher::new(vec!["world".into(), "lo w".into()]);
        assert_eq!(m.push("hello world"), StopOutcome::Stop("hel".into()));
        assert_eq!(m.matched(), Some("lo w"));
    }

    #[test]
    fn multibyte_text_is_cut_on_char_boundaries() {
        let mut m = StopMatcher::new(vec!["éé".into()]);
        assert_eq!(m.push("aé"), StopOutcome::Emit("a".into()));
        assert_eq!(m.push("b"), StopOutcome::Emit("éb".into()));
    }
}
