//! Responses state across requests (CONTRACT §3: ids belong to the account that created them).
//!
//! On an OpenAI-style provider that serves `/v1/responses`, every tenant's stored responses
//! live in the operator's one provider account: a reference to a response or item is passed on
//! only for the account that was answered with it, on every instance and after a restart. On
//! translated models the gateway keeps the output items it issued and resolves references to
//! them. Count fields out of range never reach a provider.

mod common;

use common::responses::{last_upstream, options, responses_events};
use common::*;
use serde_json::{json, Value};

const ANSWER: &str = "Hello from the mock provider.";

async fn post(gw: &Gateway, key: &str, body: &Value) -> reqwest::Response {
    api::post_in_style(gw, "/v1/responses", key, body).await
}

/// The status and JSON body of an answer.
async fn answer(r: reqwest::Response) -> (u16, Value) {
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The final Responses object of a whole or streamed answer.
async fn response_of(r: reqwest::Response, stream: bool) -> Value {
    assert_eq!(r.status(), 200);
    let text = r.text().await.unwrap();
    if stream {
        let events = responses_events(&text);
        let last = events.last().expect("events").clone();
        assert_eq!(last["type"], "response.completed", "{text}");
        last["response"].clone()
    } else {
        serde_json::from_str(&text).unwrap()
    }
}

/// The usage events of one account (they are written in batches: give them time first).
async fn events_of(gw: &Gateway, user_id: &str) -> Vec<Value> {
    gw.usage_events()
        .await
        .into_iter()
        .filter(|e| e["user_id"] == user_id)
        .collect()
}

/// The ids the database records for `user_id` (written in batches: waits for `want`).
async fn stored_ids(gw: &Gateway, user_id: &str, want: &[&str]) -> Vec<String> {
    let db = gw.db().await;
    let mut ids = Vec::new();
    for _ in 0..200 {
        ids = sqlx::query_scalar::<_, String>("SELECT id FROM response_items WHERE user_id = $1")
            .bind(user_id)
            .fetch_all(&db.pool)
            .await
            .unwrap();
        if want.iter().all(|w| ids.iter().any(|i| i == w)) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    ids
}

/// Asserts a refusal's status and body, and that the provider saw nothing of it.
async fn refused(mock: &Mock, r: reqwest::Response, status: u16, want: Value) {
    let (s, v) = answer(r).await;
    assert_eq!((s, &v), (status, &want));
    assert!(mock.requests().await.is_empty(), "the provider saw it");
}

fn not_found_item(id: &str) -> Value {
    json!({"error": {"message": format!("Item with id '{id}' not found."),
        "type": "invalid_request_error", "param": "input", "code": null}})
}

fn not_found_response(id: &str) -> Value {
    json!({"error": {"message": format!("Previous response with id '{id}' not found."),
        "type": "invalid_request_error", "param": "previous_response_id",
        "code": "previous_response_not_found"}})
}

/// A user's request that refers to `refs` on model `model`, with a text padding the body past
/// `pad` bytes (a large body is read without a tree).
fn referring(model: &str, refs: Vec<Value>, pad: usize) -> Value {
    let mut input = vec![json!({"role": "user", "content": format!("hi{}", " ".repeat(pad))})];
    input.extend(refs);
    input.push(json!({"role": "user", "content": "and then?"}));
    json!({"model": model, "input": input})
}

/// A native model: the account that was answered may refer to the response and its items,
/// whole or streamed, on this instance at once, on a second instance sharing the database, and
/// after a restart; another account's references, a conversation and a background response are
/// refused as OpenAI refuses unknown ids, before the provider or the quota sees anything.
#[tokio::test]
async fn native_references_belong_to_the_account_that_was_answered() {
    let mock = Mock::start(&["--chunks", "3"]);
    let mut gw = Gateway::start(&mock, Options::default());
    let (alice_id, alice) = gw.user_and_key("alice@example.com");
    let (bob_id, bob) = gw.user_and_key("bob@example.com");

    // Alice's answers: one whole, one streamed, one not stored.
    let whole = response_of(
        post(&gw, &alice, &json!({"model": "mock-gpt", "input": "hi"})).await,
        false,
    )
    .await;
    let streamed = response_of(
        post(
            &gw,
            &alice,
            &json!({"model": "mock-gpt", "input": "hi", "stream": true}),
        )
        .await,
        true,
    )
    .await;
    let unstored = response_of(
        post(
            &gw,
            &alice,
            &json!({"model": "mock-gpt", "input": "hi", "store": false}),
        )
        .await,
        false,
    )
    .await;
    let id = |v: &Value| v["id"].as_str().unwrap().to_string();
    let item = |v: &Value| v["output"][0]["id"].as_str().unwrap().to_string();
    let (whole_id, whole_item) = (id(&whole), item(&whole));
    let (streamed_id, streamed_item) = (id(&streamed), item(&streamed));
    assert!(whole_id.starts_with("resp_mock_") && whole_item.starts_with("msg_mock_"));
    assert_ne!(whole_id, streamed_id);
    mock.clear().await;

    // Bob refers to Alice's ids every way there is: refused, the provider sees nothing.
    for prev in [&whole_id, &streamed_id] {
        let body = json!({"model": "mock-gpt", "input": "hi", "previous_response_id": prev});
        refused(
            &mock,
            post(&gw, &bob, &body).await,
            400,
            not_found_response(prev),
        )
        .await;
    }
    for (refs, pad) in [
        (vec![json!({"type": "item_reference", "id": whole_item})], 0),
        (vec![json!({"id": streamed_item})], 0),
        (
            vec![json!({"type": "reasoning", "id": whole_item, "summary": []})],
            0,
        ),
        // A large body, and a reference padded past what a large body builds as a tree.
        (
            vec![json!({"type": "item_reference", "id": whole_item})],
            300_000,
        ),
        (
            vec![json!({"type": "item_reference", "pad": "x".repeat(300_000), "id": whole_item})],
            0,
        ),
    ] {
        let wanted = refs[0]["id"].as_str().unwrap().to_string();
        let r = post(&gw, &bob, &referring("mock-gpt", refs, pad)).await;
        refused(&mock, r, 404, not_found_item(&wanted)).await;
    }
    for who in [&alice, &bob] {
        let body = json!({"model": "mock-gpt", "input": "hi", "conversation": {"id": "conv_1"}});
        let want = json!({"error": {"message": "Conversation with id 'conv_1' not found.",
            "type": "invalid_request_error", "param": "conversation", "code": null}});
        refused(&mock, post(&gw, who, &body).await, 404, want).await;
        let body = json!({"model": "mock-gpt", "input": "hi", "background": true});
        let (status, v) = answer(post(&gw, who, &body).await).await;
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (400, Some("unsupported_parameter"))
        );
        assert_eq!(v["error"]["param"], "background");
        assert!(mock.requests().await.is_empty());
    }
    // A response kept with `store: false` is nobody's, not even its own account's.
    let body = json!({"model": "mock-gpt", "input": "hi", "previous_response_id": id(&unstored)});
    refused(
        &mock,
        post(&gw, &alice, &body).await,
        400,
        not_found_response(&id(&unstored)),
    )
    .await;

    // Alice's own references pass, as she sent them, whole and streamed answers alike.
    for body in [
        json!({"model": "mock-gpt", "input": "next", "previous_response_id": whole_id}),
        json!({"model": "mock-gpt", "input": "next", "previous_response_id": streamed_id}),
        referring(
            "mock-gpt",
            vec![json!({"type": "item_reference", "id": streamed_item})],
            0,
        ),
        referring(
            "mock-gpt",
            vec![json!({"type": "item_reference", "id": whole_item})],
            300_000,
        ),
    ] {
        let r = post(&gw, &alice, &body).await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        let (path, sent) = last_upstream(&mock).await;
        assert_eq!((path.as_str(), &sent), ("/v1/responses", &body));
    }

    // A second instance on the same database knows Alice's newest answer at once.
    let fresh = response_of(
        post(&gw, &alice, &json!({"model": "mock-gpt", "input": "hi"})).await,
        false,
    )
    .await;
    let second = Gateway::start(
        &mock,
        Options {
            database_url: Some(gw.database_url.clone()),
            ..Options::default()
        },
    );
    let body = json!({"model": "mock-gpt", "input": "next", "previous_response_id": id(&fresh)});
    assert_eq!(post(&second, &alice, &body).await.status(), 200);
    let body = json!({"model": "mock-gpt", "input": "next", "previous_response_id": id(&fresh)});
    mock.clear().await;
    refused(
        &mock,
        post(&second, &bob, &body).await,
        400,
        not_found_response(&id(&fresh)),
    )
    .await;
    drop(second);

    // Written to the database: a restart keeps them.
    let mine = [
        whole_id.as_str(),
        whole_item.as_str(),
        streamed_id.as_str(),
        streamed_item.as_str(),
    ];
    let stored = stored_ids(&gw, &alice_id, &mine).await;
    assert!(
        mine.iter().all(|m| stored.iter().any(|s| s == m)),
        "{stored:?}"
    );
    assert!(!stored.contains(&id(&unstored)));
    gw.kill();
    gw.spawn();
    let body = json!({"model": "mock-gpt", "input": "next", "previous_response_id": whole_id});
    assert_eq!(post(&gw, &alice, &body).await.status(), 200);
    mock.clear().await;
    refused(
        &mock,
        post(&gw, &bob, &body).await,
        400,
        not_found_response(&whole_id),
    )
    .await;

    // Nothing Bob sent was reserved or charged: he has no usage at all, while Alice's served
    // requests are recorded (the second instance's last one may have died with it).
    gw.wait_usage(9).await;
    assert!(events_of(&gw, &alice_id).await.len() >= 9);
    assert_eq!(events_of(&gw, &bob_id).await, Vec::<Value>::new());
}

/// The counts that set how much a request generates are whole numbers from 0 to 2^32 - 1;
/// anything else is refused naming the field, in the client's error shape, before the provider
/// or the quota sees it.
#[tokio::test]
async fn count_fields_out_of_range_never_reach_the_provider() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, Options::default());
    let (user_id, key) = gw.user_and_key("counts@example.com");
    let chat = |field: &str, v: Value| {
        let mut b = json!({"model": "mock-gpt", "messages": [{"role": "user", "content": "hi"}]});
        b[field] = v;
        ("/v1/chat/completions", b)
    };
    let responses = |field: &str, v: Value| {
        let mut b = json!({"model": "mock-gpt", "input": "hi"});
        b[field] = v;
        ("/v1/responses", b)
    };
    let messages = |v: Value| {
        let b = json!({"model": "claude-mock", "max_tokens": v,
                       "messages": [{"role": "user", "content": "hi"}]});
        ("/alt/v1/messages", b)
    };
    let cases = [
        (
            chat("max_tokens", json!(-1)),
            "max_tokens",
            "integer_below_min_value",
        ),
        (
            chat("max_completion_tokens", json!(2.5)),
            "max_completion_tokens",
            "invalid_type",
        ),
        (
            chat("max_tokens", json!("100")),
            "max_tokens",
            "invalid_type",
        ),
        (
            chat("n", json!(4294967296u64)),
            "n",
            "integer_above_max_value",
        ),
        (
            chat("top_logprobs", json!(true)),
            "top_logprobs",
            "invalid_type",
        ),
        (
            responses("max_output_tokens", json!(1e300)),
            "max_output_tokens",
            "integer_above_max_value",
        ),
        (
            responses("max_output_tokens", json!(-5)),
            "max_output_tokens",
            "integer_below_min_value",
        ),
        (
            responses("max_tool_calls", json!([3])),
            "max_tool_calls",
            "invalid_type",
        ),
        (messages(json!(-1)), "max_tokens", "integer_below_min_value"),
        (
            messages(json!(99999999999u64)),
            "max_tokens",
            "integer_above_max_value",
        ),
    ];
    for ((path, body), field, code) in cases {
        let r = api::post_in_style(&gw, path, &key, &body).await;
        let (status, v) = answer(r).await;
        assert_eq!(status, 400, "{path} {body}");
        assert_eq!(v["error"]["code"], code, "{path} {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert_eq!(v["error"]["param"], field, "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(field),
            "{v}"
        );
        assert_eq!(
            v["type"] == "error",
            path.starts_with("/alt"),
            "the client's shape: {v}"
        );
    }
    assert!(
        mock.requests().await.is_empty(),
        "the provider saw a refused request"
    );
    // Whole numbers in range pass, integral floats included.
    let ok = chat("max_tokens", json!(16.0)).1;
    assert_eq!(
        api::post_in_style(&gw, "/v1/chat/completions", &key, &ok)
            .await
            .status(),
        200
    );
    gw.wait_usage(1).await;
    assert_eq!(
        events_of(&gw, &user_id).await.len(),
        1,
        "only the request that passed"
    );
}

