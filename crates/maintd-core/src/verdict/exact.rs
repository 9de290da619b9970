//! JSON kept exactly as a diagnose wrote it: the canonical form (keys sorted, no whitespace) with
//! every number's text left untouched. A script's details may hold integers beyond 64 bits or
//! decimals that a float would round; the event, the signed report, the API and a live repair's
//! stdin all carry the number as printed.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

mod scan;
pub use scan::{Spans, canonical_spans};

/// At most this many arrays and objects nest: serde_json's own limit, so that whatever this
/// module accepts, serde_json reads too.
pub const MAX_DEPTH: usize = 127;

/// Why text is not a JSON document this module keeps.
#[derive(Debug, thiserror::Error)]
pub enum ExactError {
    #[error("{0}")]
    Json(#[source] serde_json::Error),
    #[error("not UTF-8 at byte {0}")]
    Utf8(usize),
    #[error("nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("unexpected input at byte {0}")]
    Syntax(usize),
}

/// A JSON document in canonical form whose numbers keep their written text.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExactJson(String);

impl ExactJson {
    /// Validates `bytes` as one JSON document and brings it to canonical form.
    pub fn parse(bytes: &[u8]) -> Result<ExactJson, ExactError> {
        canonicalize(bytes, &[]).map(ExactJson)
    }

    /// The canonical form of an in-memory value (whose numbers are already what they are).
    pub fn from_value(value: &Value) -> ExactJson {
        ExactJson(super::canonical_json(value))
    }

    /// Text this module or `canonical_json` wrote (the store's canonical column), taken without
    /// a second pass over it.
    pub fn assume_canonical(text: String) -> ExactJson {
        ExactJson(text)
    }

    pub fn null() -> ExactJson {
        ExactJson("null".into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }

    /// Indented for people (two spaces, as serde_json's pretty printer), numbers still exact.
    pub fn pretty(&self) -> String {
        let mut out = String::with_capacity(self.0.len() * 2);
        match (Parser { s: &self.0, i: 0 }).document() {
            Ok(node) => node.write_pretty(&mut out, 0),
            Err(_) => out.push_str(&self.0),
        }
        out
    }

    /// A `Value` to read fields from. Lossy: a number no float holds becomes its nearest float,
    /// or null past the float range. Never serialize this where the exact text matters.
    pub fn value(&self) -> Value {
        // serde_json reads every number here the way the lossy reading does (it reads each
        // number's text with serde_json too), in one pass; only a number out of the float
        // range makes it refuse the text, and that takes the lossy reading.
        serde_json::from_str(&self.0).unwrap_or_else(|_| lossy_value(self.0.as_bytes()))
    }
}

/// Reads canonical JSON text into a `Value` without failing on numbers out of range (they
/// become null), for code that only inspects fields.
fn lossy_value(bytes: &[u8]) -> Value {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return Value::Null;
    };
    let mut p = Parser { s: text, i: 0 };
    match p.document() {
        Ok(node) => node.into_value(),
        Err(_) => Value::Null,
    }
}

/// The canonical form of the JSON document in `bytes`, without the top-level keys in `drop`.
pub fn canonicalize(bytes: &[u8], drop: &[&str]) -> Result<String, ExactError> {
    // serde_json judges the grammar (and names the problem as it always has); this module only
    // ever walks text that passed.
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes).map_err(ExactError::Json)?;
    let text = std::str::from_utf8(bytes).map_err(|e| ExactError::Utf8(e.valid_up_to()))?;
    let mut node = Parser { s: text, i: 0 }.document()?;
    if let Node::Obj(map) = &mut node {
        for k in drop {
            map.remove(*k);
        }
    }
    let mut out = String::with_capacity(text.len());
    node.write(&mut out);
    Ok(out)
}

/// For a document serde_json has already read (so its grammar is known good): its canonical form
/// without the top-level key `drop`, and the canonical form of the top-level member `part`, in
/// one pass over the text.
pub fn canonical_parts(
    text: &str,
    drop: &str,
    part: &str,
) -> Result<(String, Option<ExactJson>), ExactError> {
    let mut node = Parser { s: text, i: 0 }.document()?;
    let mut extracted = None;
    if let Node::Obj(map) = &mut node {
        map.remove(drop);
        if let Some((_, p)) = map.get(part) {
            let mut out = String::new();
            p.write(&mut out);
            extracted = Some(ExactJson(out));
        }
    }
    let mut out = String::with_capacity(text.len());
    node.write(&mut out);
    Ok((out, extracted))
}

