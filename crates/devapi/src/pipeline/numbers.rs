//! Range checks of the numeric request fields that set how much a request may generate: a
//! negative, fractional, huge or non-numeric value is refused here, in OpenAI's words, and
//! never reaches a provider (which would answer it in its own way, or not at all).

use serde_json::Value;

use crate::error::ApiError;

/// The fields checked, in [`Head::numbers`](super::reading::Head) order: the output ceilings
/// of every API, and the other counts a request sets.
pub const CHECKED: [&str; 6] = [
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "max_tool_calls",
    "n",
    "top_logprobs",
];

/// The largest value any of them may take.
const MAX: u64 = u32::MAX as u64;

/// How OpenAI names a JSON value's type in its errors.
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a decimal number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Each of `values` (the fields of [`CHECKED`], `None` when absent) is absent, `null`, or a
/// whole number from 0 to 2^32 - 1 (an integral float such as `16.0` included).
pub fn check(values: [Option<&Value>; CHECKED.len()]) -> Result<(), ApiError> {
    for (param, v) in CHECKED.iter().zip(values) {
        let Some(v) = v.filter(|v| !v.is_null()) else {
            continue;
        };
        let fail = |code: &'static str, message: String| ApiError::InvalidParam {
            code,
            param,
            message,
        };
        let Value::Number(n) = v else {
            return Err(fail(
                "invalid_type",
                format!(
                    "Invalid type for '{param}': expected an integer, but got {} instead.",
                    type_name(v)
                ),
            ));
        };
        if let Some(u) = n.as_u64() {
            if u > MAX {
                return Err(above(param, &n.to_string()));
            }
            continue;
        }
        if n.as_i64().is_some() {
            return Err(below(param, &n.to_string()));
        }
        let f = n.as_f64().unwrap_or(f64::NAN);
        if !f.is_finite() || f.fract() != 0.0 {
            return Err(fail(
                "invalid_type",
                format!(
                    "Invalid type for '{param}': expected an integer, but got a decimal number \
                     instead."
                ),
            ));
        }
        if f < 0.0 {
            return Err(below(param, &n.to_string()));
        }
        if f > MAX as f64 {
            return Err(above(param, &n.to_string()));
        }
    }
    Ok(())
}

fn below(param: &'static str, got: &str) -> ApiError {
    ApiError::InvalidParam {
        code: "integer_below_min_value",
        param,
        message: format!(
            "Invalid '{param}': integer below minimum value. Expected a value >= 0, but got \
             {got} instead."
        ),
    }
}

fn above(param: &'static str, got: &str) -> ApiError {
    ApiError::InvalidParam {
        code: "integer_above_max_value",
        param,
        message: format!(
            "Invalid '{param}': integer above maximum value. Expected a value <= {MAX}, but got \
             {got} instead."
        ),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn one(field: &str, v: Value) -> Result<(), ApiError> {
        let values = CHECKED.map(|f| (f == field).then_some(&v));
        check(values)
    }

    #[test]
    fn whole_numbers_in_range_pass() {
        for v in [
            json!(0),
            json!(1),
            json!(16.0),
            json!(4294967295u64),
            json!(null),
            json!(-0.0),
        ] {
            for field in CHECKED {
                assert!(one(field, v.clone()).is_ok(), "{field} {v}");
            }
        }
        assert!(check([None; CHECKED.len()]).is_ok());
    }

    #[test]
    fn everything_else_is_refused_naming_the_field() {
        let cases = [
            (json!(-1), "integer_below_min_value"),
            (json!(-1.0), "integer_below_min_value"),
            (json!(i64::MIN), "integer_below_min_value"),
            (json!(4294967296u64), "integer_above_max_value"),
            (json!(u64::MAX), "integer_above_max_value"),
            (json!(1e300), "integer_above_max_value"),
            (json!(2.5), "invalid_type"),
            (json!("100"), "invalid_type"),
            (json!(true), "invalid_type"),
            (json!([1]), "invalid_type"),
            (json!({"n": 1}), "invalid_type"),
        ];
        for field in CHECKED {
            for (v, code) in &cases {
                let e = one(field, v.clone()).unwrap_err();
                assert_eq!((e.status(), e.code()), (400, *code), "{field} {v}");
                let body: Value = serde_json::from_slice(&e.body(false)).unwrap();
                assert_eq!(body["error"]["param"], field);
                assert_eq!(body["error"]["type"], "invalid_request_error");
                assert!(
                    body["error"]["message"].as_str().unwrap().contains(field),
                    "{body}"
                );
            }
        }
    }
}
