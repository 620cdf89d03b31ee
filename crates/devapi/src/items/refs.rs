//! What a Responses request refers to that an earlier answer left behind: the previous
//! response, a conversation, items by id. Read while admission reads the body (from its tree,
//! or element by element for a large body), so a request that refers to nothing costs a few
//! lookups per input item and no more.

use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::pipeline::type_name;

/// Most ids one request may refer to (each is looked up).
pub const MAX_REFERENCES: usize = 1024;

/// The state a Responses request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refs {
    pub previous_response_id: Option<String>,
    /// The `conversation` id (`""` when the field names none).
    pub conversation: Option<String>,
    /// `background: true`.
    pub background: bool,
    /// The answer may be kept and referred to later (`store` is not `false`).
    pub store: bool,
    /// `item_reference` items (or items that are nothing but an `id`): position in `input`, id.
    pub items: Vec<(usize, String)>,
    /// `reasoning` items sent by id alone, without `encrypted_content`: OpenAI reads their
    /// content from its store, so they are references too.
    pub stored_reasoning: Vec<String>,
}

impl Default for Refs {
    fn default() -> Self {
        Refs {
            previous_response_id: None,
            conversation: None,
            background: false,
            store: true,
            items: Vec::new(),
            stored_reasoning: Vec::new(),
        }
    }
}

/// A present field: not absent and not `null`.
fn set(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_null())
}