enum Node<'a> {
    /// A number, `true`, `false` or `null`, as written.
    Text(&'a str),
    /// A string already encoded as canonical JSON (with its quotes).
    Str(Cow<'a, str>),
    Arr(Vec<Node<'a>>),
    /// Members keyed by their decoded name (which orders them as the canonical form writes
    /// them), each with that name in canonical encoding (with its quotes).
    Obj(BTreeMap<Cow<'a, str>, (Cow<'a, str>, Node<'a>)>),
}

impl Node<'_> {
    fn write(&self, out: &mut String) {
        match self {
            Node::Text(t) => out.push_str(t),
            Node::Str(s) => out.push_str(s),
            Node::Arr(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write(out);
                }
                out.push(']');
            }
            Node::Obj(map) => {
                out.push('{');
                for (i, (k, v)) in map.values().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(k);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }

    fn write_pretty(&self, out: &mut String, level: usize) {
        let pad = |out: &mut String, level: usize| {
            out.push('\n');
            out.extend(std::iter::repeat_n("  ", level));
        };
        match self {
            Node::Arr(items) if !items.is_empty() => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    pad(out, level + 1);
                    v.write_pretty(out, level + 1);
                }
                pad(out, level);
                out.push(']');
            }
            Node::Obj(map) if !map.is_empty() => {
                out.push('{');
                for (i, (k, v)) in map.values().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    pad(out, level + 1);
                    out.push_str(k);
                    out.push_str(": ");
                    v.write_pretty(out, level + 1);
                }
                pad(out, level);
                out.push('}');
            }
            other => other.write(out),
        }
    }

    fn into_value(self) -> Value {
        match self {
            Node::Text("true") => Value::Bool(true),
            Node::Text("false") => Value::Bool(false),
            Node::Text(t) => serde_json::from_str(t)
                .ok()
                .or_else(|| {
                    t.parse::<f64>()
                        .ok()
                        .and_then(serde_json::Number::from_f64)
                        .map(Value::Number)
                })
                .unwrap_or(Value::Null),
            Node::Str(s) => serde_json::from_str(&s).unwrap_or(Value::Null),
            Node::Arr(items) => Value::Array(items.into_iter().map(Node::into_value).collect()),
            Node::Obj(map) => Value::Object(
                map.into_iter()
                    .map(|(k, (_, v))| (k.into_owned(), v.into_value()))
                    .collect(),
            ),
        }
    }
}

fn encode(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

struct Parser<'a> {
    s: &'a str,
    i: usize,
}

