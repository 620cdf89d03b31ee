//! The output a request asks for, in whichever field its API names it.

use serde_json::Value;

/// The output ceiling the client asked for, under whichever name its API
/// uses. Values that are not non-negative integers are skipped rather than
/// trusted, so a hostile `-1` or `1e300` cannot turn into a huge reservation.
pub fn requested_output(body: &Value) -> Option<u64> {
    let obj = body.as_object()?;
    requested_output_of(OUTPUT_FIELDS.map(|key| obj.get(key)))
}

/// The names a request's output ceiling goes by, in the APIs the gateway serves.
pub const OUTPUT_FIELDS: [&str; 3] = ["max_tokens", "max_completion_tokens", "max_output_tokens"];

/// [`requested_output`] of the values of [`OUTPUT_FIELDS`], however they were read. The
/// largest of them: a provider may honour any, so checking only the first would let
/// `max_tokens: 10, max_completion_tokens: 100000` slip past the output limits.
pub fn requested_output_of(values: [Option<&Value>; OUTPUT_FIELDS.len()]) -> Option<u64> {
    values
        .into_iter()
        .filter_map(|v| v.and_then(non_negative_integer))
        .max()
}

/// Lowers every output ceiling of a request body (any name of [`OUTPUT_FIELDS`]) that asks for
/// more than `limit` to `limit`: a model with `clamp_output_tokens` serves such a request at its
/// limit. Any number above it counts, a float such as `1e300` included.
pub fn clamp_output(body: &mut Value, limit: u64) {
    let Some(obj) = body.as_object_mut() else {
        return;
    };
    for key in OUTPUT_FIELDS {
        if let Some(v) = obj.get_mut(key) {
            let over = match v.as_u64() {
                Some(n) => n > limit,
                None => v.as_f64().is_some_and(|f| f > limit as f64),
            };
            if over {
                *v = Value::from(limit);
            }
        }
    }
}

fn non_negative_integer(v: &Value) -> Option<u64> {
    if let Some(n) = v.as_u64() {
        return Some(n);
    }
    let f = v.as_f64()?;
    // 2^53: beyond it floats are no longer exact integers.
    if f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f <= 9_007_199_254_740_992.0 {
        // Exact: the value is a non-negative integer below 2^53.
        Some(f as u64)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn clamping_lowers_every_ceiling_over_the_limit() {
        let mut body = json!({"max_tokens": 128000, "max_completion_tokens": 1e300,
                              "max_output_tokens": 10, "messages": []});
        clamp_output(&mut body, 8192);
        assert_eq!(
            body,
            json!({"max_tokens": 8192, "max_completion_tokens": 8192,
                   "max_output_tokens": 10, "messages": []})
        );
        let mut within = json!({"max_tokens": 8192});
        clamp_output(&mut within, 8192);
        assert_eq!(within, json!({"max_tokens": 8192}));
        let mut odd = json!(["max_tokens"]);
        clamp_output(&mut odd, 1);
        assert_eq!(odd, json!(["max_tokens"]));
    }
}
