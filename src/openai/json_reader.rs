//! Reading JSON text byte by byte, for the JSON a gateway reads on every request: a request body read
//! into a [`Json`] tree ([`read`]), and an upstream's answer checked to be JSON ([`is_json`]).
//!
//! serde_json's deserializer does both through its visitor machinery; for bodies of a few hundred bytes
//! that machinery costs more than the bytes. Here each is one pass over the text. Invariants:
//!
//! - **[`read`] never reads a text differently from serde_json.** It returns a tree only where
//!   `serde_json::from_slice::<Json>` returns the same tree (strings borrowed exactly where serde_json
//!   borrows them: those without escapes). Numbers other than integers of at most 18 digits (floats,
//!   `-0`, larger integers) it has serde_json read, each alone. Where it is not sure, it returns `None`
//!   and the caller lets serde_json read the whole text, which gives the tree or serde_json's own error:
//!   every malformed text, control characters and invalid UTF-8 in strings, a `\u` escape of a
//!   surrogate that is not followed by its pair, a number serde_json refuses (`1e400`), and nesting
//!   deeper than [`MAX_DEPTH`] (serde_json's recursion limit is 128).
//! - **[`is_json`] answers exactly as `serde_json::from_slice::<serde::de::IgnoredAny>`**: JSON syntax
//!   (RFC 8259) with white space around it; the contents of strings are not checked to be UTF-8, a
//!   `\u` escape only to be four hex digits, and numbers may have any size.
//!
//! Both are checked against serde_json by property tests here and by the `openai_request` fuzz target.

use super::json::{Json, Object};
use serde_json::Number;
use std::borrow::Cow;

/// Deepest nesting [`read`] reads itself; deeper texts are left to serde_json.
pub(crate) const MAX_DEPTH: usize = 64;

/// Deepest nesting [`is_json`] checks itself; deeper texts are checked by serde_json.
const MAX_CHECK_DEPTH: usize = 512;

/// `text` read into a tree, as serde_json reads it; `None` where serde_json must decide (see the
/// [module docs](self)).
pub(crate) fn read(text: &[u8]) -> Option<Json<'_>> {
    let mut reader = Reader { text, at: 0 };
    let value = reader.value(0)?;
    reader.white_space();
    (reader.at == text.len()).then_some(value)
}

/// Whether `text` is one JSON value with white space around it, exactly as
/// `serde_json::from_slice::<serde::de::IgnoredAny>` answers: JSON syntax (RFC 8259); the contents of
/// strings are not checked to be UTF-8, a `\u` escape only to be four hex digits, and numbers may have any
/// size.
///
/// ```
/// use kvgate::openai::is_json;
///
/// assert!(is_json(br#" {"choices": [], "usage": {"completion_tokens": 1e400}} "#));
/// assert!(!is_json(br#"{"choices": [],}"#));
/// assert!(!is_json(b"<html>busy</html>"));
/// ```
pub fn is_json(text: &[u8]) -> bool {
    let mut reader = Reader { text, at: 0 };
    match reader.skip_value(0) {
        Ok(()) => {
            reader.white_space();
            reader.at == text.len()
        }
        Err(Deep) => serde_json::from_slice::<serde_core::de::IgnoredAny>(text).is_ok(),
        Err(Malformed) => false,
    }
}

/// For the fuzz targets (feature `fuzz-hooks`): whether the byte reader returns only trees serde_json
/// reads the same, borrowed in the same places, and [`is_json`] answers as serde_json does.
#[cfg(feature = "fuzz-hooks")]
pub fn agrees_with_serde_json(text: &[u8]) -> bool {
    let tree = read(text).is_none_or(|ours| {
        serde_json::from_slice::<Json>(text).is_ok_and(|theirs| ours == theirs && same_borrowing(&ours, &theirs))
    });
    tree && is_json(text) == serde_json::from_slice::<serde_core::de::IgnoredAny>(text).is_ok()
}

