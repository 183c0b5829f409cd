//! [`Json`]: the tree a request body is read into — borrowed from the body where it can be.
//!
//! Reading a body with `serde_json::Value` allocates for every key and every string. Here a key or a
//! string without escapes points into the body, and an object is one `Vec` of its fields in the order
//! they came, so reading a body allocates only for its arrays, its objects and its escaped strings.
//!
//! Invariants, which make it read the body as `serde_json::Value` does (as any JSON reader does: with
//! serde_json's `raw_value` feature, which another crate of a build may turn on, `Value` reads a map whose
//! first key is serde_json's private `$serde_json::private::RawValue` token as the JSON text in its value;
//! here that key is a key like any other):
//!
//! - **Duplicate keys**: [`Object::get`] answers with a key's *last* occurrence (`Value`'s map keeps the
//!   last one, as Python's `json` does). Every occurrence is kept, so that a check can look at each.
//! - **Canonical text**: [`Json::canonical_text`] writes a tree as `serde_json::to_string(&value)` writes the
//!   `Value` of the same text: object keys in byte order, each once with its last value. Text hashed or
//!   forwarded is written canonically, so it does not depend on the order or the repetition of fields.
//! - **Numbers** are `serde_json::Number`s, read as `Value` reads them; nesting is limited as for
//!   `Value` (serde_json's recursion limit).

use serde_core::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_core::ser::{SerializeMap, SerializeSeq, Serializer};
use serde_core::{Deserialize, Serialize};
use serde_json::Number;
use std::borrow::Cow;
use std::fmt;

/// A JSON value whose strings borrow from the text it was read from when they can.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json<'a> {
    Null,
    Bool(bool),
    Number(Number),
    String(Cow<'a, str>),
    Array(Vec<Json<'a>>),
    Object(Object<'a>),
}

/// A JSON object: its fields in the order they came, duplicates included.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Object<'a>(pub(super) Vec<(Cow<'a, str>, Json<'a>)>);

impl<'a> Json<'a> {
    /// Reads `text` (the whole of it: trailing characters other than white space are an error): with
    /// the [byte reader](super::json_reader) where it is sure to read as serde_json does, else with
    /// serde_json.
    pub(crate) fn from_slice(text: &'a [u8]) -> serde_json::Result<Self> {
        super::json_reader::read(text).map_or_else(|| serde_json::from_slice(text), Ok)
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Json::String(text) => Some(text),
            _ => None,
        }
    }

    pub(crate) fn as_bool(&self) -> Option<bool> {
        match self {
            Json::Bool(b) => Some(*b),
            _ => None,
        }
    }

    pub(crate) fn as_u64(&self) -> Option<u64> {
        match self {
            Json::Number(n) => n.as_u64(),
            _ => None,
        }
    }

    pub(crate) fn as_i64(&self) -> Option<i64> {
        match self {
            Json::Number(n) => n.as_i64(),
            _ => None,
        }
    }

    pub(crate) fn as_f64(&self) -> Option<f64> {
        match self {
            Json::Number(n) => n.as_f64(),
            _ => None,
        }
    }

    pub(crate) fn as_object(&self) -> Option<&Object<'a>> {
        match self {
            Json::Object(object) => Some(object),
            _ => None,
        }
    }

    pub(crate) fn is_string(&self) -> bool {
        matches!(self, Json::String(_))
    }

    pub(crate) fn is_array(&self) -> bool {
        matches!(self, Json::Array(_))
    }

    pub(crate) fn is_u64(&self) -> bool {
        self.as_u64().is_some()
    }

    /// Whether some object in the tree has a key more than once.
    pub(crate) fn has_repeated_keys(&self) -> bool {
        match self {
            Json::Array(items) => items.iter().any(Json::has_repeated_keys),
            Json::Object(object) => object.has_repeated_keys(),
            _ => false,
        }
    }

    /// The canonical text (see the [module docs](self)).
    pub(crate) fn canonical_text(&self) -> String {
        serde_json::to_string(&Canonical(self)).expect("a JSON tree serializes")
    }
}

impl<'a> Object<'a> {
    /// The last value of `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&Json<'a>> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The last value of `key`, to change.
    pub(crate) fn get_mut(&mut self, key: &str) -> Option<&mut Json<'a>> {
        self.0.iter_mut().rev().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub(crate) fn contains_key(&self, key: &str) -> bool {
        self.0.iter().any(|(k, _)| k == key)
    }

    /// Sets every occurrence of `key` to `value`, or adds `key` when it is not there.
    pub(crate) fn set(&mut self, key: &'static str, value: Json<'a>) {
        let mut found = false;
        for (_, v) in self.0.iter_mut().filter(|(k, _)| k == key) {
            *v = value.clone();
            found = true;
        }
        if !found {
            self.0.push((Cow::Borrowed(key), value));
        }
    }

