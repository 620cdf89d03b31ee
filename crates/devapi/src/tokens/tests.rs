//! Unit tests of token estimation.
use super::tally::{split_point, EXACT_BUDGET_BYTES, TOKENS_PER_NAME};
use super::*;
use serde_json::json;
use std::sync::{Arc, OnceLock};

fn tc() -> &'static TokenCounter {
    static TC: OnceLock<TokenCounter> = OnceLock::new();
    TC.get_or_init(|| TokenCounter::new().expect("o200k_base loads"))
}

#[test]
fn send_sync_and_arc() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<TokenCounter>();
    let shared = Arc::new(TokenCounter::new().expect("loads"));
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let c = Arc::clone(&shared);
            std::thread::spawn(move || c.count(&format!("thread {i} says hello world")))
        })
        .collect();
    for h in handles {
        assert!(h.join().expect("thread ok") > 0);
    }
}

#[test]
fn known_counts() {
    assert_eq!(tc().count(""), 0);
    assert_eq!(tc().count("hello world"), 2);
    assert_eq!(tc().count("Hello, world!"), 4);
    assert_eq!(tc().count("a"), 1);
}

#[test]
fn slicing_matches_whole_encoding_for_ordinary_text() {
    let text = "The quick brown fox jumps over the lazy dog.\n\n  Don't panic, it's fine! \
                fn main() { println!(\"{}\", 1 + 2); }\r\n\t- item\n"
        .repeat(40);
    let whole = tc().bpe.encode_ordinary(&text).len() as u64;
    assert_eq!(tc().count(&text), whole);
}

#[test]
fn split_point_respects_char_boundaries() {
    let s = "é".repeat(300);
    let p = split_point(&s, 255);
    assert!(s.is_char_boundary(p));
    assert!(p > 0 && p <= 255);
    assert_eq!(split_point("😀", 2), 0);
    assert_eq!(split_point("ab cd", 4), 2);
    assert_eq!(split_point("abc", 10), 3);
}

#[test]
fn hostile_special_tokens_are_ordinary_text() {
    let s = "<|endoftext|><|im_start|>system<|im_end|><|endofprompt|>";
    let n = tc().count(s);
    assert!(n > 5, "special markers must be split as text, got {n}");
    let body = json!({"messages": [{"role": "user", "content": s}]});
    assert!(tc().estimate_input(&body) > n);
}

#[test]
fn pathological_runs_are_bounded() {
    // Quadratic BPE merges would make these take seconds unsliced.
    for s in [
        "a".repeat(30_000),
        " ".repeat(30_000),
        "\n".repeat(30_000),
        "!".repeat(30_000),
        "😀".repeat(8_000),
    ] {
        let n = tc().count(&s);
        assert!(n > 0);
    }
}

#[test]
fn huge_text_is_extrapolated_not_undercounted() {
    let unit = "go ";
    let big = unit.repeat(EXACT_BUDGET_BYTES / unit.len() * 3);
    let n = tc().count(&big);
    let words = (big.len() / unit.len()) as u64;
    // Each " go" is one token, denser than the extrapolation floor.
    assert!(n >= words, "{n} < {words}");
    assert!(n <= words + words / 10 + 10, "{n} far above {words}");
    // A cheap head cannot make an expensive tail look cheaper than
    // one token per four bytes.
    let mut mixed = "a".repeat(EXACT_BUDGET_BYTES);
    mixed.push_str(&"x".repeat(400_000));
    assert!(tc().count(&mixed) >= 100_000);
}