/// Whether every string in both trees is borrowed in the same places.
#[cfg(any(test, feature = "fuzz-hooks"))]
fn same_borrowing(a: &Json, b: &Json) -> bool {
    let cow = |x: &Cow<str>, y: &Cow<str>| matches!(x, Cow::Borrowed(_)) == matches!(y, Cow::Borrowed(_));
    match (a, b) {
        (Json::String(x), Json::String(y)) => cow(x, y),
        (Json::Array(x), Json::Array(y)) => x.iter().zip(y).all(|(x, y)| same_borrowing(x, y)),
        (Json::Object(x), Json::Object(y)) => {
            x.0.iter().zip(&y.0).all(|((kx, vx), (ky, vy))| cow(kx, ky) && same_borrowing(vx, vy))
        }
        _ => true,
    }
}

/// Why [`Reader::skip_value`] stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Skip {
    /// Not JSON.
    Malformed,
    /// Nested deeper than [`MAX_CHECK_DEPTH`]: left to serde_json.
    Deep,
}
use Skip::{Deep, Malformed};

struct Reader<'a> {
    text: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    /// Skips white space as JSON (and serde_json) has it: space, tab, line feed, carriage return.
    fn white_space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// Consumes `word` (a literal's bytes after its first) or fails.
    fn literal(&mut self, word: &[u8]) -> bool {
        let end = self.at + word.len();
        if self.text.get(self.at..end) == Some(word) {
            self.at = end;
            true
        } else {
            false
        }
    }

    /// The value at the reader (white space before it skipped), read into a tree.
    fn value(&mut self, depth: usize) -> Option<Json<'a>> {
        self.white_space();
        let first = self.peek()?;
        self.at += 1;
        match first {
            b'n' => self.literal(b"ull").then_some(Json::Null),
            b't' => self.literal(b"rue").then_some(Json::Bool(true)),
            b'f' => self.literal(b"alse").then_some(Json::Bool(false)),
            b'"' => self.string().map(Json::String),
            b'-' | b'0'..=b'9' => {
                self.at -= 1;
                self.number().map(Json::Number)
            }
            b'[' if depth < MAX_DEPTH => self.array(depth + 1),
            b'{' if depth < MAX_DEPTH => self.object(depth + 1),
            _ => None,
        }
    }

    fn array(&mut self, depth: usize) -> Option<Json<'a>> {
        let mut items = Vec::new();
        self.white_space();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Some(Json::Array(items));
        }
        loop {
            items.push(self.value(depth)?);
            self.white_space();
            match self.peek()? {
                b',' => self.at += 1,
                b']' => {
                    self.at += 1;
                    return Some(Json::Array(items));
                }
                _ => return None,
            }
        }
    }

    fn object(&mut self, depth: usize) -> Option<Json<'a>> {
        let mut fields = Vec::new();
        self.white_space();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Some(Json::Object(Object(fields)));
        }
        loop {
            self.white_space();
            if self.peek()? != b'"' {
                return None;
            }
            self.at += 1;
            let key = self.string()?;
            self.white_space();
            if self.peek()? != b':' {
                return None;
            }
            self.at += 1;
            fields.push((key, self.value(depth)?));
            self.white_space();
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(Json::Object(Object(fields)));
                }
                _ => return None,
            }
        }
    }

    /// A string's contents (the reader is past its opening quote): borrowed when it has no escapes.
    fn string(&mut self) -> Option<Cow<'a, str>> {
        let start = self.at;
        let (end, ascii) = plain_run(self.text, start);
        match *self.text.get(end)? {
            b'"' => {
                self.at = end + 1;
                text_of(&self.text[start..end], ascii).map(Cow::Borrowed)
            }
            b'\\' => {
                let mut owned = String::with_capacity(end - start + 16);
                owned.push_str(text_of(&self.text[start..end], ascii)?);
                self.at = end;
                self.escaped(owned).map(Cow::Owned)
            }
            _ => None,
        }
    }

    /// The rest of a string with escapes, from the backslash at the reader, appended to `owned`.
    fn escaped(&mut self, mut owned: String) -> Option<String> {
        loop {
            match *self.text.get(self.at)? {
                b'"' => {
                    self.at += 1;
                    return Some(owned);
                }
                b'\\' => {
                    let escape = *self.text.get(self.at + 1)?;
                    self.at += 2;
                    let decoded = match escape {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => return None,
                    };
                    owned.push(decoded);
                }
                _ => {
                    let start = self.at;
                    let (end, ascii) = plain_run(self.text, start);
                    owned.push_str(text_of(&self.text[start..end], ascii)?);
                    // A control character at `end` fails at the next turn's match, which has no arm for it.
                    if matches!(self.text.get(end), Some(&b) if b < 0x20) {
                        return None;
                    }
                    self.at = end;
                }
            }
        }
    }

    /// The character of a `\u` escape (the reader is past the `u`): a surrogate must be followed by the
    /// escape of its pair.
    fn unicode_escape(&mut self) -> Option<char> {
        let first = self.hex4()?;
        match first {
            0xD800..=0xDBFF => {
                if self.text.get(self.at..self.at + 2)? != b"\\u" {
                    return None;
                }
                self.at += 2;
                let second = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&second) {
                    return None;
                }
                char::from_u32(0x10000 + ((u32::from(first) - 0xD800) << 10) + (u32::from(second) - 0xDC00))
            }
            0xDC00..=0xDFFF => None,
            _ => char::from_u32(u32::from(first)),
        }
    }

    /// Four hex digits at the reader.
    fn hex4(&mut self) -> Option<u16> {
        let digits = self.text.get(self.at..self.at + 4)?;
        let mut value = 0u16;
        for &d in digits {
            value = (value << 4) | u16::from(hex_digit(d)?);
        }
        self.at += 4;
        Some(value)
    }

    /// The number at the reader: integers of at most 18 digits read here, any other number by serde_json.
    fn number(&mut self) -> Option<Number> {
        let start = self.at;
        if !self.skip_number() {
            return None;
        }
        let text = &self.text[start..self.at];
        let (negative, digits) = text.strip_prefix(b"-").map_or((false, text), |digits| (true, digits));
        // At most 18 digits fit either sign; `-0` is a float for serde_json.
        if digits.len() <= 18 && digits.iter().all(u8::is_ascii_digit) && !(negative && digits == b"0") {
            let magnitude = digits.iter().fold(0i64, |n, &d| n * 10 + i64::from(d - b'0'));
            return Some(if negative { Number::from(-magnitude) } else { Number::from(magnitude.unsigned_abs()) });
        }
        serde_json::from_slice(text).ok()
    }

    fn skip_digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
    }

    /// Skips the value at the reader (white space before it too), checking only its syntax.
    fn skip_value(&mut self, depth: usize) -> Result<(), Skip> {
        self.white_space();
        let first = self.peek().ok_or(Malformed)?;
        self.at += 1;
        let done = match first {
            b'n' => self.literal(b"ull"),
            b't' => self.literal(b"rue"),
            b'f' => self.literal(b"alse"),
            b'"' => self.skip_string(),
            b'-' | b'0'..=b'9' => {
                self.at -= 1;
                self.skip_number()
            }
            b'[' | b'{' if depth >= MAX_CHECK_DEPTH => return Err(Deep),
            b'[' => return self.skip_array(depth + 1),
            b'{' => return self.skip_object(depth + 1),
            _ => false,
        };
        if done { Ok(()) } else { Err(Malformed) }
    }

    fn skip_array(&mut self, depth: usize) -> Result<(), Skip> {
        self.white_space();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(());
        }
        loop {
            self.skip_value(depth)?;
            self.white_space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(Malformed),
            }
        }
    }

    fn skip_object(&mut self, depth: usize) -> Result<(), Skip> {
        self.white_space();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(());
        }
        loop {
            self.white_space();
            if self.peek() != Some(b'"') {
                return Err(Malformed);
            }
            self.at += 1;
            if !self.skip_string() {
                return Err(Malformed);
            }
            self.white_space();
            if self.peek() != Some(b':') {
                return Err(Malformed);
            }
            self.at += 1;
            self.skip_value(depth)?;
            self.white_space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(());
                }
                _ => return Err(Malformed),
            }
        }
    }

    /// Skips a string (the reader is past its opening quote): escapes must be valid, `\u` followed by
    /// four hex digits; control characters are refused; the bytes are not checked to be UTF-8.
    fn skip_string(&mut self) -> bool {
        loop {
            let (end, _) = plain_run(self.text, self.at);
            match self.text.get(end) {
                Some(b'"') => {
                    self.at = end + 1;
                    return true;
                }
                Some(b'\\') => {
                    self.at = end + 2;
                    match self.text.get(end + 1) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {}
                        Some(b'u') if self.hex4().is_some() => {}
                        _ => return false,
                    }
                }
                _ => return false,
            }
        }
    }

    /// Skips a number, checking its syntax: `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`.
    fn skip_number(&mut self) -> bool {
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            // A leading zero stands alone: `01` is not a number, and a digit may not follow it.
            Some(b'0') => {
                self.at += 1;
                if matches!(self.peek(), Some(b'0'..=b'9')) {
                    return false;
                }
            }
            Some(b'1'..=b'9') => self.skip_digits(),
            _ => return false,
        }
        if self.peek() == Some(b'.') {
            self.at += 1;
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return false;
            }
            self.skip_digits();
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            if !matches!(self.peek(), Some(b'0'..=b'9')) {
                return false;
            }
            self.skip_digits();
        }
        true
    }
}