    /// The canonical text (see the [module docs](self)).
    pub(crate) fn canonical_text(&self) -> String {
        serde_json::to_string(&CanonicalObject(self)).expect("a JSON object serializes")
    }

    /// Whether this object, or one inside it, has a key more than once.
    pub(crate) fn has_repeated_keys(&self) -> bool {
        let fields = &self.0;
        let repeated = if fields.len() <= 8 {
            fields.iter().enumerate().any(|(i, (key, _))| fields[i + 1..].iter().any(|(other, _)| other == key))
        } else {
            let mut keys: Vec<&str> = fields.iter().map(|(key, _)| &**key).collect();
            keys.sort_unstable();
            keys.windows(2).any(|pair| pair[0] == pair[1])
        };
        repeated || fields.iter().any(|(_, value)| value.has_repeated_keys())
    }

    /// Every field in order, duplicates included.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &Json<'a>)> {
        self.0.iter().map(|(k, v)| (&**k, v))
    }

    /// The fields as the canonical text has them: by key, each key once with its last value.
    fn canonical_fields(&self) -> Vec<&(Cow<'a, str>, Json<'a>)> {
        let mut fields: Vec<_> = self.0.iter().collect();
        // Stable: of equal keys, the last one read stays last.
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        let mut kept: Vec<&(Cow<'a, str>, Json<'a>)> = Vec::with_capacity(fields.len());
        for field in fields {
            match kept.last_mut() {
                Some(last) if last.0 == field.0 => *last = field,
                _ => kept.push(field),
            }
        }
        kept
    }
}

/// Writes a tree in its canonical form (see the [module docs](self)).
struct Canonical<'j, 'a>(&'j Json<'a>);

impl Serialize for Canonical<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Json::Null => serializer.serialize_unit(),
            Json::Bool(b) => serializer.serialize_bool(*b),
            Json::Number(n) => n.serialize(serializer),
            Json::String(text) => serializer.serialize_str(text),
            Json::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&Canonical(item))?;
                }
                seq.end()
            }
            Json::Object(object) => CanonicalObject(object).serialize(serializer),
        }
    }
}

struct CanonicalObject<'j, 'a>(&'j Object<'a>);

impl Serialize for CanonicalObject<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = self.0.canonical_fields();
        let mut map = serializer.serialize_map(Some(fields.len()))?;
        for (key, value) in fields {
            map.serialize_entry(&**key, &Canonical(value))?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Json<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Json<'de>, E> {
        Ok(Json::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Json<'de>, E> {
        Ok(Json::Number(n.into()))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Json<'de>, E> {
        Ok(Json::Number(n.into()))
    }

    fn visit_f64<E>(self, f: f64) -> Result<Json<'de>, E> {
        Ok(Number::from_f64(f).map_or(Json::Null, Json::Number))
    }

    fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Borrowed(text)))
    }

    fn visit_str<E>(self, text: &str) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Owned(text.to_owned())))
    }

    fn visit_string<E>(self, text: String) -> Result<Json<'de>, E> {
        Ok(Json::String(Cow::Owned(text)))
    }

    fn visit_unit<E>(self) -> Result<Json<'de>, E> {
        Ok(Json::Null)
    }

    fn visit_none<E>(self) -> Result<Json<'de>, E> {
        Ok(Json::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Json<'de>, D::Error> {
        Json::deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json<'de>, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json<'de>, A::Error> {
        let mut fields = Vec::with_capacity(map.size_hint().unwrap_or(0).min(64));
        while let Some(key) = map.next_key_seed(Key)? {
            fields.push((key, map.next_value()?));
        }
        Ok(Json::Object(Object(fields)))
    }
}

