use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use super::health::clock_ms;
use super::plan::two_choices;
use super::*;
use crate::upstream::Wait;
use gateway_core::config::{Deployment, Model, Provider};

fn health(outstanding: u32) -> Arc<Health> {
    let h = Arc::new(Health::new(Arc::from("test/p2c")));
    h.outstanding.store(outstanding, Relaxed);
    h
}

fn provider(name: &str, key_env: Option<&str>) -> Arc<Provider> {
    Arc::new(Provider {
        name: name.into(),
        style: gateway_core::domain::ProviderStyle::OpenAi,
        tls: false,
        host: "127.0.0.1".into(),
        ip: "127.0.0.1".parse().ok(),
        port: 9,
        base_path: String::new(),
        host_header: "127.0.0.1:9".into(),
        api_key: None,
        api_key_env: key_env.map(str::to_string),
        api_key_mask: Default::default(),
        connect_timeout: Duration::from_secs(1),
        first_byte_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(1),
        eject_after_failures: 3,
        cooldown: Duration::from_secs(1),
        max_cooldown: Duration::from_secs(4),
        ca: None,
        serves_responses: true,
        access: Default::default(),
    })
}

fn model(id: &str, providers: &[Arc<Provider>]) -> Model {
    Model {
        id: id.into(),
        deployments: providers
            .iter()
            .map(|p| Deployment {
                provider: p.clone(),
                upstream_model: Arc::from(id),
                weight: 1,
                label: Arc::from(format!("{}/{id}", p.name)),
            })
            .collect(),
        context_window: None,
        max_output_tokens: None,
        clamp_output_tokens: false,
        default_output_tokens: 1,
        weights: Default::default(),
        price: None,
    }
}

/// Milliseconds left of the target's ejection (0 when not ejected).
fn ejected_for(t: &Target) -> u64 {
    t.health
        .ejected_until
        .load(Relaxed)
        .saturating_sub(clock_ms())
}

/// Lets the target's ejection run out without waiting.
fn expire(t: &Target) {
    if t.health.ejected_until.load(Relaxed) != 0 {
        t.health.ejected_until.store(1, Relaxed);
    }
}

#[test]
fn ejection_backs_off_doubling_to_the_cap_and_a_success_clears_it() {
    let routing = Routing::new();
    let m = model("unit-backoff", &[provider("unit-a", None)]);
    let t = routing.plan(&m, |_| true, 3).unwrap().remove(0);
    routing.failed(&t, Failure::ServerError, None, "r1");
    routing.failed(&t, Failure::Timeout(Wait::FirstByte), None, "r2");
    assert_eq!(ejected_for(&t), 0, "two failures eject nothing");
    routing.failed(&t, Failure::Connect, None, "r3");
    let left = ejected_for(&t);
    assert!((900..=1000).contains(&left), "first ejection 1 s: {left}");
    // While ejected, failures (panic-routed requests) do not extend it.
    routing.failed(&t, Failure::Connect, None, "r4");
    assert!(ejected_for(&t) <= 1000);
    // On probation one failure is enough; each ejection in a row doubles, up to the cap.
    for expected in [2000, 4000, 4000] {
        expire(&t);
        routing.failed(&t, Failure::ServerError, None, "r");
        let left = ejected_for(&t);
        assert!(
            (expected - 100..=expected).contains(&left),
            "{expected}: {left}"
        );
    }
    // A success (a panic-routed request) ends the ejection and clears the record.
    routing.succeeded(&t, "ok");
    assert_eq!(t.health.ejected_until.load(Relaxed), 0);
    assert_eq!(t.health.ejections.load(Relaxed), 0);
    routing.failed(&t, Failure::ServerError, None, "r");
    assert_eq!(
        ejected_for(&t),
        0,
        "back to three failures before an ejection"
    );
}

#[test]
fn retry_after_ejects_at_once_capped_by_max_cooldown() {
    let routing = Routing::new();
    let m = model("unit-retry", &[provider("unit-b", None)]);
    let t = routing.plan(&m, |_| true, 3).unwrap().remove(0);
    routing.failed(
        &t,
        Failure::RateLimited,
        Some(Duration::from_millis(1500)),
        "r",
    );
    let left = ejected_for(&t);
    assert!((1400..=1500).contains(&left), "{left}");
    routing.failed(&t, Failure::RateLimited, Some(Duration::from_secs(60)), "r");
    let left = ejected_for(&t);
    assert!((3900..=4000).contains(&left), "capped at 4 s: {left}");
}

