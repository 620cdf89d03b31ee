//! One budget of wrong second-factor codes per account, whichever request spends it: signing in
//! by code or by link, confirming an enrolment, turning two-factor off.
//!
//! Six digits are a million codes; what keeps them from being guessed is that few guesses are
//! allowed. A budget per sign-in challenge or per session would not do: each new emailed code
//! or session would bring fresh guesses. So the account's wrong codes are counted in the
//! database's attempt counters (shared by every instance): after [`WRONG_CODES`] in
//! [`WINDOW_MS`], every code is `too_many_attempts`, right or not, until the window has moved
//! on. A guess is taken before the code is compared (parallel guesses cannot exceed the budget)
//! and given back when the code was right or the guess was refused, so only wrong codes count.

use crate::error::{Failing, SiteError};
use crate::hourly::{self, Hit};
use gateway_core::state::AppState;

/// Wrong codes an account may send per window.
pub const WRONG_CODES: i64 = 5;
/// The sliding window the wrong codes are counted over: fifteen minutes.
pub const WINDOW_MS: i64 = 15 * 60 * 1000;

/// A guess taken from an account's budget. It counts as a wrong code unless it is given back.
pub struct Guess {
    bucket: String,
    hit: Hit,
}

/// Takes one guess from `user_id`'s budget: `too_many_attempts` when it is spent.
pub async fn take(state: &AppState, user_id: &str) -> Result<Guess, SiteError> {
    let bucket = format!("tfa-wrong:{user_id}");
    let hit = hourly::hit(state, &bucket, WINDOW_MS)
        .await
        .or_fail(SiteError::SecurityUpdateFailed)?;
    let guess = Guess { bucket, hit };
    if hit.count > WRONG_CODES {
        guess.give_back(state).await;
        return Err(SiteError::TooManyAttempts);
    }
    Ok(guess)
}

impl Guess {
    /// The code was right (or never compared): the guess does not count. A failure to give it
    /// back is logged; it costs the account one guess, never a wrong answer.
    pub async fn give_back(self, state: &AppState) {
        if let Err(e) = hourly::give_back(state, &self.bucket, self.hit).await {
            log::warn!("two-factor guess not given back: {e}");
        }
    }
}