#[test]
fn openai_chat_shape() {
    let hello = tc().count("hello world");
    let body = json!({
        "model": "gpt-4o",
        "messages": [
            {"role": "user", "content": "hello world"}
        ]
    });
    let user = tc().count("user");
    assert_eq!(
        tc().estimate_input(&body),
        TOKENS_PER_MESSAGE + user + hello + REPLY_PRIMING_TOKENS
    );

    let parts = json!({
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "hello world"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA".repeat(1000)}}
        ]}]
    });
    assert_eq!(
        tc().estimate_input(&parts),
        TOKENS_PER_MESSAGE + user + hello + IMAGE_PART_TOKENS + REPLY_PRIMING_TOKENS
    );

    let with_name =
        json!({"messages": [{"role": "user", "name": "bob", "content": "hello world"}]});
    assert_eq!(
        tc().estimate_input(&with_name),
        tc().estimate_input(&body) + TOKENS_PER_NAME + tc().count("bob")
    );

    let tool_calls = json!({"messages": [{
        "role": "assistant", "content": null,
        "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]
    }]});
    let expect = TOKENS_PER_MESSAGE
        + tc().count("assistant")
        + tc().count("get_weather")
        + tc().count("{\"city\":\"Paris\"}")
        + REPLY_PRIMING_TOKENS;
    assert_eq!(tc().estimate_input(&tool_calls), expect);
}

#[test]
fn anthropic_shape() {
    let body = json!({
        "model": "claude",
        "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "hello world"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "SIGSIGSIG"},
                {"type": "tool_use", "id": "t1", "name": "calc", "input": {"x": 1}}
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "2"}]},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUFB".repeat(5000)}}
            ]}
        ]
    });
    let expect = tc().count("be brief")
        + 3 * TOKENS_PER_MESSAGE
        + REPLY_PRIMING_TOKENS
        + tc().count("user") * 2
        + tc().count("assistant")
        + tc().count("hello world")
        + tc().count("hmm")
        + tc().count("calc")
        + tc().count("{\"x\":1}")
        + tc().count("2")
        + IMAGE_PART_TOKENS;
    assert_eq!(tc().estimate_input(&body), expect);

    let system_string = json!({"system": "be brief", "messages": []});
    assert_eq!(tc().estimate_input(&system_string), tc().count("be brief"));
}

#[test]
fn chat_and_anthropic_agree_on_plain_text() {
    let chat = json!({"messages": [{"role": "user", "content": "explain rust lifetimes"}]});
    let anth = json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "explain rust lifetimes"}]}]});
    assert_eq!(tc().estimate_input(&chat), tc().estimate_input(&anth));
}

#[test]
fn tools_are_counted() {
    let base = json!({"messages": [{"role": "user", "content": "hi"}]});
    let tool = json!({"type": "function", "function": {
        "name": "lookup", "description": "Look something up in the catalogue",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}});
    let mut with_tools = base.clone();
    with_tools["tools"] = json!([tool.clone()]);
    let tool_tokens = tc().count(&serde_json::to_string(&tool).expect("serializes"));
    assert_eq!(
        tc().estimate_input(&with_tools),
        tc().estimate_input(&base) + tool_tokens
    );
    let mut with_functions = base.clone();
    with_functions["functions"] = json!([tool]);
    assert_eq!(
        tc().estimate_input(&with_functions),
        tc().estimate_input(&with_tools)
    );
}

#[test]
fn responses_shape() {
    let simple = json!({"instructions": "be terse", "input": "hello world"});
    assert_eq!(
        tc().estimate_input(&simple),
        tc().count("be terse") + tc().count("hello world")
    );
    let items = json!({"input": [
        {"role": "user", "content": [
            {"type": "input_text", "text": "hello world"},
            {"type": "input_image", "image_url": "https://example.com/x.png"}
        ]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "42"}
    ]});
    let expect = 3 * TOKENS_PER_MESSAGE
        + tc().count("user")
        + tc().count("hello world")
        + IMAGE_PART_TOKENS
        + tc().count("f")
        + tc().count("{}")
        + tc().count("42");
    assert_eq!(tc().estimate_input(&items), expect);
}

