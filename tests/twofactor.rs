//! Two-factor enrolment and recovery codes (CONTRACT §3), through the real server: enrolment
//! stays pending until a code of its secret confirms it; confirmation shows ten single-use
//! recovery codes once and stores only their digests; sign-in then needs a TOTP code (each
//! accepted once) or an unused recovery code; turning it off needs a valid one; an account has
//! one budget of five wrong codes per fifteen minutes, whichever request spends them; operators
//! clear it all with `gateway user reset-2fa`.

mod common;

use common::site::{
    now_s, recovery_codes, request_two_factor, security, signed_in, two_factor_with_code,
    two_factor_without_code, wrong_totp, Browser,
};
use common::*;
use gateway_site::twofactor;
use serde_json::json;

/// A gateway with generous sign-in limits.
fn gateway() -> (Mock, Gateway) {
    config::start_with_toml(config::ROOMY_SIGN_IN)
}

/// Starts an enrolment; returns the pending secret after checking the answer's shape.
async fn start(b: &mut Browser) -> String {
    let v = request_two_factor(b).await;
    let sec = v["security"].as_object().expect("security");
    assert_eq!(sec["twoFactorEnabled"], json!(false), "{v}");
    assert_eq!(sec["twoFactorPending"], json!(true), "{v}");
    assert_eq!(sec.len(), 4, "{v}");
    let secret = sec["totpSecret"].as_str().expect("totpSecret").to_string();
    let url = sec["otpauthUrl"].as_str().expect("otpauthUrl");
    assert!(
        url.starts_with("otpauth://totp/") && url.contains(&format!("secret={secret}")),
        "{url}"
    );
    assert!(v.get("recoveryCodes").is_none(), "{v}");
    secret
}

/// Enrols fully, confirming with the previous time step's code so that the codes of now and
/// the next step stay unused; returns the secret and the recovery codes.
async fn enrol(b: &mut Browser) -> (String, Vec<String>) {
    let secret = start(b).await;
    let code = twofactor::code_at(&secret, now_s() - 30).expect("code");
    let v = two_factor_with_code(b, true, &code).await.ok_json();
    assert_eq!(v["security"], json!({"twoFactorEnabled": true}), "{v}");
    assert_eq!(
        v.as_object().map(|o| o.len()),
        Some(3),
        "ok, security, recoveryCodes: {v}"
    );
    (secret, recovery_codes(&v))
}

/// Signs in a fresh browser with `two_factor`; returns `(status, code)` of an error or
/// `(200, "")`.
async fn sign_in(gw: &Gateway, email: &str, two_factor: Option<&str>) -> (u16, String) {
    let r = Browser::new(gw).sign_in_with(gw, email, two_factor).await;
    if r.status == 200 {
        (200, String::new())
    } else {
        r.error()
    }
}

/// Asks a fresh browser for a sign-in mail to `email` and posts its magic link's token with
/// `two_factor` from another fresh browser; returns the answer.
async fn sign_in_by_link(gw: &Gateway, email: &str, two_factor: &str) -> common::site::Reply {
    Browser::new(gw)
        .post(
            "/api/auth/request-code",
            &json!({"email": email, "acceptedTerms": true}),
        )
        .await
        .ok_json();
    let mail = common::site::outbox_mails(gw, email)
        .pop()
        .expect("the sign-in mail");
    let token = mail
        .split("verify-link?token=")
        .nth(1)
        .expect("link")
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect::<String>();
    Browser::new(gw)
        .post_form(
            "/api/auth/verify-link",
            &[("token", &token), ("twoFactorCode", two_factor)],
        )
        .await
}