/// An object key, borrowed when it has no escapes.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Cow<'de, str>, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(text))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(text.to_owned()))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    /// JSON texts with what bodies bring: escapes, duplicate keys, nesting, numbers of every kind.
    fn text() -> impl Strategy<Value = String> {
        let key = prop_oneof![
            Just("a".to_owned()),
            Just("b".to_owned()),
            Just("max_tokens".to_owned()),
            Just("z\\u00e9".to_owned()),
            Just("q\\\"".to_owned()),
            "[a-z]{1,3}",
        ];
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            any::<i64>().prop_map(|n| n.to_string()),
            any::<u64>().prop_map(|n| n.to_string()),
            Just("1.0".to_owned()),
            Just("-0".to_owned()),
            Just("1e400".to_owned()),
            Just("2.5e-3".to_owned()),
            Just("18446744073709551616".to_owned()),
            "[a-z ]{0,6}".prop_map(|s| format!("\"{s}\"")),
            Just("\"tab\\there \\ud83d\\ude00\"".to_owned()),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(|items| format!("[{}]", items.join(","))),
                prop::collection::vec((key.clone(), inner), 0..6).prop_map(|fields| {
                    let fields: Vec<_> = fields.iter().map(|(k, v)| format!("\"{k}\" : {v}")).collect();
                    format!("{{ {} }}", fields.join(", "))
                }),
            ]
        })
    }

    proptest! {
        #![proptest_config(support::proptest_config(512))]

        /// Text `serde_json::Value` reads is read, text it refuses refused with the same error; the
        /// canonical text is what `Value` writes for the same text; lookups see what `Value` sees.
        #[test]
        fn reads_and_writes_as_value_does(text in text()) {
            let (value, json) = match (serde_json::from_str::<Value>(&text), Json::from_slice(text.as_bytes())) {
                (Ok(value), Ok(json)) => (value, json),
                // `1e400` is out of range for both.
                (Err(theirs), Err(ours)) => {
                    prop_assert_eq!(ours.to_string(), theirs.to_string());
                    return Ok(());
                }
                (theirs, ours) => return Err(TestCaseError::fail(format!("Value: {theirs:?}, Json: {ours:?}"))),
            };
            prop_assert_eq!(json.canonical_text(), serde_json::to_string(&value).unwrap());
            if let (Json::Object(object), Value::Object(map)) = (&json, &value) {
                for (key, expected) in map {
                    let got = object.get(key).map(|v| serde_json::from_str::<Value>(&v.canonical_text()).unwrap());
                    prop_assert_eq!(got.as_ref(), Some(expected));
                }
            }
        }
    }

    #[test]
    fn strings_without_escapes_are_borrowed() {
        let text = br#"{"plain":"text","esc\u0061ped":"a\nb"}"#;
        let Json::Object(object) = Json::from_slice(text).unwrap() else { panic!("an object") };
        assert!(matches!(object.0[0].0, Cow::Borrowed("plain")));
        assert!(matches!(object.0[0].1, Json::String(Cow::Borrowed("text"))));
        assert!(matches!(&object.0[1].0, Cow::Owned(key) if key == "escaped"));
        assert_eq!(object.get("escaped").and_then(Json::as_str), Some("a\nb"));
    }

    #[test]
    fn malformed_text_is_an_error_as_for_value() {
        for bad in ["", "{", "[1,]", "{\"a\":1}x", "nul", "{\"a\" 1}", "\"\\x\""] {
            let ours = Json::from_slice(bad.as_bytes()).unwrap_err().to_string();
            let theirs = serde_json::from_str::<Value>(bad).unwrap_err().to_string();
            assert_eq!(ours, theirs, "{bad:?}");
        }
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(Json::from_slice(deep.as_bytes()).is_err() && serde_json::from_str::<Value>(&deep).is_err());
    }

    #[test]
    fn repeated_keys_are_found_at_any_depth_and_size() {
        let wide = |repeat: bool| {
            let mut fields: Vec<String> = (0..20).map(|i| format!("\"k{i}\":{i}")).collect();
            if repeat {
                fields.push("\"k3\":0".into());
            }
            format!("{{{}}}", fields.join(","))
        };
        for (text, repeated) in [
            (r#"{"a":1,"b":2}"#.to_owned(), false),
            (r#"{"a":1,"a":2}"#.to_owned(), true),
            (r#"[{"a":1},{"b":{"c":[{"d":1,"d":1}]}}]"#.to_owned(), true),
            (r#"{"a":{"a":{"a":1}}}"#.to_owned(), false),
            (wide(false), false),
            (wide(true), true),
        ] {
            assert_eq!(Json::from_slice(text.as_bytes()).unwrap().has_repeated_keys(), repeated, "{text}");
        }
    }

    #[test]
    fn serde_jsons_private_raw_value_key_is_a_key_like_any_other() {
        let text = br#"{"$serde_json::private::RawValue":"{\"a\":1}"}"#;
        let Json::Object(object) = Json::from_slice(text).unwrap() else { panic!("an object") };
        assert_eq!(object.get("$serde_json::private::RawValue").and_then(Json::as_str), Some(r#"{"a":1}"#));
        assert!(object.get("a").is_none());
    }

    #[test]
    fn set_changes_every_occurrence_or_adds_the_key() {
        let text = br#"{"max_tokens":1,"x":2,"max_tokens":3}"#;
        let Json::Object(mut object) = Json::from_slice(text).unwrap() else { panic!("an object") };
        object.set("max_tokens", Json::Number(9.into()));
        object.set("n_predict", Json::Number(9.into()));
        assert!(object.0.iter().filter(|(k, _)| k == "max_tokens").all(|(_, v)| v.as_u64() == Some(9)));
        assert_eq!(Json::Object(object).canonical_text(), r#"{"max_tokens":9,"n_predict":9,"x":2}"#);
    }
}