/// The output items of turn 1 as the client got them.
async fn turn_one(gw: &Gateway, key: &str, model: &str, stream: bool, tools: bool) -> Vec<Value> {
    let mut body = json!({"model": model, "input": "weather in Paris?", "stream": stream});
    if tools {
        body["tools"] = json!([{"type": "function", "name": "get_weather", "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    }
    let done = response_of(post(gw, key, &body).await, stream).await;
    done["output"].as_array().unwrap().clone()
}

/// What each `item_reference` to turn 1's items must reach the provider as.
fn expected_history(model: &str, stream: bool, tools: bool) -> Value {
    let text = if tools {
        "Let me check."
    } else if stream {
        "tok0 tok1 tok2 "
    } else {
        ANSWER
    };
    match (model.starts_with("claude"), tools) {
        (true, false) => json!({"role": "assistant", "content": [{"type": "text", "text": text}]}),
        (true, true) => json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Let me think.", "signature": "sig-mock"},
            {"type": "text", "text": text},
            {"type": "tool_use", "id": "toolu_mock", "name": "get_weather", "input": {"city": "Paris"}}]}),
        (false, false) => json!({"role": "assistant", "content": text}),
        (false, true) => json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_mock", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}),
    }
}

/// A two-turn conversation and a two-step tool loop as the Vercel AI SDK runs them (`store`
/// unset, turn 2 sending turn 1's output back as `item_reference`s), on an Anthropic-style and
/// on a chat-only model, whole and streamed: the provider receives turn 1's message, function
/// call and signed thinking in place of the references.
#[tokio::test]
async fn translated_items_resolve_on_the_next_turn() {
    let mock = Mock::start(&["--chunks", "3"]);
    let gw = Gateway::start(&mock, options(&mock, ""));
    let key = gw.user_with_key("sdk@example.com", &[]);
    for (model, tools) in [
        ("claude-mock", false),
        ("gpt-chat-only", false),
        ("claude-think-tools", true),
        ("gpt-chat-tools", true),
    ] {
        for stream in [false, true] {
            let items = turn_one(&gw, &key, model, stream, tools).await;
            let kinds: Vec<&str> = items.iter().map(|i| i["type"].as_str().unwrap()).collect();
            let want: &[&str] = match (model, tools) {
                (_, false) => &["message"],
                ("claude-think-tools", _) => &["reasoning", "message", "function_call"],
                _ => &["function_call"],
            };
            assert_eq!(kinds, want, "{model} {stream}");
            let mut input = vec![json!({"role": "user", "content": "weather in Paris?"})];
            input.extend(
                items
                    .iter()
                    .map(|i| json!({"type": "item_reference", "id": i["id"]})),
            );
            let call = items.iter().find(|i| i["type"] == "function_call");
            if let Some(call) = call {
                input.push(json!({"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}));
            } else {
                input.push(json!({"role": "user", "content": "and then?"}));
            }
            let body = json!({"model": model, "input": input, "stream": stream});
            let r = post(&gw, &key, &body).await;
            assert_eq!(
                r.status(),
                200,
                "{model} {stream}: {}",
                r.text().await.unwrap()
            );
            let _ = r.bytes().await;
            let (_, sent) = last_upstream(&mock).await;
            let history = &sent["messages"];
            let question = match model.starts_with("claude") {
                true => json!([{"type": "text", "text": "weather in Paris?"}]),
                false => json!("weather in Paris?"),
            };
            assert_eq!(history[0]["content"], question, "{sent}");
            assert_eq!(
                history[1],
                expected_history(model, stream, tools),
                "{model} {stream}: {sent}"
            );
            let next = &history[2];
            if tools && model.starts_with("claude") {
                assert_eq!(next["content"][0]["type"], "tool_result", "{sent}");
            } else if tools {
                assert_eq!(
                    next,
                    &json!({"role": "tool", "tool_call_id": "call_mock", "content": "sunny"})
                );
            } else {
                assert_eq!(next["role"], "user", "{sent}");
            }
        }
    }
}

/// References on translated models: another account's item is not found, an id the gateway
/// never issued is a clear 400, an answer sent with `store: false` is not kept; none of them
/// reaches the provider. `store: true` is accepted.
#[tokio::test]
async fn translated_references_are_the_accounts_own_gateway_items() {
    let mock = Mock::start(&[]);
    let gw = Gateway::start(&mock, options(&mock, ""));
    let alice = gw.user_with_key("alice-t@example.com", &[]);
    let bob = gw.user_with_key("bob-t@example.com", &[]);
    for model in ["claude-mock", "gpt-chat-only"] {
        let mine = turn_one(&gw, &alice, model, false, false).await;
        let unstored = response_of(
            post(
                &gw,
                &alice,
                &json!({"model": model, "input": "hi", "store": false}),
            )
            .await,
            false,
        )
        .await;
        let kept = response_of(
            post(
                &gw,
                &alice,
                &json!({"model": model, "input": "hi", "store": true}),
            )
            .await,
            false,
        )
        .await;
        mock.clear().await;
        let reference =
            |id: &Value| referring(model, vec![json!({"type": "item_reference", "id": id})], 0);
        let id = mine[0]["id"].as_str().unwrap();
        refused(
            &mock,
            post(&gw, &bob, &reference(&mine[0]["id"])).await,
            404,
            not_found_item(id),
        )
        .await;
        let unkept = unstored["output"][0]["id"].as_str().unwrap();
        refused(
            &mock,
            post(&gw, &alice, &reference(&json!(unkept))).await,
            404,
            not_found_item(unkept),
        )
        .await;
        for never in [
            "msg_68b65c5082e48190a83636c52ee5de6508cd5796c3342f15",
            "msg_mock_1",
            "fc_x",
        ] {
            let (status, v) = answer(post(&gw, &alice, &reference(&json!(never))).await).await;
            assert_eq!(
                (status, v["error"]["code"].as_str()),
                (400, Some("invalid_request")),
                "{v}"
            );
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("did not issue"),
                "{v}"
            );
            assert!(mock.requests().await.is_empty());
        }
        // Alice's own, `store: true` included, resolve.
        for item in [&mine[0], &kept["output"][0]] {
            assert_eq!(
                post(&gw, &alice, &reference(&item["id"])).await.status(),
                200
            );
        }
    }
}