impl<'a> Parser<'a> {
    fn document(&mut self) -> Result<Node<'a>, ExactError> {
        let node = self.value(0)?;
        self.ws();
        if self.i != self.s.len() {
            return Err(ExactError::Syntax(self.i));
        }
        Ok(node)
    }

    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Result<(), ExactError> {
        self.ws();
        if self.peek() != Some(b) {
            return Err(ExactError::Syntax(self.i));
        }
        self.i += 1;
        Ok(())
    }

    fn value(&mut self, depth: usize) -> Result<Node<'a>, ExactError> {
        self.ws();
        match self.peek() {
            Some(b'{') => {
                if depth >= MAX_DEPTH {
                    return Err(ExactError::TooDeep);
                }
                self.i += 1;
                let mut map = BTreeMap::new();
                self.ws();
                if self.peek() == Some(b'}') {
                    self.i += 1;
                    return Ok(Node::Obj(map));
                }
                loop {
                    self.ws();
                    // A name without escapes is its own canonical form, and its text between the
                    // quotes is its decoded value: neither is copied.
                    let (name, written) = match self.string()? {
                        Cow::Borrowed(w) => (Cow::Borrowed(&w[1..w.len() - 1]), Cow::Borrowed(w)),
                        Cow::Owned(w) => {
                            let name: String =
                                serde_json::from_str(&w).map_err(ExactError::Json)?;
                            (Cow::Owned(name), Cow::Owned(w))
                        }
                    };
                    self.eat(b':')?;
                    // A repeated key keeps its last value, as serde_json's own maps do.
                    map.insert(name, (written, self.value(depth + 1)?));
                    self.ws();
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Node::Obj(map));
                        }
                        _ => return Err(ExactError::Syntax(self.i)),
                    }
                }
            }
            Some(b'[') => {
                if depth >= MAX_DEPTH {
                    return Err(ExactError::TooDeep);
                }
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.peek() == Some(b']') {
                    self.i += 1;
                    return Ok(Node::Arr(items));
                }
                loop {
                    items.push(self.value(depth + 1)?);
                    self.ws();
                    match self.peek() {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Node::Arr(items));
                        }
                        _ => return Err(ExactError::Syntax(self.i)),
                    }
                }
            }
            Some(b'"') => Ok(Node::Str(self.string()?)),
            Some(b'-' | b'0'..=b'9' | b't' | b'f' | b'n') => {
                let start = self.i;
                while matches!(
                    self.peek(),
                    Some(b'-' | b'+' | b'.' | b'0'..=b'9' | b'e' | b'E' | b'a'..=b'z')
                ) {
                    self.i += 1;
                }
                Ok(Node::Text(&self.s[start..self.i]))
            }
            _ => Err(ExactError::Syntax(self.i)),
        }
    }

    /// A string at the cursor, in canonical encoding: as written when it holds no escape (then
    /// nothing in it needs one), else decoded and encoded again so equal strings give equal bytes.
    fn string(&mut self) -> Result<Cow<'a, str>, ExactError> {
        if self.peek() != Some(b'"') {
            return Err(ExactError::Syntax(self.i));
        }
        let start = self.i;
        let bytes = self.s.as_bytes();
        let mut j = start + 1;
        let mut escaped = false;
        loop {
            match bytes.get(j) {
                None => return Err(ExactError::Syntax(j)),
                Some(b'\\') => {
                    escaped = true;
                    j += 2;
                }
                Some(b'"') => break,
                Some(_) => j += 1,
            }
        }
        self.i = j + 1;
        let raw = &self.s[start..self.i];
        if !escaped {
            return Ok(raw.into());
        }
        let decoded: String = serde_json::from_str(raw).map_err(ExactError::Json)?;
        Ok(encode(&decoded).into())
    }
}

impl fmt::Debug for ExactJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for ExactJson {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for ExactJson {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Written as is by serde_json; other formats get serde_json's reading of the text.
        let raw = serde_json::value::RawValue::from_string(self.0.clone())
            .map_err(serde::ser::Error::custom)?;
        raw.serialize(s)
    }
}

impl<'de> Deserialize<'de> for ExactJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ExactJson, D::Error> {
        let raw = Box::<serde_json::value::RawValue>::deserialize(d)?;
        ExactJson::parse(raw.get().as_bytes()).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn numbers_keep_their_text() {
        let big = r#"{"status":"Ok","details":{"id":123456789012345678901234567890,"f":1.50,"e":1E400,"n":-0}}"#;
        let e = ExactJson::parse(big.as_bytes()).unwrap();
        assert_eq!(
            e.as_str(),
            r#"{"details":{"e":1E400,"f":1.50,"id":123456789012345678901234567890,"n":-0},"status":"Ok"}"#
        );
        // Through serde_json and back, still exact.
        let wire = serde_json::to_string(&BTreeMap::from([("x", &e)])).unwrap();
        assert!(wire.contains("123456789012345678901234567890"), "{wire}");
        let back: BTreeMap<String, ExactJson> = serde_json::from_str(&wire).unwrap();
        assert_eq!(back["x"], e);
        let pretty = e.pretty();
        assert!(
            pretty.contains("\"id\": 123456789012345678901234567890"),
            "{pretty}"
        );
        assert_eq!(ExactJson::parse(pretty.as_bytes()).unwrap(), e);
        // The lossy view still reads the fields.
        assert_eq!(e.value()["status"], "Ok");
        assert!(e.value()["details"]["e"].is_null());
    }