fn hex_digit(d: u8) -> Option<u8> {
    match d {
        b'0'..=b'9' => Some(d - b'0'),
        b'a'..=b'f' => Some(d - b'a' + 10),
        b'A'..=b'F' => Some(d - b'A' + 10),
        _ => None,
    }
}

/// The end of the run of plain string bytes starting at `at` — the index of the first quote, backslash
/// or control character (below 0x20), or `text.len()` if none comes — and whether the run is ASCII.
///
/// Eight bytes at a time: in a word, a byte below `n` (for `n <= 0x80`) sets its high bit in
/// `(w - n·0x01…01) & !w & 0x80…80`, and a byte equal to `c` does so for `w ^ c·0x01…01` with `n = 1`.
/// A borrow can set the bit of a byte *above* a flagged one, never below it, so the lowest flagged byte
/// is always a true one. The run is ASCII when no byte before its end has its high bit set.
fn plain_run(text: &[u8], mut at: usize) -> (usize, bool) {
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES << 7;
    let below = |w: u64, n: u8| w.wrapping_sub(ONES * u64::from(n)) & !w;
    let mut high = 0u64;
    while let Some(chunk) = text.get(at..at + 8) {
        let w = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let found =
            (below(w, 0x20) | below(w ^ (ONES * u64::from(b'"')), 1) | below(w ^ (ONES * u64::from(b'\\')), 1)) & HIGH;
        if found != 0 {
            let first = found.trailing_zeros() as usize / 8;
            // The bytes before the first flagged one (`first` whole bytes: a mask of their bits).
            let before = (1u64 << (first * 8)).wrapping_sub(1);
            return (at + first, (high | (w & before)) & HIGH == 0);
        }
        high |= w;
        at += 8;
    }
    while let Some(&b) = text.get(at) {
        if b == b'"' || b == b'\\' || b < 0x20 {
            break;
        }
        high |= u64::from(b);
        at += 1;
    }
    (at, high & HIGH == 0)
}

