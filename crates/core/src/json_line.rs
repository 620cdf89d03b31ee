//! JSON lines written by hand on the request path: the access log's line and the usage
//! journal's two lines per request.
//!
//! Their keys are fixed text, so only the values need writing, and most values are ids and
//! numbers with nothing to escape. serde_json's derived serializers scan every key and every
//! string through their escaping machinery and format numbers through a `Formatter`; written
//! here, a key costs a copy and a clean string a byte scan and a copy. The output is exactly
//! what `serde_json::to_writer` writes for the same values (each user's tests compare the two).

/// A value written as JSON into a line.
pub trait WriteJson {
    fn write_json(&self, out: &mut Vec<u8>);
}

/// Writes `s` as a JSON string: copied between quotes when it holds nothing to escape (the
/// common case: ids, names, timestamps), else escaped by serde_json.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    // A fold without an early exit, so the compiler checks many bytes per instruction.
    let needs_escape = s.bytes().fold(false, |any, b| {
        any | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if !needs_escape {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Writing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

impl WriteJson for str {
    fn write_json(&self, out: &mut Vec<u8>) {
        write_str(out, self);
    }
}

impl WriteJson for String {
    fn write_json(&self, out: &mut Vec<u8>) {
        write_str(out, self);
    }
}

impl WriteJson for bool {
    fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(if *self { b"true" } else { b"false" });
    }
}

macro_rules! integers {
    ($($t:ty),*) => {$(
        impl WriteJson for $t {
            fn write_json(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(itoa::Buffer::new().format(*self).as_bytes());
            }
        }
    )*};
}
integers!(u16, u32, u64, i64, usize);

impl WriteJson for f64 {
    fn write_json(&self, out: &mut Vec<u8>) {
        // serde_json's own float formatting (and `null` for what JSON cannot hold).
        let _ = serde_json::to_writer(&mut *out, self);
    }
}

impl<T: WriteJson + ?Sized> WriteJson for &T {
    fn write_json(&self, out: &mut Vec<u8>) {
        (**self).write_json(out);
    }
}

impl<T: WriteJson> WriteJson for Option<T> {
    fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            Some(v) => v.write_json(out),
            None => out.extend_from_slice(b"null"),
        }
    }
}

/// Writes a JSON object into `$out` (a `&mut Vec<u8>`): `json_object!(out, { "k": v, … })`,
/// each key as given (it must need no escaping) and each value through [`WriteJson`].
#[macro_export]
macro_rules! json_object {
    ($out:expr, { $first:literal : $fv:expr $(, $key:literal : $v:expr)* $(,)? }) => {{
        let out: &mut Vec<u8> = $out;
        out.extend_from_slice(concat!("{\"", $first, "\":").as_bytes());
        $crate::json_line::WriteJson::write_json(&$fv, out);
        $(
            out.extend_from_slice(concat!(",\"", $key, "\":").as_bytes());
            $crate::json_line::WriteJson::write_json(&$v, out);
        )*
        out.push(b'}');
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written<T: WriteJson + serde::Serialize + ?Sized>(v: &T) -> (String, String) {
        let mut out = Vec::new();
        v.write_json(&mut out);
        (
            String::from_utf8(out).expect("utf-8"),
            serde_json::to_string(v).expect("json"),
        )
    }

    #[test]
    fn values_are_written_as_serde_json_writes_them() {
        for s in [
            "",
            "evt_abc123",
            "a\"b",
            "back\\slash",
            "tab\there",
            "nl\n",
            "\u{1}",
            "é ünïcode ✓",
            "\u{7f}",
        ] {
            let (ours, theirs) = written(s);
            assert_eq!(ours, theirs, "{s:?}");
        }
        for n in [0u64, 7, u64::MAX] {
            let (ours, theirs) = written(&n);
            assert_eq!(ours, theirs);
        }
        let (ours, theirs) = written(&-42i64);
        assert_eq!(ours, theirs);
        for f in [0.0, 0.309, 1e300, f64::NAN] {
            let (ours, theirs) = written(&f);
            assert_eq!(ours, theirs);
        }
        let (ours, theirs) = written(&Some("x"));
        assert_eq!(ours, theirs);
        let (ours, theirs) = written(&None::<u64>);
        assert_eq!(ours, theirs);
        let (ours, theirs) = written(&true);
        assert_eq!(ours, theirs);
    }

    #[test]
    fn an_object_is_the_derived_serialization() {
        #[derive(serde::Serialize)]
        struct S<'a> {
            a: &'a str,
            b: Option<u64>,
            c: bool,
        }
        let s = S {
            a: "q\"uote",
            b: None,
            c: false,
        };
        let mut out = Vec::new();
        json_object!(&mut out, { "a": s.a, "b": s.b, "c": s.c });
        assert_eq!(
            String::from_utf8(out).expect("utf-8"),
            serde_json::to_string(&s).expect("json")
        );
    }
}
