//! What a model's tokens cost: the quota weights the meters charge customers, and the provider
//! prices an operator may record to see revenue against cost. Every quota charge of the gateway
//! (a reservation's estimate, a settlement, a usage event's `quota_charged`) is computed here,
//! so the in-process and the Redis engines, the records and the reports cannot disagree.
//!
//! Weights are kept in millionths (micro-units) and a charge is summed in integers: a weight of
//! `1.1` times 10 tokens must charge 11, and floating point says 11.000000000000002, which
//! rounded up would be 12.

use serde::Deserialize;

/// Micro-units in one quota token per raw token.
const MICRO: u128 = 1_000_000;

/// How many quota tokens one raw token of a model costs, per kind of token. Captured by a
/// request at admission (it travels in the reservation's ticket), so a reload that changes a
/// weight applies to the next request, never to one in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Weights {
    input: u64,
    output: u64,
    cached_input: u64,
}

impl Default for Weights {
    /// One quota token per token of any kind: what a model without weights costs.
    fn default() -> Self {
        Weights {
            input: MICRO as u64,
            output: MICRO as u64,
            cached_input: MICRO as u64,
        }
    }
}

/// The key of a refused weight and why.
pub type WeightError = (&'static str, String);

/// Largest weight accepted: far above any real price ratio, small enough that a charge of
/// `u64::MAX` tokens at it cannot overflow the integer sum.
const MAX_WEIGHT: f64 = 1_000_000.0;

fn micro(key: &'static str, value: Option<f64>, default: u64) -> Result<u64, WeightError> {
    let Some(w) = value else {
        return Ok(default);
    };
    if !w.is_finite() || !(0.0..=MAX_WEIGHT).contains(&w) {
        return Err((key, format!("must be a number from 0 to {MAX_WEIGHT}")));
    }
    Ok((w * MICRO as f64).round() as u64)
}

impl Weights {
    /// Weights from a model's config keys; absent ones default to 1, the cached-input weight to
    /// the input weight. Refuses negative, non-finite and absurdly large values.
    pub fn from_config(
        input: Option<f64>,
        output: Option<f64>,
        cached_input: Option<f64>,
    ) -> Result<Weights, WeightError> {
        let one = MICRO as u64;
        let input = micro("input_weight", input, one)?;
        let output = micro("output_weight", output, one)?;
        let cached_input = micro("cached_input_weight", cached_input, input)?;
        Ok(Weights {
            input,
            output,
            cached_input,
        })
    }

    /// The quota charge of a request's raw token counts, rounded up once:
    /// `ceil(uncached × input + cached × cached_input + output × output)`. `cached_input` is
    /// the part of `input` read from the provider's cache (counted at most up to `input`);
    /// cache writes are input tokens at the input weight.
    pub fn charge(&self, input: u64, cached_input: u64, output: u64) -> u64 {
        let cached = cached_input.min(input);
        let sum = u128::from(input - cached) * u128::from(self.input)
            + u128::from(cached) * u128::from(self.cached_input)
            + u128::from(output) * u128::from(self.output);
        u64::try_from(sum.div_ceil(MICRO)).unwrap_or(u64::MAX)
    }

    /// What a reservation holds: the estimated input (none of it assumed cached) and the
    /// output the request may produce.
    pub fn estimate(&self, input: u64, output: u64) -> u64 {
        self.charge(input, 0, output)
    }

    /// The weights as numbers, for display: (input, output, cached input).
    pub fn as_f64(&self) -> (f64, f64, f64) {
        let f = |w: u64| w as f64 / MICRO as f64;
        (f(self.input), f(self.output), f(self.cached_input))
    }
}

/// `[models.price]` as written: the provider's price per million tokens, in whatever currency
/// the operator writes them in.
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct PriceFile {
    pub input_per_million: Option<f64>,
    pub output_per_million: Option<f64>,
    /// Default: `input_per_million`.
    pub cached_input_per_million: Option<f64>,
}

/// What the provider charges the operator for a model's tokens, per million of each kind.
/// Only the operator's cost report reads it; it never touches a customer's quota.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Price {
    pub input_per_million: f64,
    pub output_per_million: f64,
    pub cached_input_per_million: f64,
}