/// `bytes` as text, if they are UTF-8; `ascii` says they are ASCII, which needs no further check.
fn text_of(bytes: &[u8], ascii: bool) -> Option<&str> {
    if ascii {
        debug_assert!(bytes.is_ascii());
        // SAFETY: `plain_run` found no byte with its high bit set among `bytes`, so they are ASCII, and
        // ASCII is UTF-8.
        Some(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What serde_json reads `text` as.
    fn theirs(text: &[u8]) -> Option<Json<'_>> {
        serde_json::from_slice::<Json>(text).ok()
    }

    fn ignored_any(text: &[u8]) -> bool {
        serde_json::from_slice::<serde_core::de::IgnoredAny>(text).is_ok()
    }

    /// Pieces JSON texts are made of, valid and not, for texts that sit on every edge of the grammar.
    fn piece() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "{",
            "}",
            "[",
            "]",
            ",",
            ":",
            " ",
            "\n",
            "\t",
            "\r",
            "\u{b}",
            "\"",
            "\\",
            "\"a\"",
            "\"k\":",
            "null",
            "nul",
            "true",
            "false",
            "0",
            "-0",
            "-",
            "01",
            "00",
            "-01",
            "0.0",
            "0e",
            "1e+",
            "1",
            "12",
            "-7",
            "1.5",
            "1.",
            ".5",
            "1e5",
            "1E+2",
            "1e-",
            "2.5e-3",
            "1e400",
            "-1e400",
            "123456789012345678",
            "1234567890123456789",
            "18446744073709551615",
            "18446744073709551616",
            "-9223372036854775808",
            "-9223372036854775809",
            "\\u00e9",
            "\\ud83d\\ude00",
            "\\ud83d",
            "\\ude00",
            "\\ud83dx",
            "\\uZZZZ",
            "\\u12",
            "\\n",
            "\\x",
            "\\/",
            "\\b",
            "\\f",
            "\\r",
            "\\t",
            "\\\\",
            "\\\"",
            "\\u0000",
            "\\uDBFF\\uDFFF",
            "é",
            "\u{1}",
            "\u{7f}",
            "\u{ff}",
            "😀",
            "$serde_json::private::RawValue",
        ])
    }

    /// Texts built to be JSON: every value kind, escapes, duplicate keys, nesting.
    fn json_text() -> impl Strategy<Value = String> {
        let string = prop::collection::vec(
            prop_oneof![
                "[a-z é😀]{0,12}",
                prop::sample::select(vec!["\\n", "\\\"", "\\\\", "\\b", "\\f", "\\r", "\\t"]).prop_map(str::to_owned),
                Just("\\u00e9".to_owned()),
                Just("\\ud83d\\ude00".to_owned()),
                Just("\\u0000".to_owned()),
                Just("\\/".to_owned()),
            ],
            0..4,
        )
        .prop_map(|parts| format!("\"{}\"", parts.concat()));
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| format!("{f:e}")),
            (any::<u32>(), 0u32..1000).prop_map(|(a, b)| format!("{a}.{b:03}")),
            Just("-0".to_owned()),
            Just("1e400".to_owned()),
            string.clone(),
        ];
        leaf.prop_recursive(5, 64, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(|items| format!("[{}]", items.join(" ,"))),
                prop::collection::vec((string.clone(), inner), 0..6).prop_map(|fields| {
                    let fields: Vec<_> = fields.iter().map(|(k, v)| format!("{k}\n: {v}")).collect();
                    format!("{{\t{}}}", fields.join(","))
                }),
            ]
        })
    }

    fn agrees(text: &[u8]) -> Result<(), TestCaseError> {
        if let Some(ours) = read(text) {
            let theirs = theirs(text);
            prop_assert_eq!(Some(&ours), theirs.as_ref(), "{:?}", String::from_utf8_lossy(text));
            prop_assert!(same_borrowing(&ours, theirs.as_ref().unwrap()));
        }
        prop_assert_eq!(is_json(text), ignored_any(text), "{:?}", String::from_utf8_lossy(text));
        Ok(())
    }

    proptest! {
        #![proptest_config(support::proptest_config(2048))]

        /// On JSON texts: a tree `read` returns is the one serde_json reads, and it returns one for every
        /// text serde_json reads but for numbers and escapes it leaves to serde_json; `is_json` agrees.
        #[test]
        fn reads_json_texts_as_serde_json_does(text in json_text()) {
            agrees(text.as_bytes())?;
            prop_assert!(is_json(text.as_bytes()));
            // Generated texts nest shallowly and pair their surrogates: what serde_json reads, so does `read`.
            if theirs(text.as_bytes()).is_some() {
                prop_assert!(read(text.as_bytes()).is_some(), "{}", text);
            }
        }

        /// On texts made of pieces, valid or not, and on JSON texts cut or with a byte changed: no
        /// tree serde_json would not read, and `is_json` says what serde_json says.
        #[test]
        fn agrees_with_serde_json_on_any_text(pieces in prop::collection::vec(piece(), 0..24)) {
            agrees(pieces.concat().as_bytes())?;
        }

        #[test]
        fn agrees_with_serde_json_on_damaged_json(text in json_text(), at in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<bool>()) {
            let mut bytes = text.into_bytes();
            if !bytes.is_empty() {
                let i = at.index(bytes.len());
                if cut { bytes.truncate(i) } else { bytes[i] = byte }
            }
            agrees(&bytes)?;
        }
    }

    #[test]
    fn common_bodies_take_the_fast_path() {
        for text in [
            r#"{"model":"m","max_tokens":16,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Say hello."}]}"#,
            r#"{"model":"m","temperature":0.7,"top_p":1.0,"stream":true,"messages":[{"role":"user","content":"Line one\nLine \"two\" caf\u00e9 😀"}]}"#,
            "{\"prompt\": \"x\",\n  \"max_tokens\": 100, \"stop\": null, \"logit_bias\": {\"50256\": -100}}",
        ] {
            let ours = read(text.as_bytes()).unwrap_or_else(|| panic!("fast path for {text}"));
            assert_eq!(Some(ours), theirs(text.as_bytes()));
        }
    }

    #[test]
    fn leaves_to_serde_json_what_it_must() {
        for text in
            ["-0", "1e400", "18446744073709551616", "\"\\ud83d\"", "\"\\udc00\"", "\"a\u{1}\"", "[1,]", "{\"a\":1,}"]
        {
            let fast = read(text.as_bytes());
            assert!(fast.is_none() || fast == theirs(text.as_bytes()), "{text}");
        }
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert!(read(deep.as_bytes()).is_none());
        assert!(theirs(deep.as_bytes()).is_some());
    }

    #[test]
    fn is_json_matches_serde_json_beyond_its_own_depth() {
        for depth in [MAX_CHECK_DEPTH, MAX_CHECK_DEPTH + 1, 5000] {
            let nested = "[".repeat(depth) + &"]".repeat(depth);
            assert_eq!(is_json(nested.as_bytes()), ignored_any(nested.as_bytes()), "{depth}");
            let cut = "[".repeat(depth) + &"]".repeat(depth - 1);
            assert!(!is_json(cut.as_bytes()) && !ignored_any(cut.as_bytes()), "{depth}");
        }
    }

    #[test]
    fn is_json_checks_syntax_not_utf8_nor_surrogates() {
        for (text, ok) in [
            (&b"{\"a\":\"\xff\"}"[..], true),
            (b"\"\\ud800\"", true),
            (b"1e99999", true),
            (b" [1, 2.5e-3, -0, true, null, {\"k\": \"v\"}] \n", true),
            (b"", false),
            (b"{\"a\":1}x", false),
            (b"\"tab\there\"", false),
            (b"\"\\u12\"", false),
            (b"01", false),
            (b"[1,]", false),
            (b"{\"a\" 1}", false),
            (b"\xef\xbb\xbf{}", false),
        ] {
            assert_eq!(is_json(text), ok, "{:?}", String::from_utf8_lossy(text));
            assert_eq!(ignored_any(text), ok, "{:?}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn plain_run_finds_the_first_special_byte_and_whether_the_run_is_ascii() {
        // Lengths past two words and a tail (fewer under miri, which runs it slowly).
        let longest: usize = if cfg!(miri) { 18 } else { 40 };
        for len in 0..longest {
            for special in [b'"', b'\\', 0x00, 0x1f] {
                for at in 0..len {
                    for high in [None, Some(0), Some(at.saturating_sub(1)), Some(at), Some(len - 1)] {
                        let mut text = vec![b'a'; len];
                        if let Some(h) = high {
                            text[h] = 0xc3;
                        }
                        text[at] = special;
                        if at + 1 < len {
                            text[at + 1] = b'"';
                        }
                        for start in 0..=at {
                            let ascii = text[start..at].is_ascii();
                            assert_eq!(plain_run(&text, start), (at, ascii), "{len} {special} {at} {high:?} {start}");
                        }
                    }
                }
            }
            assert_eq!(plain_run(&vec![0x20; len], 0), (len, true));
            assert_eq!(plain_run(&vec![0xff; len], 0), (len, len == 0));
        }
    }
}
