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