    #[test]
    fn bad_documents_are_refused_with_the_reason() {
        let err = |s: &[u8]| ExactJson::parse(s).unwrap_err().to_string();
        assert!(err(b"{\"a\":1,}").contains("key must be a string"));
        assert!(err(b"{\"a\":01}").contains("line 1"));
        assert!(err(b"[1] x").contains("trailing characters"));
        assert!(err(b"\"\\ud800\"").contains("escape"));
        assert!(err(b"\"\xff\"").contains("UTF-8") || err(b"\"\xff\"").contains("unicode"));
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(ExactJson::parse(deep.as_bytes()).is_err());
        let ok_deep = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(ExactJson::parse(ok_deep.as_bytes()).is_ok());
    }

    #[test]
    fn dropped_keys_leave_the_rest_canonical() {
        let s = canonicalize(
            br#"{ "z":1, "signature":"x", "a":{"b":2,"a":"\u0041"} }"#,
            &["signature"],
        );
        assert_eq!(s.unwrap(), r#"{"a":{"a":"A","b":2},"z":1}"#);
    }

    #[test]
    fn names_sort_and_repeat_by_their_value_however_written() {
        let s = canonicalize(br#"{"\u0062":1,"c\"d":3,"a":0,"\u0061":2}"#, &[]);
        assert_eq!(s.unwrap(), r#"{"a":2,"b":1,"c\"d":3}"#);
    }

    use crate::verdict::strategies::json;

    proptest! {
        /// For every document serde_json writes (compact or pretty), the exact form is the same
        /// canonical text the in-memory value gives: nothing that was representable changes.
        #[test]
        fn agrees_with_serde_json_where_serde_json_is_exact(v in json(), pretty in any::<bool>()) {
            let text = if pretty { serde_json::to_string_pretty(&v) } else { serde_json::to_string(&v) }.unwrap();
            let e = ExactJson::parse(text.as_bytes()).unwrap();
            prop_assert_eq!(e.as_str(), super::super::canonical_json(&v));
            prop_assert_eq!(e.value(), v.clone());
            // Pretty output is serde_json's own for the same value, and reads back exactly.
            let sorted: Value = serde_json::from_str(e.as_str()).unwrap();
            prop_assert_eq!(e.pretty(), serde_json::to_string_pretty(&sorted).unwrap());
            prop_assert_eq!(ExactJson::parse(e.pretty().as_bytes()).unwrap(), e);
        }

        /// The one-pass reading of a document's fields is the lossy one, for every number a
        /// script may print (integers past 64 bits, long decimals, exponents past the float
        /// range).
        #[test]
        fn the_quick_reading_is_the_lossy_one(v in json(), n in prop_oneof![
            "-?[1-9][0-9]{0,39}",
            "-?(0|[1-9][0-9]{0,4})\\.[0-9]{1,30}",
            "-?[1-9](\\.[0-9]{1,3})?[eE][+-]?[0-9]{1,3}",
        ]) {
            let text = format!("[{},{}]", serde_json::to_string(&v).unwrap(), n);
            let e = ExactJson::parse(text.as_bytes()).unwrap();
            prop_assert_eq!(e.value(), lossy_value(e.as_str().as_bytes()));
        }

        /// Whatever bytes arrive, the exact reading never panics, accepts every document
        /// serde_json reads, and what it writes reads back to itself.
        #[test]
        fn accepts_what_serde_json_reads(bytes in prop::collection::vec(prop_oneof![
            Just(b'{'), Just(b'}'), Just(b'['), Just(b']'), Just(b'"'), Just(b':'), Just(b','),
            Just(b'1'), Just(b'-'), Just(b'e'), Just(b'.'), Just(b'\\'), Just(b'u'), Just(b' '),
            Just(b'a'), Just(b'n'), Just(b't'), any::<u8>()], 0..40)) {
            let ours = ExactJson::parse(&bytes);
            let theirs = serde_json::from_slice::<Value>(&bytes);
            if theirs.is_ok() {
                prop_assert!(ours.is_ok());
            }
            if let Ok(e) = ours {
                prop_assert_eq!(ExactJson::parse(e.as_str().as_bytes()).unwrap(), e);
            }
        }
    }
}
