use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;

fn issued_id(prefix: &str, n: u128) -> String {
    format!("{prefix}{:024x}", n & ((1u128 << 96) - 1))
}

/// Output items of every kind a translated answer issues, with any text in them.
fn item() -> impl Strategy<Value = Value> {
    let text = any::<String>();
    let id = any::<u128>();
    prop_oneof![
        (id, text).prop_map(|(n, t)| json!({
            "id": issued_id("msg_", n), "type": "message", "status": "completed",
            "role": "assistant", "content": [{"type": "output_text", "text": t, "annotations": []}]})),
        (id, text, text).prop_map(|(n, name, args)| json!({
            "id": issued_id("fc_", n), "type": "function_call", "status": "completed",
            "call_id": format!("call_{name}"), "name": name, "arguments": args})),
        (id, text, text).prop_map(|(n, summary, sig)| json!({
            "id": issued_id("rs_", n), "type": "reasoning",
            "summary": [{"type": "summary_text", "text": summary}],
            "encrypted_content": format!("gw-anthropic-signature:{sig}")})),
    ]
}

proptest! {
    /// A kept item comes back as it was sent, without its id.
    #[test]
    fn kept_items_come_back_whole(item in item()) {
        let kept = encode(&item).expect("kept");
        let mut want = item.clone();
        want.as_object_mut().unwrap().remove("id");
        prop_assert_eq!(decode(&kept), Some(want));
        let issued = issued_items(std::slice::from_ref(&item));
        prop_assert_eq!(issued.ids.len(), 1);
        prop_assert_eq!(issued.ids[0].id.as_str(), item["id"].as_str().unwrap());
    }

    /// Any text at all decodes to an item or to nothing, never a panic.
    #[test]
    fn any_text_decodes_or_not(text in any::<String>()) {
        if let Some(v) = decode(&text) {
            prop_assert!(v["type"].is_string());
            prop_assert!(v.get("id").is_none());
        }
    }
}

#[test]
fn only_issued_items_within_the_bound_are_kept() {
    let ok = json!({"id": issued_id("msg_", 1), "type": "message", "content": []});
    assert!(encode(&ok).is_some());
    for not_ours in [
        json!({"id": "msg_68b65c5082e48190a83636c52ee5de6508cd5796c3342f15", "type": "message"}),
        json!({"id": issued_id("msg_", 1)}),
        json!({"id": issued_id("msg_", 1), "type": 3}),
        json!({"type": "message"}),
        json!([1]),
        json!("msg"),
    ] {
        assert!(encode(&not_ours).is_none(), "{not_ours}");
    }
    let big = json!({"id": issued_id("msg_", 2), "type": "message",
                     "content": [{"type": "output_text", "text": "x".repeat(MAX_ITEM_BYTES)}]});
    assert!(encode(&big).is_none());
    let issued = issued_items(&[ok.clone(), big, json!({"type": "message"})]);
    assert_eq!(issued.ids.len(), 1);
    for junk in ["", "null", "[]", "{}", "{\"type\":1}", "{\"id\":\"x\""] {
        assert_eq!(decode(junk), None, "{junk}");
    }
}