impl Price {
    /// Validates `[models.price]`: every price finite and at least 0; absent ones are 0, the
    /// cached-input price defaults to the input price.
    pub fn from_file(f: &PriceFile) -> Result<Price, WeightError> {
        let check = |key: &'static str, v: Option<f64>, default: f64| match v {
            None => Ok(default),
            Some(p) if p.is_finite() && p >= 0.0 => Ok(p),
            Some(_) => Err((key, "must be a finite number of at least 0".to_string())),
        };
        let input = check("price.input_per_million", f.input_per_million, 0.0)?;
        Ok(Price {
            input_per_million: input,
            output_per_million: check("price.output_per_million", f.output_per_million, 0.0)?,
            cached_input_per_million: check(
                "price.cached_input_per_million",
                f.cached_input_per_million,
                input,
            )?,
        })
    }

    /// The provider's cost of these raw counts (`cached_input` is part of `input`).
    pub fn cost(&self, input: u64, cached_input: u64, output: u64) -> f64 {
        let cached = cached_input.min(input);
        ((input - cached) as f64 * self.input_per_million
            + cached as f64 * self.cached_input_per_million
            + output as f64 * self.output_per_million)
            / 1_000_000.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(i: f64, o: f64, c: Option<f64>) -> Weights {
        Weights::from_config(Some(i), Some(o), c).unwrap()
    }

    #[test]
    fn unit_weights_charge_the_raw_tokens() {
        let d = Weights::default();
        assert_eq!(d, Weights::from_config(None, None, None).unwrap());
        assert_eq!(d.charge(25, 5, 24), 49);
        assert_eq!(d.estimate(1000, 256), 1256);
        assert_eq!(d.charge(u64::MAX, 0, 0), u64::MAX);
    }

    #[test]
    fn a_charge_is_the_weighted_sum_rounded_up_once() {
        // 20 uncached at 2, 5 cached at 0.5, 24 out at 3: 40 + 2.5 + 72 = 114.5 -> 115.
        assert_eq!(w(2.0, 3.0, Some(0.5)).charge(25, 5, 24), 115);
        // Exact decimals: 10 tokens at 1.1 is 11, not 12.
        assert_eq!(w(1.1, 1.0, None).charge(10, 0, 0), 11);
        // 3 tokens at 0.1 each: 0.3 -> 1 (rounded once, not per token).
        assert_eq!(w(0.1, 0.1, None).charge(2, 0, 1), 1);
        // The cached weight defaults to the input weight.
        assert_eq!(w(2.0, 1.0, None).charge(10, 10, 0), 20);
        // Cached beyond input is counted as input at most.
        assert_eq!(w(1.0, 1.0, Some(0.0)).charge(10, 50, 0), 0);
        // Free models charge nothing.
        assert_eq!(w(0.0, 0.0, None).charge(1_000, 0, 1_000), 0);
    }

    #[test]
    fn bad_weights_are_refused_with_their_key() {
        for bad in [-1.0, f64::NAN, f64::INFINITY, 2e6] {
            assert_eq!(
                Weights::from_config(Some(bad), None, None).unwrap_err().0,
                "input_weight"
            );
            assert_eq!(
                Weights::from_config(None, Some(bad), None).unwrap_err().0,
                "output_weight"
            );
            assert_eq!(
                Weights::from_config(None, None, Some(bad)).unwrap_err().0,
                "cached_input_weight"
            );
        }
    }

    #[test]
    fn prices_cost_each_kind_of_token() {
        let p = Price::from_file(&PriceFile {
            input_per_million: Some(2.5),
            output_per_million: Some(10.0),
            cached_input_per_million: None,
        })
        .unwrap();
        assert_eq!(p.cached_input_per_million, 2.5);
        assert!((p.cost(1_000_000, 0, 1_000_000) - 12.5).abs() < 1e-9);
        let bad = PriceFile {
            output_per_million: Some(-1.0),
            ..Default::default()
        };
        assert_eq!(
            Price::from_file(&bad).unwrap_err().0,
            "price.output_per_million"
        );
    }
}