#[test]
fn all_ejected_still_plans_the_one_that_recovers_first() {
    let routing = Routing::new();
    let (a, b, c) = (
        provider("unit-c", None),
        provider("unit-d", None),
        provider("unit-e", None),
    );
    let m = model("unit-panic", &[a, b, c]);
    let all = routing.plan(&m, |_| true, 3).unwrap();
    assert_eq!(all.len(), 3);
    assert_eq!(routing.plan(&m, |_| true, 2).unwrap().len(), 2, "bounded");
    let waits = [3000, 1000, 2000];
    for t in &all {
        let wait = waits[m
            .deployments
            .iter()
            .position(|d| d.label == t.label)
            .unwrap()];
        routing.failed(
            t,
            Failure::Overloaded,
            Some(Duration::from_millis(wait)),
            "r",
        );
    }
    let plan = routing.plan(&m, |_| true, 3).unwrap();
    assert_eq!(plan.len(), 1, "one attempt while all are ejected");
    assert_eq!(plan[0].label(), "unit-d/unit-panic");
}

#[test]
fn deployments_without_their_credential_are_never_planned() {
    let routing = Routing::new();
    let keyless = provider("unit-f", Some("UNIT_TEST_UNSET_KEY"));
    let m = model("unit-keys", &[keyless.clone(), provider("unit-g", None)]);
    for _ in 0..20 {
        let plan = routing.plan(&m, |_| true, 3).unwrap();
        assert_eq!(plan.len(), 1);
        assert_eq!(plan[0].label(), "unit-g/unit-keys");
    }
    let only = model("unit-keys-only", &[keyless]);
    let e = routing.plan(&only, |_| true, 3).unwrap_err();
    assert_eq!(e.code(), "routing_unavailable");
    assert!(e.message().contains("credential"), "{}", e.message());
    let e = routing.plan(&m, |_| false, 3).unwrap_err();
    assert!(e.message().contains("serves"), "{}", e.message());
}

#[test]
fn statuses_are_judged_by_what_they_say_about_the_provider() {
    for s in [200, 201, 204, 304] {
        assert_eq!(Verdict::of_status(s), Verdict::Ok, "{s}");
    }
    for s in [400, 404, 409, 413, 422] {
        assert_eq!(Verdict::of_status(s), Verdict::RequestError, "{s}");
    }
    for s in [401, 403] {
        assert_eq!(Verdict::of_status(s), Verdict::Failed(Failure::Credential));
    }
    assert_eq!(
        Verdict::of_status(429),
        Verdict::Failed(Failure::RateLimited)
    );
    assert_eq!(
        Verdict::of_status(529),
        Verdict::Failed(Failure::Overloaded)
    );
    for s in [500, 502, 503, 504] {
        assert_eq!(
            Verdict::of_status(s),
            Verdict::Failed(Failure::ServerError),
            "{s}"
        );
    }
}

#[test]
fn retry_after_reads_seconds_and_milliseconds_only_on_429_and_503() {
    let with = |name: &str, value: &str| crate::http1::Fields::of(&[(name, value)]);
    assert_eq!(
        retry_after(429, &with("retry-after", "2")),
        Some(Duration::from_secs(2))
    );
    assert_eq!(
        retry_after(503, &with("retry-after-ms", "1500")),
        Some(Duration::from_millis(1500))
    );
    assert_eq!(retry_after(500, &with("retry-after", "2")), None);
    assert_eq!(retry_after(429, &with("retry-after", "0")), None);
    assert_eq!(
        retry_after(429, &with("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT")),
        None
    );
    assert_eq!(retry_after(429, &with("retry-after", "-3")), None);
}

#[test]
fn two_choices_keeps_the_weight_ratio_without_load_and_avoids_a_loaded_one() {
    let mut rng = rand::rng();
    let weights = [3u64, 1];
    let weight = |e: &(usize, Arc<Health>)| weights[e.0];
    let idle = [(0, health(0)), (1, health(0))];
    let n = 20_000;
    let firsts = (0..n)
        .filter(|_| two_choices(&idle, weight, &mut rng) == 0)
        .count();
    let share = firsts as f64 / n as f64;
    assert!((0.72..0.78).contains(&share), "3:1 gives ~0.75: {share}");
    // In proportion to the weights (6 vs 2 outstanding): still the ratio.
    let even = [(0, health(6)), (1, health(2))];
    let firsts = (0..n)
        .filter(|_| two_choices(&even, weight, &mut rng) == 0)
        .count();
    let share = firsts as f64 / n as f64;
    assert!(
        (0.72..0.78).contains(&share),
        "even load keeps 3:1: {share}"
    );
    // The heavier one piles up requests beyond its weight: it loses every comparison.
    let piled = [(0, health(9)), (1, health(1))];
    assert!((0..1000).all(|_| two_choices(&piled, weight, &mut rng) == 1));
    // Among three, the piled-up one is taken only when it is not drawn against another.
    let weights3 = [1u64, 1, 1];
    let three = [(0, health(5)), (1, health(0)), (2, health(0))];
    assert!((0..1000).all(|_| two_choices(&three, |e| weights3[e.0], &mut rng) != 0));
}