/// `(totp_secret, totp_pending_secret)` as stored.
async fn stored_seeds(gw: &Gateway, id: &str) -> (Option<String>, Option<String>) {
    let db = gw.db().await;
    let secret: Option<String> = sqlx::query_scalar("SELECT totp_secret FROM users WHERE id = $1")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .expect("secret");
    let pending: Option<String> =
        sqlx::query_scalar("SELECT totp_pending_secret FROM users WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .expect("pending");
    (secret, pending)
}

async fn stored_recovery_hashes(gw: &Gateway, id: &str) -> Vec<String> {
    let db = gw.db().await;
    sqlx::query_scalar("SELECT code_hash FROM two_factor_recovery_codes WHERE user_id = $1")
        .bind(id)
        .fetch_all(&db.pool)
        .await
        .expect("recovery codes")
}

#[tokio::test]
async fn enrolment_is_pending_until_a_code_confirms_it() {
    let (_mock, gw) = gateway();
    let email = "enrol@example.com";
    let mut b = signed_in(&gw, email).await;
    let id = gw.user_id(email).await;
    assert_eq!(
        security(&mut b).await,
        json!({"twoFactorEnabled": false, "twoFactorPending": false})
    );

    // Nothing pending: a code confirms nothing.
    let (s, c) = two_factor_with_code(&mut b, true, "123456").await.error();
    assert_eq!((s, c.as_str()), (400, "invalid_body"));
    for body in [
        json!({"twoFactorEnabled": true, "twoFactorCode": 123456}),
        json!({"twoFactorCode": "123456"}),
    ] {
        let (s, c) = b.post("/api/account/security", &body).await.error();
        assert_eq!((s, c.as_str()), (400, "invalid_body"), "{body}");
    }

    // Pending: shown once, off until confirmed, so sign-in needs no second factor yet.
    let first = start(&mut b).await;
    assert_eq!(
        security(&mut b).await,
        json!({"twoFactorEnabled": false, "twoFactorPending": true})
    );
    let (secret, pending) = stored_seeds(&gw, &id).await;
    assert_eq!(secret, None);
    let pending = pending.expect("pending seed stored");
    assert!(
        pending.starts_with("v1.") && !pending.contains(&first),
        "sealed: {pending}"
    );
    assert_eq!(sign_in(&gw, email, None).await, (200, String::new()));

    // Asking again replaces the pending secret: the first one's codes no longer confirm.
    let second = start(&mut b).await;
    assert_ne!(first, second);
    let old = twofactor::code_at(&first, now_s()).expect("code");
    let new_valid: Vec<String> = [now_s() - 30, now_s(), now_s() + 30]
        .iter()
        .map(|t| twofactor::code_at(&second, *t).expect("code"))
        .collect();
    if !new_valid.contains(&old) {
        let (s, c) = two_factor_with_code(&mut b, true, &old).await.error();
        assert_eq!((s, c.as_str()), (400, "invalid_code"));
    }
    let (s, c) = two_factor_with_code(&mut b, true, &wrong_totp(&second))
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "invalid_code"));
    assert_eq!(security(&mut b).await["twoFactorPending"], json!(true));

    // Confirmed by a code of the pending secret: on, with ten recovery codes shown once.
    let code = twofactor::code_at(&second, now_s()).expect("code");
    let v = two_factor_with_code(&mut b, true, &code).await.ok_json();
    assert_eq!(v["security"], json!({"twoFactorEnabled": true}));
    let codes = recovery_codes(&v);
    assert_eq!(codes.len(), 10);
    let mut distinct = codes.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 10, "{codes:?}");
    assert_eq!(
        security(&mut b).await,
        json!({"twoFactorEnabled": true, "twoFactorPending": false, "recoveryCodesLeft": 10})
    );
    assert_eq!(
        b.get("/api/account/profile").await.ok_json()["user"]["twoFactorEnabled"],
        json!(true)
    );

    // Stored: the sealed seed moved from pending to confirmed; the codes only as digests.
    let (secret, pending) = stored_seeds(&gw, &id).await;
    assert_eq!(pending, None);
    assert!(secret.expect("seed").starts_with("v1."));
    let hashes = stored_recovery_hashes(&gw, &id).await;
    assert_eq!(hashes.len(), 10);
    for h in &hashes {
        assert!(
            h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()),
            "{h}"
        );
        for c in &codes {
            assert!(
                !h.contains(&c.replace('-', "")),
                "a code is stored in the clear"
            );
        }
    }

    // The confirming code was accepted once: it cannot sign in.
    assert_eq!(
        sign_in(&gw, email, Some(&code)).await,
        (400, "invalid_code".to_string())
    );
    // Asking to turn it on while on changes nothing and shows no secret or codes.
    let v = request_two_factor(&mut b).await;
    assert_eq!(
        v,
        json!({"ok": true, "security": {"twoFactorEnabled": true}})
    );
    assert_eq!(stored_recovery_hashes(&gw, &id).await.len(), 10);

    // Nothing secret reached the log.
    let log = gw.log();
    assert!(!log.contains(&second), "the log prints the TOTP seed");
    for c in &codes {
        assert!(!log.contains(c), "the log prints a recovery code");
    }
}

