//! Responses state across requests: a request's references to earlier answers are checked
//! against the account's own ids (and, for translated deployments, resolved into the items
//! the gateway kept) before anything is reserved; an answer's ids are recorded for the account
//! once it is relayed. The ids live in the item registry ([`gateway_core::response_items`]).
//!
//! On a deployment that serves `/v1/responses` itself, the provider keeps the responses: every
//! tenant's in the operator's one account. A reference (`previous_response_id`, an
//! `item_reference`, a reasoning item sent by id alone) is passed on only when the account was
//! answered with that id; `conversation` is never (the gateway serves no `/v1/conversations`),
//! nor `background: true` (a response the gateway does not see finish cannot be metered).
//!
//! On a translated deployment the gateway itself keeps the output items it issued (unless the
//! request said `store: false`), and an `item_reference` to one of them is replaced by the
//! item. The kept item is the item as the client received it, stored as its JSON text
//! ([`encode`]); one mechanism serves whole and streamed answers alike, because a streamed
//! item's id goes out in `response.output_item.added`, before its content exists, so no id
//! could carry its item.

mod refs;

use std::sync::Arc;

use serde_json::Value;

pub use refs::{Refs, MAX_REFERENCES};

use crate::error::ApiError;
use crate::pipeline::Admitted;
use crate::route::Endpoint;
use crate::routing::Target;
use crate::shape::Crossing;
use crate::state::SharedApiState;
use gateway_core::response_items::{Issued, IssuedId, Known};
use gateway_translate::responses::is_issued_item_id;

/// The largest item kept, as JSON text: a larger one is not kept, and a reference to it is
/// not found.
pub const MAX_ITEM_BYTES: usize = 1024 * 1024;

/// The kept form of an output item a translated answer issued: its JSON text, or `None` when
/// it is no item the gateway issues (an object with an issued id and a `type`) or is larger
/// than [`MAX_ITEM_BYTES`].
pub fn encode(item: &Value) -> Option<Arc<str>> {
    let id = item.get("id").and_then(Value::as_str)?;
    if !is_issued_item_id(id) || !item.get("type").is_some_and(Value::is_string) {
        return None;
    }
    let text = serde_json::to_string(item).ok()?;
    (text.len() <= MAX_ITEM_BYTES).then(|| Arc::from(text))
}

/// The item a reference resolves to, from its kept form: the item without its `id` (the
/// provider it goes to knows no such id). `None` for text that is no kept item.
pub fn decode(text: &str) -> Option<Value> {
    let mut item: Value = serde_json::from_str(text).ok()?;
    let obj = item.as_object_mut()?;
    obj.get("type").filter(|t| t.is_string())?;
    obj.remove("id");
    Some(item)
}

/// The output items of a translated answer, as the registry keeps them.
pub fn issued_items(items: &[Value]) -> Issued {
    let ids = items
        .iter()
        .filter_map(|item| {
            let kept = encode(item)?;
            let id = item.get("id").and_then(Value::as_str)?.to_string();
            Some(IssuedId {
                id,
                item: Some(kept),
            })
        })
        .collect();
    Issued { ids }
}

/// Checks what a Responses request refers to, before anything is reserved: refuses
/// `background` and `conversation`, refuses references to ids that are not the account's, and
/// for plans with translated deployments replaces each `item_reference` with the item it names
/// (re-checking the request's limits with them). Nothing to do for other endpoints and for
/// requests that refer to nothing.
pub async fn check(
    state: &SharedApiState,
    adm: &mut Admitted,
    targets: &[Target],
) -> Result<(), ApiError> {
    let Some(refs) = adm.refs.as_ref() else {
        return Ok(());
    };
    if refs.background {
        return Err(ApiError::InvalidParam {
            code: "unsupported_parameter",
            param: "background",
            message: "`background: true` is not supported: the gateway meters a response by \
                      relaying it to its end; send the request without `background`."
                .into(),
        });
    }
    if let Some(id) = &refs.conversation {
        return Err(ApiError::ConversationNotFound(id.clone()));
    }
    let translated = targets.iter().any(|t| {
        Crossing::of(Endpoint::Responses, &t.provider).is_some_and(|c| c != Crossing::Native)
    });
    // What to look up: the previous response (a translated deployment refuses it anyway),
    // then the items in `input` order.
    let mut ask: Vec<&str> = Vec::new();
    if !translated {
        ask.extend(refs.previous_response_id.as_deref());
    }
    for (index, id) in &refs.items {
        if translated && !is_issued_item_id(id) {
            return Err(ApiError::invalid(
                "invalid_request",
                format!(
                    "input[{index}] references item {:?}, which this gateway did not issue: on \
                     this model only output items of the gateway's own earlier answers can be \
                     referenced; send the item itself instead.",
                    crate::error::shown(id)
                ),
            ));
        }
        ask.push(id);
    }
    if !translated {
        ask.extend(refs.stored_reasoning.iter().map(String::as_str));
    }
    if ask.is_empty() {
        return Ok(());
    }
    let known = state
        .items
        .lookup(&adm.identity.user.id, &ask)
        .await
        .map_err(|e| {
            log::error!("response item lookup failed: {e}");
            ApiError::ServerError
        })?;
    let previous = usize::from(!translated && refs.previous_response_id.is_some());
    if let Some((at, id)) = ask
        .iter()
        .zip(&known)
        .enumerate()
        .find_map(|(at, (id, k))| k.is_none().then_some((at, *id)))
    {
        return Err(if at < previous {
            ApiError::PreviousResponseNotFound(id.to_string())
        } else {
            ApiError::ItemNotFound(id.to_string())
        });
    }
    if !translated {
        return Ok(());
    }
    // Each reference replaced by its item, in place.
    let items: Vec<(usize, String)> = refs.items.clone();
    let mut tree = adm.tree_for_rewrite()?.into_owned();
    let Some(Value::Array(input)) = tree.get_mut("input") else {
        return Err(ApiError::ServerError);
    };
    let mut inlined = Vec::with_capacity(items.len());
    for ((index, id), k) in items.iter().zip(known.iter().skip(previous)) {
        let item = match k {
            Some(Known::Item(text)) => decode(text),
            _ => None,
        };
        let (Some(item), Some(slot)) = (item, input.get_mut(*index)) else {
            return Err(ApiError::ItemNotFound(id.clone()));
        };
        inlined.push(item.clone());
        *slot = item;
    }
    let extra = state
        .tokens
        .estimate_input(&serde_json::json!({ "input": inlined }));
    adm.rewrite(tree, extra)
}

#[cfg(test)]
mod tests;