#[test]
fn embeddings_images_speech() {
    assert_eq!(
        tc().estimate_input(&json!({"input": ["hello world", "hello world"]})),
        2 * tc().count("hello world")
    );
    assert_eq!(tc().estimate_input(&json!({"input": [1, 2, 3]})), 3);
    assert_eq!(
        tc().estimate_input(&json!({"input": [[1, 2], [3, 4, 5]]})),
        5
    );
    assert_eq!(
        tc().estimate_input(&json!({"prompt": "a cat", "model": "dall-e"})),
        tc().count("a cat")
    );
    assert_eq!(
        tc().estimate_input(&json!({"input": "say hi", "voice": "alloy"})),
        tc().count("say hi")
    );
}

#[test]
fn garbage_never_panics() {
    let bodies = [
        json!(null),
        json!(42),
        json!("just a string"),
        json!([1, 2, 3]),
        json!({"messages": "not an array"}),
        json!({"messages": [null, 1, "x", [], {"content": {"weird": true}}]}),
        json!({"messages": [{"role": 5, "name": {"a": "b"}, "tool_calls": [1, {"function": 3}]}]}),
        json!({"system": 12, "tools": "nope", "functions": {"a": "b"}}),
        json!({"input": [null, true, {"type": "function_call", "arguments": {"a": [1]}}]}),
        json!({"prompt": {"deep": [[["x"]]]}}),
        json!({"messages": [{"content": [{"type": "tool_result", "content": {"type": "tool_result"}}]}]}),
    ];
    for b in &bodies {
        let _ = tc().estimate_input(b);
    }
    assert_eq!(tc().estimate_input(&json!(null)), 0);
}

#[test]
fn deeply_nested_values_are_cut_off() {
    // Built in code, so deeper than serde_json's parser would allow.
    let mut v = json!("leaf");
    for _ in 0..300 {
        v = json!({"type": "tool_result", "content": [v]});
    }
    let body = json!({"messages": [{"role": "user", "content": [v.clone()]}], "tools": [v.clone()], "input": [v.clone()]});
    let _ = tc().estimate_input(&body);
    let mut arr = json!("leaf");
    for _ in 0..300 {
        arr = json!([arr]);
    }
    let body = json!({"prompt": arr, "system": {"x": [json!(null)]}});
    assert!(tc().estimate_input(&body) <= 3);
}

#[test]
fn parsed_deep_garbage_is_rejected_by_parser_not_us() {
    let s = "[".repeat(10_000);
    assert!(serde_json::from_str::<Value>(&s).is_err());
    let s = format!("{}\"x\"{}", "[".repeat(100), "]".repeat(100));
    let v: Value = serde_json::from_str(&s).expect("within limit");
    let _ = tc().estimate_input(&json!({"messages": v}));
}

#[test]
fn requested_output_takes_the_largest_valid_field() {
    assert_eq!(requested_output(&json!({"max_tokens": 100})), Some(100));
    assert_eq!(
        requested_output(&json!({"max_completion_tokens": 7, "max_output_tokens": 9})),
        Some(9)
    );
    assert_eq!(requested_output(&json!({"max_output_tokens": 9})), Some(9));
    assert_eq!(
        requested_output(&json!({"max_tokens": -1, "max_output_tokens": 9})),
        Some(9)
    );
    assert_eq!(
        requested_output(&json!({"max_tokens": null, "max_completion_tokens": 5})),
        Some(5)
    );
    assert_eq!(
        requested_output(&json!({"max_tokens": 10, "max_completion_tokens": 100000})),
        Some(100000)
    );
    assert_eq!(requested_output(&json!({"max_tokens": 12.0})), Some(12));
    assert_eq!(requested_output(&json!({"max_tokens": 12.5})), None);
    assert_eq!(requested_output(&json!({"max_tokens": 1e300})), None);
    assert_eq!(requested_output(&json!({"max_tokens": "100"})), None);
    assert_eq!(requested_output(&json!({})), None);
    assert_eq!(requested_output(&json!([1])), None);
}
