//! Reads one value at a path out of a JSON document without building the document: the parser
//! streams past everything else, so a body of millions of elements costs no memory beyond the value
//! asked for, while a syntax error anywhere still says the body is not JSON.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// What sits at a path.
#[derive(Debug, Clone, PartialEq)]
pub enum Found {
    Missing,
    /// A string, number, bool or null.
    Scalar(Value),
    /// An object or an array (not kept).
    Composite,
}

/// The data is not one JSON document.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotJson;

pub fn find(data: &[u8], path: &[String]) -> Result<Found, NotJson> {
    let mut deserializer = serde_json::Deserializer::from_slice(data);
    let found = PathSeed(path).deserialize(&mut deserializer).map_err(|_| NotJson)?;
    deserializer.end().map_err(|_| NotJson)?;
    Ok(found)
}

struct PathSeed<'p>(&'p [String]);

impl<'de> DeserializeSeed<'de> for PathSeed<'_> {
    type Value = Found;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Found, D::Error> {
        deserializer.deserialize_any(PathVisitor(self.0))
    }
}

struct PathVisitor<'p>(&'p [String]);

impl PathVisitor<'_> {
    fn scalar<E>(&self, value: Value) -> Result<Found, E> {
        Ok(if self.0.is_empty() { Found::Scalar(value) } else { Found::Missing })
    }
}

impl<'de> Visitor<'de> for PathVisitor<'_> {
    type Value = Found;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Found, E> {
        self.scalar(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Found, E> {
        self.scalar(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Found, E> {
        self.scalar(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Found, E> {
        self.scalar(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Found, E> {
        self.scalar(Value::String(v.to_owned()))
    }
    fn visit_unit<E>(self) -> Result<Found, E> {
        self.scalar(Value::Null)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Found, A::Error> {
        let mut found = if self.0.is_empty() { Found::Composite } else { Found::Missing };
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match self.0.split_first() {
                // As serde_json's Value does, the last of duplicate keys wins.
                Some((first, rest)) if *first == key => found = map.next_value_seed(PathSeed(rest))?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(found)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Found, A::Error> {
        let wanted = match self.0.split_first() {
            None => None,
            Some((first, rest)) => first.parse::<usize>().ok().map(|index| (index, rest)),
        };
        let mut found = if self.0.is_empty() { Found::Composite } else { Found::Missing };
        let mut index = 0;
        loop {
            let more = match wanted {
                Some((at, rest)) if at == index => seq.next_element_seed(PathSeed(rest))?.map(|f| found = f),
                _ => seq.next_element::<IgnoredAny>()?.map(drop),
            };
            if more.is_none() {
                return Ok(found);
            }
            index += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> Vec<String> {
        p.split('.').map(str::to_owned).collect()
    }

    #[test]
    fn finds_scalars_objects_and_array_items_and_says_what_is_missing() {
        let doc = br#"{"a":{"b":[{"c":1},{"c":"two"}]},"x":true,"n":null,"a2":[1,2]}"#;
        assert_eq!(find(doc, &path("a.b.1.c")), Ok(Found::Scalar(Value::from("two"))));
        assert_eq!(find(doc, &path("a.b.0.c")), Ok(Found::Scalar(Value::from(1))));
        assert_eq!(find(doc, &path("x")), Ok(Found::Scalar(Value::Bool(true))));
        assert_eq!(find(doc, &path("n")), Ok(Found::Scalar(Value::Null)));
        assert_eq!(find(doc, &path("a.b")), Ok(Found::Composite));
        assert_eq!(find(doc, &path("a.b.2.c")), Ok(Found::Missing));
        assert_eq!(find(doc, &path("x.y")), Ok(Found::Missing));
        assert_eq!(find(doc, &path("zz")), Ok(Found::Missing));
        assert_eq!(find(br#"{"k":1,"k":2}"#, &path("k")), Ok(Found::Scalar(Value::from(2))));
    }

    #[test]
    fn a_syntax_error_anywhere_is_not_json() {
        assert_eq!(find(br#"{"a":1,"b":[1,2"#, &path("a")), Err(NotJson));
        assert_eq!(find(b"not json", &path("a")), Err(NotJson));
        assert_eq!(find(br#"{"a":1} trailing"#, &path("a")), Err(NotJson));
    }
}