#[tokio::test]
async fn sign_in_takes_a_totp_code_once_or_an_unused_recovery_code() {
    let (_mock, gw) = gateway();
    let email = "second@example.com";
    let mut b = signed_in(&gw, email).await;
    let (secret, codes) = enrol(&mut b).await;

    assert_eq!(
        sign_in(&gw, email, None).await,
        (401, "two_factor_code_required".to_string())
    );
    // The magic link takes a recovery code too.
    let r = sign_in_by_link(&gw, email, &codes[2]).await;
    assert_eq!(r.status, 303, "{}", r.text);
    // The wrong codes below are five in all: the account's whole budget of them.
    assert_eq!(
        sign_in(&gw, email, Some(&wrong_totp(&secret))).await,
        (400, "invalid_code".to_string())
    );
    assert_eq!(
        sign_in(&gw, email, Some("aaaaa-aaaaa")).await,
        (400, "invalid_code".to_string())
    );

    // A TOTP code signs in once; its replay within its window is refused.
    let now = twofactor::code_at(&secret, now_s()).expect("code");
    assert_eq!(sign_in(&gw, email, Some(&now)).await, (200, String::new()));
    assert_eq!(
        sign_in(&gw, email, Some(&now)).await,
        (400, "invalid_code".to_string())
    );

    // A recovery code signs in once, typed any way; used, it is refused.
    assert_eq!(
        sign_in(&gw, email, Some(&codes[0])).await,
        (200, String::new())
    );
    assert_eq!(
        sign_in(&gw, email, Some(&codes[0])).await,
        (400, "invalid_code".to_string())
    );
    let shouted = codes[1].to_uppercase().replace('-', " ");
    assert_eq!(
        sign_in(&gw, email, Some(&shouted)).await,
        (200, String::new())
    );
    assert_eq!(
        sign_in(&gw, email, Some(&codes[1])).await,
        (400, "invalid_code".to_string())
    );
    // Another account's code is no code there (asked of the other account: this one has spent
    // its five wrong codes).
    let mut other = signed_in(&gw, "other@example.com").await;
    enrol(&mut other).await;
    assert_eq!(
        sign_in(&gw, "other@example.com", Some(&codes[9])).await,
        (400, "invalid_code".to_string())
    );

    assert_eq!(
        security(&mut b).await["recoveryCodesLeft"],
        json!(7),
        "three codes used"
    );
}