impl Refs {
    /// Reads the top-level fields (`None`: absent).
    pub fn of_fields(
        previous_response_id: Option<&Value>,
        conversation: Option<&Value>,
        background: Option<&Value>,
        store: Option<&Value>,
    ) -> Result<Refs, ApiError> {
        let previous_response_id = match set(previous_response_id) {
            None => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                return Err(ApiError::InvalidParam {
                    code: "invalid_type",
                    param: "previous_response_id",
                    message: format!(
                        "Invalid type for 'previous_response_id': expected a string, but got {} \
                         instead.",
                        type_name(other)
                    ),
                })
            }
        };
        let conversation = set(conversation).map(|c| {
            let id = match c {
                Value::String(s) => Some(s.as_str()),
                other => other.get("id").and_then(Value::as_str),
            };
            id.unwrap_or_default().to_string()
        });
        Ok(Refs {
            previous_response_id,
            conversation,
            background: background == Some(&Value::Bool(true)),
            store: store != Some(&Value::Bool(false)),
            items: Vec::new(),
            stored_reasoning: Vec::new(),
        })
    }

    /// Reads a whole body's tree.
    pub fn of_tree(body: &Value) -> Result<Refs, ApiError> {
        let mut refs = Refs::of_fields(
            body.get("previous_response_id"),
            body.get("conversation"),
            body.get("background"),
            body.get("store"),
        )?;
        if let Some(Value::Array(items)) = body.get("input") {
            for (i, item) in items.iter().enumerate() {
                refs.item(i, item)?;
            }
        }
        Ok(refs)
    }

    /// Reads `input[index]`.
    pub fn item(&mut self, index: usize, item: &Value) -> Result<(), ApiError> {
        let Some(obj) = item.as_object() else {
            return Ok(());
        };
        let id = obj.get("id");
        match set(obj.get("type")) {
            Some(Value::String(t)) if t == "item_reference" => self.reference(index, id),
            // The untyped form of a reference: `{"id": …}` and no message fields.
            None if id.is_some() && !obj.contains_key("role") && !obj.contains_key("content") => {
                self.reference(index, id)
            }
            Some(Value::String(t))
                if t == "reasoning" && set(obj.get("encrypted_content")).is_none() =>
            {
                if let Some(Value::String(id)) = id {
                    self.count()?;
                    self.stored_reasoning.push(id.clone());
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Reads `input[index]` from its text, for an element too large to build as a tree: only
    /// the fields [`item`](Self::item) reads are built.
    pub fn raw_item(&mut self, index: usize, text: &str) -> Result<(), ApiError> {
        #[derive(serde::Deserialize)]
        struct Head<'a> {
            #[serde(default, rename = "type", borrow)]
            kind: Option<&'a RawValue>,
            #[serde(default, borrow)]
            id: Option<&'a RawValue>,
            #[serde(default, borrow)]
            role: Option<&'a RawValue>,
            #[serde(default, borrow)]
            content: Option<&'a RawValue>,
            #[serde(default, borrow)]
            encrypted_content: Option<&'a RawValue>,
        }
        if !text.starts_with('{') {
            return Ok(());
        }
        let Ok(head) = serde_json::from_str::<Head<'_>>(text) else {
            // Not an object of this shape (duplicate keys): the provider judges it.
            return Ok(());
        };
        let small = |r: Option<&RawValue>| -> Option<Value> {
            r.filter(|r| r.get().len() <= 4096)
                .and_then(|r| serde_json::from_str(r.get()).ok())
        };
        let mut obj = Map::new();
        let present = |r: Option<&RawValue>| r.is_some_and(|r| r.get() != "null");
        for (key, value) in [("type", small(head.kind)), ("id", small(head.id))] {
            if let Some(v) = value {
                obj.insert(key.into(), v);
            }
        }
        for (key, raw) in [
            ("role", head.role),
            ("content", head.content),
            ("encrypted_content", head.encrypted_content),
        ] {
            if present(raw) {
                obj.insert(key.into(), Value::Bool(true));
            }
        }
        self.item(index, &Value::Object(obj))
    }

    fn reference(&mut self, index: usize, id: Option<&Value>) -> Result<(), ApiError> {
        let Some(Value::String(id)) = id else {
            return Err(ApiError::InvalidParam {
                code: "missing_required_parameter",
                param: "input",
                message: format!("Missing required parameter: 'input[{index}].id'."),
            });
        };
        self.count()?;
        self.items.push((index, id.clone()));
        Ok(())
    }

    /// Refuses one reference more than [`MAX_REFERENCES`].
    fn count(&self) -> Result<(), ApiError> {
        if self.items.len() + self.stored_reasoning.len() >= MAX_REFERENCES {
            return Err(ApiError::InvalidParam {
                code: "too_many_references",
                param: "input",
                message: format!("A request may refer to at most {MAX_REFERENCES} items by id."),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn references_of_every_form_are_found() {
        let body = json!({"model": "m", "previous_response_id": "resp_1", "store": false,
            "background": true, "conversation": {"id": "conv_1"},
            "input": [
                "text",
                {"role": "user", "content": "hi", "id": "msg_client"},
                {"type": "item_reference", "id": "msg_1"},
                {"id": "fc_1"},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "x"},
                {"type": "reasoning", "id": "rs_3", "encrypted_content": null},
                {"type": "message", "id": "msg_2", "role": "assistant", "content": []}]});
        let refs = Refs::of_tree(&body).unwrap();
        assert_eq!(
            refs,
            Refs {
                previous_response_id: Some("resp_1".into()),
                conversation: Some("conv_1".into()),
                background: true,
                store: false,
                items: vec![(2, "msg_1".into()), (3, "fc_1".into())],
                stored_reasoning: vec!["rs_1".into(), "rs_3".into()],
            }
        );
        // Read from the elements' text, the same.
        let mut raw = Refs::of_fields(
            body.get("previous_response_id"),
            body.get("conversation"),
            body.get("background"),
            body.get("store"),
        )
        .unwrap();
        for (i, item) in body["input"].as_array().unwrap().iter().enumerate() {
            raw.raw_item(i, &item.to_string()).unwrap();
        }
        assert_eq!(raw, refs);

        let none = Refs::of_tree(&json!({"input": "hi", "store": true, "conversation": null}));
        assert_eq!(none.unwrap(), Refs::default());
    }

    #[test]
    fn malformed_references_are_refused() {
        for body in [
            json!({"previous_response_id": 5}),
            json!({"input": [{"type": "item_reference"}]}),
            json!({"input": [{"type": "item_reference", "id": 7}]}),
        ] {
            let e = Refs::of_tree(&body).unwrap_err();
            assert_eq!(e.status(), 400, "{body}");
        }
        let many: Vec<Value> = (0..=MAX_REFERENCES)
            .map(|n| json!({"type": "item_reference", "id": format!("msg_{n}")}))
            .collect();
        let e = Refs::of_tree(&json!({ "input": many })).unwrap_err();
        assert_eq!(e.code(), "too_many_references");
    }

    /// A reference padded past what a large body builds as a tree is still found.
    #[test]
    fn a_padded_reference_is_found_in_its_text() {
        let item = json!({"type": "item_reference", "pad": "x".repeat(300_000), "id": "resp_a"});
        let mut refs = Refs::default();
        refs.raw_item(0, &item.to_string()).unwrap();
        assert_eq!(refs.items, vec![(0, "resp_a".to_string())]);
    }
}
