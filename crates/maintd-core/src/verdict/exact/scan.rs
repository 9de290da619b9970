//! Recognizes text that is already in canonical form, without building a tree: a report served
//! by this version's collectors is, and then its signed bytes are the text itself less one
//! member, found in one pass that allocates nothing.

use super::MAX_DEPTH;

/// A document already in canonical form, taken apart around two of its top-level members.
#[derive(Debug, PartialEq, Eq)]
pub struct Spans<'a> {
    /// The text without the member `drop` (its comma included), in two pieces; exactly what
    /// `canonical_parts` would write for it.
    pub without: [&'a str; 2],
    /// The text of the member `part`'s value, if the document has it.
    pub part: Option<&'a str>,
}

/// When `text` is one JSON object in canonical form (no whitespace, no escape in any string,
/// every object's names in strictly increasing order, nesting within [`MAX_DEPTH`]): where its
/// top-level members `drop` and `part` lie. `None` for any other text, which then takes the
/// full canonical pass. Only for text serde_json has read: the grammar is taken as valid.
pub fn canonical_spans<'a>(text: &'a str, drop: &str, part: &str) -> Option<Spans<'a>> {
    let mut s = Scan {
        b: text.as_bytes(),
        i: 0,
    };
    let members = s.object(0, |name, start, value, end| {
        (name == drop.as_bytes() || name == part.as_bytes()).then_some((name, start, value, end))
    })?;
    if s.i != text.len() {
        return None;
    }
    let mut spans = Spans {
        without: [text, ""],
        part: None,
    };
    for (name, start, value, end) in members.into_iter().flatten() {
        if name == part.as_bytes() {
            spans.part = Some(&text[value..end]);
        }
        if name == drop.as_bytes() {
            // The comma before the member goes with it; the first member takes the one after.
            spans.without = match text.as_bytes()[start - 1] {
                b',' => [&text[..start - 1], &text[end..]],
                _ if text.as_bytes()[end] == b',' => [&text[..start], &text[end + 1..]],
                _ => [&text[..start], &text[end..]],
            };
        }
    }
    Some(spans)
}

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

/// A top-level member noted: its name, where it starts, where its value starts, where it ends.
type Noted<'a> = (&'a [u8], usize, usize, usize);

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// An object at the cursor; each member is offered to `note`, and what it keeps is returned
    /// (at most two members are ever kept: the names are distinct).
    fn object(
        &mut self,
        depth: usize,
        mut note: impl FnMut(&'a [u8], usize, usize, usize) -> Option<Noted<'a>>,
    ) -> Option<[Option<Noted<'a>>; 2]> {
        if depth >= MAX_DEPTH {
            return None;
        }
        self.eat(b'{')?;
        let mut kept = [None, None];
        if self.eat(b'}').is_some() {
            return Some(kept);
        }
        let mut last: Option<&[u8]> = None;
        loop {
            let start = self.i;
            let name = self.string()?;
            // Strictly increasing: out of order or repeated names are not canonical.
            if last.is_some_and(|l| name <= l) {
                return None;
            }
            last = Some(name);
            self.eat(b':')?;
            let value = self.i;
            self.value(depth + 1)?;
            if let Some(n) = note(name, start, value, self.i) {
                *kept.iter_mut().find(|k| k.is_none())? = Some(n);
            }
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(kept);
                }
                _ => return None,
            }
        }
    }

    fn value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'{' => self.object(depth, |_, _, _, _| None).map(|_| ()),
            b'[' => {
                if depth >= MAX_DEPTH {
                    return None;
                }
                self.i += 1;
                if self.eat(b']').is_some() {
                    return Some(());
                }
                loop {
                    self.value(depth + 1)?;
                    match self.peek()? {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            return Some(());
                        }
                        _ => return None,
                    }
                }
            }
            b'"' => self.string().map(|_| ()),
            b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
                // The same characters the canonical writer keeps as written.
                while matches!(
                    self.peek(),
                    Some(b'-' | b'+' | b'.' | b'0'..=b'9' | b'e' | b'E' | b'a'..=b'z')
                ) {
                    self.i += 1;
                }
                Some(())
            }
            _ => None,
        }
    }

    /// A string without escapes at the cursor (one with an escape may have another canonical
    /// form); returns what lies between its quotes.
    fn string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        let len = self.b[start..]
            .iter()
            .position(|&c| c == b'"' || c == b'\\')?;
        if self.b[start + len] == b'\\' {
            return None;
        }
        self.i = start + len + 1;
        Some(&self.b[start..start + len])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::canonical_parts;
    use proptest::prelude::*;

    fn full(text: &str) -> (String, Option<String>) {
        let (without, part) = canonical_parts(text, "signature", "data").unwrap();
        (without, part.map(|p| p.into_string()))
    }

    fn fast(text: &str) -> Option<(String, Option<String>)> {
        let s = canonical_spans(text, "signature", "data")?;
        Some((s.without.concat(), s.part.map(str::to_owned)))
    }

    #[test]
    fn a_canonical_report_is_taken_apart_where_the_full_pass_would() {
        for text in [
            r#"{"a":1,"data":{"b":[1,2.50,"x"]},"signature":"ab","z":null}"#,
            r#"{"signature":"ab","z":1}"#,
            r#"{"data":true,"signature":"ab"}"#,
            r#"{"signature":"ab"}"#,
            r#"{"a":{"signature":1},"b":[]}"#,
            "{}",
        ] {
            assert_eq!(fast(text), Some(full(text)), "{text}");
        }
    }

    #[test]
    fn anything_not_canonical_takes_the_full_pass() {
        for text in [
            r#"{"b":1,"a":2}"#,
            r#"{"a":1,"a":2}"#,
            r#"{"a":{"y":1,"x":2}}"#,
            r#"{ "a":1}"#,
            r#"{"a":1} "#,
            r#"{"a":"\u0041"}"#,
            r#"{"\u0061":1}"#,
            r#"[1,2]"#,
            r#""s""#,
        ] {
            assert_eq!(fast(text), None, "{text}");
        }
        let deep = format!(
            r#"{{"a":{}{}}}"#,
            "[".repeat(MAX_DEPTH),
            "]".repeat(MAX_DEPTH)
        );
        assert_eq!(fast(&deep), None);
        let within = format!(
            r#"{{"a":{}{}}}"#,
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        assert_eq!(fast(&within), Some(full(&within)));
    }

    use crate::verdict::strategies::json;

    proptest! {
        /// Whatever serde_json writes, compact or pretty: when the scan takes it for canonical,
        /// it gives exactly what the full pass gives; and the full pass's own output always is
        /// taken for canonical.
        #[test]
        fn agrees_with_the_full_pass(v in json(), sig in "[0-9a-f]{0,8}", pretty in any::<bool>()) {
            let mut doc = serde_json::json!({"data": v, "node": "n1"});
            doc["signature"] = serde_json::Value::String(sig);
            let text = if pretty { serde_json::to_string_pretty(&doc) } else { serde_json::to_string(&doc) }.unwrap();
            if let Some(f) = fast(&text) {
                prop_assert_eq!(f, full(&text));
            }
            let canonical = crate::verdict::canonicalize(text.as_bytes(), &[]).unwrap();
            // A string that needs an escape is left to the full pass.
            if !canonical.contains('\\') {
                prop_assert_eq!(fast(&canonical), Some(full(&canonical)));
            }
        }
    }
}