#[tokio::test]
async fn turning_off_needs_a_valid_code() {
    let (_mock, gw) = gateway();
    let email = "off@example.com";
    let mut b = signed_in(&gw, email).await;
    let id = gw.user_id(email).await;

    // A pending enrolment is dropped without a code.
    start(&mut b).await;
    let v = two_factor_without_code(&mut b, false).await.ok_json();
    assert_eq!(
        v,
        json!({"ok": true, "security": {"twoFactorEnabled": false}})
    );
    assert_eq!(stored_seeds(&gw, &id).await, (None, None));
    let (s, c) = two_factor_with_code(&mut b, true, "123456").await.error();
    assert_eq!(
        (s, c.as_str()),
        (400, "invalid_body"),
        "nothing pending any more"
    );

    let (secret, codes) = enrol(&mut b).await;
    // Used at sign-in, a recovery code cannot turn it off.
    assert_eq!(
        sign_in(&gw, email, Some(&codes[0])).await,
        (200, String::new())
    );
    for (body, want) in [
        (
            json!({"twoFactorEnabled": false}),
            (401, "two_factor_code_required"),
        ),
        (
            json!({"twoFactorEnabled": false, "twoFactorCode": wrong_totp(&secret)}),
            (400, "invalid_code"),
        ),
        (
            json!({"twoFactorEnabled": false, "twoFactorCode": codes[0]}),
            (400, "invalid_code"),
        ),
    ] {
        let (s, c) = b.post("/api/account/security", &body).await.error();
        assert_eq!((s, c.as_str()), want, "{body}");
    }
    assert_eq!(security(&mut b).await["twoFactorEnabled"], json!(true));

    // An unused recovery code turns it off; seed and codes are gone.
    let v = two_factor_with_code(&mut b, false, &codes[5])
        .await
        .ok_json();
    assert_eq!(
        v,
        json!({"ok": true, "security": {"twoFactorEnabled": false}})
    );
    assert_eq!(stored_seeds(&gw, &id).await, (None, None));
    assert!(stored_recovery_hashes(&gw, &id).await.is_empty());
    assert_eq!(sign_in(&gw, email, None).await, (200, String::new()));

    // A TOTP code turns it off too, but not one already used.
    let (secret, _) = enrol(&mut b).await;
    let code = twofactor::code_at(&secret, now_s()).expect("code");
    assert_eq!(sign_in(&gw, email, Some(&code)).await, (200, String::new()));
    let (s, c) = two_factor_with_code(&mut b, false, &code).await.error();
    assert_eq!(
        (s, c.as_str()),
        (400, "invalid_code"),
        "a replayed TOTP code"
    );
    let next = twofactor::code_at(&secret, now_s() + 30).expect("code");
    let v = two_factor_with_code(&mut b, false, &next).await.ok_json();
    assert_eq!(v["security"], json!({"twoFactorEnabled": false}));
}

/// `{regenerateRecoveryCodes: true, twoFactorCode}` replaces every recovery code with ten new
/// ones while two-factor stays on: the old codes stop working, the new ones sign in.
#[tokio::test]
async fn recovery_codes_are_regenerated_with_a_second_factor() {
    let (_mock, gw) = gateway();
    let email = "regen@example.com";
    let mut b = signed_in(&gw, email).await;
    let id = gw.user_id(email).await;
    let regenerate = |code: Option<&str>| match code {
        Some(c) => json!({"regenerateRecoveryCodes": true, "twoFactorCode": c}),
        None => json!({"regenerateRecoveryCodes": true}),
    };

    // Nothing to regenerate while two-factor is off.
    let (s, c) = b
        .post("/api/account/security", &regenerate(Some("123456")))
        .await
        .error();
    assert_eq!((s, c.as_str()), (400, "invalid_body"));

    let (secret, old) = enrol(&mut b).await;
    assert_eq!(
        sign_in(&gw, email, Some(&old[0])).await,
        (200, String::new())
    );
    for (body, want) in [
        (regenerate(None), (401, "two_factor_code_required")),
        (
            regenerate(Some(&wrong_totp(&secret))),
            (400, "invalid_code"),
        ),
        (regenerate(Some(&old[0])), (400, "invalid_code")),
        (
            json!({"regenerateRecoveryCodes": "yes", "twoFactorCode": old[1]}),
            (400, "invalid_body"),
        ),
    ] {
        let (s, c) = b.post("/api/account/security", &body).await.error();
        assert_eq!((s, c.as_str()), want, "{body}");
    }
    assert_eq!(stored_recovery_hashes(&gw, &id).await.len(), 10);

    // A TOTP code: ten new codes, shown once; the old ones are gone, used or not.
    let code = twofactor::code_at(&secret, now_s()).expect("code");
    let v = b
        .post("/api/account/security", &regenerate(Some(&code)))
        .await
        .ok_json();
    assert_eq!(
        v["security"],
        json!({"twoFactorEnabled": true, "recoveryCodesLeft": 10}),
        "{v}"
    );
    let new = recovery_codes(&v);
    assert_eq!(new.len(), 10);
    assert!(new.iter().all(|c| !old.contains(c)), "{new:?}");
    assert_eq!(stored_recovery_hashes(&gw, &id).await.len(), 10);
    assert!(!stored_recovery_hashes(&gw, &id).await.contains(&new[0]));
    assert_eq!(security(&mut b).await["recoveryCodesLeft"], json!(10));
    assert_eq!(
        sign_in(&gw, email, Some(&old[3])).await,
        (400, "invalid_code".to_string())
    );
    assert_eq!(
        sign_in(&gw, email, Some(&new[3])).await,
        (200, String::new())
    );
    assert_eq!(security(&mut b).await["recoveryCodesLeft"], json!(9));

    // An unused recovery code works as the second factor too (and is used up by it).
    let v = b
        .post("/api/account/security", &regenerate(Some(&new[4])))
        .await
        .ok_json();
    let newer = recovery_codes(&v);
    assert_eq!(newer.len(), 10);
    assert_eq!(security(&mut b).await["twoFactorEnabled"], json!(true));
    assert_eq!(
        sign_in(&gw, email, Some(&new[5])).await,
        (400, "invalid_code".to_string())
    );
}

const SPENT: (u16, &str) = (429, "too_many_attempts");

#[tokio::test]
async fn enrolment_confirmation_takes_five_wrong_codes() {
    let (_mock, mut gw) = gateway();
    let email = "guesser@example.com";
    let mut b = signed_in(&gw, email).await;
    let secret = start(&mut b).await;
    let wrong = wrong_totp(&secret);
    for n in 1..=5 {
        let (s, c) = two_factor_with_code(&mut b, true, &wrong).await.error();
        assert_eq!((s, c.as_str()), (400, "invalid_code"), "wrong code {n}");
    }
    // Spent: even the right code is refused, and the refusals do not go on counting.
    let right = twofactor::code_at(&secret, now_s()).expect("code");
    for _ in 0..3 {
        let (s, c) = two_factor_with_code(&mut b, true, &right).await.error();
        assert_eq!((s, c.as_str()), SPENT);
    }
    // A new enrolment, a new sign-in (a new emailed code) and another instance of the service
    // (a restart here, on the same database) bring no new guesses.
    let secret = start(&mut b).await;
    let mut again = signed_in(&gw, email).await;
    let (s, c) = two_factor_with_code(&mut again, true, &wrong_totp(&secret))
        .await
        .error();
    assert_eq!((s, c.as_str()), SPENT);
    assert!(gw.terminate(), "clean shutdown");
    gw.spawn();
    let mut after = signed_in(&gw, email).await;
    let right = twofactor::code_at(&secret, now_s()).expect("code");
    let (s, c) = two_factor_with_code(&mut after, true, &right).await.error();
    assert_eq!((s, c.as_str()), SPENT);
    assert_eq!(
        security(&mut after).await,
        json!({"twoFactorEnabled": false, "twoFactorPending": true})
    );
}

#[tokio::test]
async fn sign_in_and_turning_off_share_the_wrong_code_budget() {
    let (_mock, gw) = gateway();
    let email = "budget@example.com";
    let mut b = signed_in(&gw, email).await;
    let (secret, codes) = enrol(&mut b).await;
    // Right codes cost nothing: six sign-ins in a row.
    for code in &codes[..6] {
        assert_eq!(sign_in(&gw, email, Some(code)).await, (200, String::new()));
    }
    // Five wrong codes, spread over the three ways in; each sign-in by code has a new emailed
    // code, so each brings five tries of its own for that code, none for the second factor.
    let wrong = wrong_totp(&secret);
    let (s, c) = two_factor_with_code(&mut b, false, &wrong).await.error();
    assert_eq!((s, c.as_str()), (400, "invalid_code"));
    for _ in 0..2 {
        assert_eq!(
            sign_in(&gw, email, Some(&wrong)).await,
            (400, "invalid_code".to_string())
        );
    }
    let r = sign_in_by_link(&gw, email, &wrong).await;
    assert_eq!(r.error(), (400, "invalid_code".to_string()));
    assert_eq!(
        sign_in(&gw, email, Some("aaaaa-aaaaa")).await,
        (400, "invalid_code".to_string())
    );
    // Spent: a right code is refused by every way in, a fresh emailed code included.
    let right = twofactor::code_at(&secret, now_s()).expect("code");
    assert_eq!(
        sign_in(&gw, email, Some(&right)).await,
        (SPENT.0, SPENT.1.to_string())
    );
    assert_eq!(
        sign_in(&gw, email, Some(&codes[6])).await,
        (SPENT.0, SPENT.1.to_string())
    );
    let r = sign_in_by_link(&gw, email, &codes[7]).await;
    assert_eq!(r.error(), (SPENT.0, SPENT.1.to_string()));
    let (s, c) = two_factor_with_code(&mut b, false, &codes[8]).await.error();
    assert_eq!((s, c.as_str()), SPENT);
    // Without a code nothing is guessed: the answer is still that one is needed.
    assert_eq!(
        sign_in(&gw, email, None).await,
        (401, "two_factor_code_required".to_string())
    );
    assert_eq!(security(&mut b).await["recoveryCodesLeft"], json!(4));
    // Another account's budget is its own.
    let mut other = signed_in(&gw, "bystander@example.com").await;
    let (other_secret, _) = enrol(&mut other).await;
    let code = twofactor::code_at(&other_secret, now_s()).expect("code");
    assert_eq!(
        sign_in(&gw, "bystander@example.com", Some(&code)).await,
        (200, String::new())
    );
}

#[tokio::test]
async fn operators_reset_two_factor_with_the_cli() {
    let (_mock, gw) = gateway();
    let on = "locked-out@example.com";
    let mut b = signed_in(&gw, on).await;
    enrol(&mut b).await;
    let on_id = gw.user_id(on).await;
    assert_eq!(stored_recovery_hashes(&gw, &on_id).await.len(), 10);
    assert_eq!(
        sign_in(&gw, on, None).await,
        (401, "two_factor_code_required".to_string())
    );

    let reset = gw.admin_json(&["user", "reset-2fa", "--email", on]);
    assert_eq!(reset["id"], json!(on_id));
    assert_eq!(reset["twoFactorEnabled"], json!(false));
    assert_eq!(stored_seeds(&gw, &on_id).await, (None, None));
    assert!(stored_recovery_hashes(&gw, &on_id).await.is_empty());
    assert_eq!(sign_in(&gw, on, None).await, (200, String::new()));
    assert_eq!(
        security(&mut b).await,
        json!({"twoFactorEnabled": false, "twoFactorPending": false})
    );

    // A pending enrolment is cleared too.
    let pending = "half-way@example.com";
    let mut p = signed_in(&gw, pending).await;
    start(&mut p).await;
    gw.admin_json(&["user", "reset-2fa", "--email", pending]);
    let p_id = gw.user_id(pending).await;
    assert_eq!(stored_seeds(&gw, &p_id).await, (None, None));
    assert_eq!(security(&mut p).await["twoFactorPending"], json!(false));

    let (ok, err) = gw.admin(&["user", "reset-2fa", "--email", "nobody@example.com"]);
    assert!(!ok && err.contains("nobody@example.com"), "{err}");
}
