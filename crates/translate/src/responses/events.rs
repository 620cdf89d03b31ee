//! Writes the Responses event stream from what a provider's stream says, whichever style it
//! is: text, reasoning, a signature, function calls, usage and how it ended.
//!
//! One output item is open at a time; starting another kind closes it with its `…done`
//! events, as the OpenAI API itself streams. Every event carries `sequence_number`.

use bytes::Bytes;
use serde_json::{json, Value};

use super::{call_item, message_item, reasoning_item, response_object, set, usage};
use crate::{now_unix, random_id, sse_event};

/// The item being streamed.
enum Open {
    Reasoning {
        id: String,
        text: String,
        signature: Option<String>,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        /// The provider's handle for the call (block index or tool-call index).
        key: u64,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// How the answer ended.
pub(super) enum End<'a> {
    Completed,
    /// Cut by the output limit (`max_output_tokens`) or a content filter.
    Incomplete(&'static str),
    /// A provider error event, or a stream that broke off.
    Failed {
        code: &'a str,
        message: &'a str,
    },
}

#[derive(Default, Clone, Copy)]
pub(super) struct Counts {
    pub input: u64,
    pub cached: u64,
    pub output: u64,
    pub reasoning: u64,
}

pub(super) struct Writer {
    id: String,
    created: u64,
    model: String,
    seq: u64,
    started: bool,
    done: bool,
    output: Vec<Value>,
    open: Option<Open>,
    pub counts: Counts,
}

impl Writer {
    pub fn new(client_model: &str) -> Writer {
        Writer {
            id: random_id("resp_"),
            created: now_unix(),
            model: client_model.to_string(),
            seq: 0,
            started: false,
            done: false,
            output: Vec::new(),
            open: None,
            counts: Counts::default(),
        }
    }

    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The output items closed so far (every item, once the stream ended), taken out.
    pub fn take_output(&mut self) -> Vec<Value> {
        std::mem::take(&mut self.output)
    }

    /// Takes the provider's id for the response, until the first event is out.
    pub fn set_id(&mut self, provider_id: &str) {
        if !self.started && !provider_id.is_empty() {
            self.id = format!("resp_{provider_id}");
        }
    }

    fn event(&mut self, kind: &str, mut data: Value, out: &mut Vec<Bytes>) {
        set(&mut data, "type", json!(kind));
        set(&mut data, "sequence_number", json!(self.seq));
        self.seq += 1;
        out.push(sse_event(kind, &data));
    }

    fn snapshot(&self, status: &str) -> Value {
        let mut r = response_object(&self.id, self.created, &self.model, status);
        set(&mut r, "output", Value::Array(self.output.clone()));
        r
    }

    /// `response.created` and `response.in_progress`, once.
    pub fn start(&mut self, out: &mut Vec<Bytes>) {
        if self.started {
            return;
        }
        self.started = true;
        let r = self.snapshot("in_progress");
        self.event("response.created", json!({ "response": r }), out);
        self.event("response.in_progress", json!({ "response": r }), out);
    }

    fn index(&self) -> usize {
        self.output.len()
    }

    fn open_item(&mut self, open: Open, out: &mut Vec<Bytes>) {
        self.close(out);
        self.start(out);
        let index = self.index();
        let item = match &open {
            Open::Reasoning { id, .. } => json!({ "id": id, "type": "reasoning", "summary": [] }),
            Open::Message { id, .. } => {
                let mut m = message_item(id, "", "in_progress");
                set(&mut m, "content", json!([]));
                m
            }
            Open::Call {
                id, call_id, name, ..
            } => call_item(id, call_id, name, "", "in_progress"),
        };
        self.event(
            "response.output_item.added",
            json!({ "output_index": index, "item": item }),
            out,
        );
        match &open {
            Open::Reasoning { id, .. } => self.event(
                "response.reasoning_summary_part.added",
                json!({ "item_id": id, "output_index": index, "summary_index": 0,
                        "part": { "type": "summary_text", "text": "" } }),
                out,
            ),
            Open::Message { id, .. } => self.event(
                "response.content_part.added",
                json!({ "item_id": id, "output_index": index, "content_index": 0,
                        "part": { "type": "output_text", "text": "", "annotations": [] } }),
                out,
            ),
            Open::Call { .. } => {}
        }
        self.open = Some(open);
    }

    pub fn text(&mut self, delta: &str, out: &mut Vec<Bytes>) {
        if delta.is_empty() {
            return;
        }
        if !matches!(self.open, Some(Open::Message { .. })) {
            let id = super::item_id("msg_");
            self.open_item(
                Open::Message {
                    id,
                    text: String::new(),
                },
                out,
            );
        }
        let index = self.index();
        if let Some(Open::Message { id, text }) = &mut self.open {
            text.push_str(delta);
            let data = json!({ "item_id": id, "output_index": index, "content_index": 0,
                               "delta": delta, "logprobs": [] });
            self.event("response.output_text.delta", data, out);
        }
    }

    fn ensure_reasoning(&mut self, out: &mut Vec<Bytes>) {
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            let id = super::item_id("rs_");
            self.open_item(
                Open::Reasoning {
                    id,
                    text: String::new(),
                    signature: None,
                },
                out,
            );
        }
    }

    pub fn reasoning(&mut self, delta: &str, out: &mut Vec<Bytes>) {
        if delta.is_empty() {
            return;
        }
        self.ensure_reasoning(out);
        let index = self.index();
        if let Some(Open::Reasoning { id, text, .. }) = &mut self.open {
            text.push_str(delta);
            let data = json!({ "item_id": id, "output_index": index, "summary_index": 0,
                               "delta": delta });
            self.event("response.reasoning_summary_text.delta", data, out);
        }
    }

    /// The signature of the thinking being streamed; sent with the item's `done` event.
    pub fn signature(&mut self, sig: &str, out: &mut Vec<Bytes>) {
        if sig.is_empty() {
            return;
        }
        self.ensure_reasoning(out);
        if let Some(Open::Reasoning { signature, .. }) = &mut self.open {
            signature.get_or_insert_with(String::new).push_str(sig);
        }
    }

    pub fn call_start(&mut self, key: u64, call_id: &str, name: &str, out: &mut Vec<Bytes>) {
        let id = super::item_id("fc_");
        self.open_item(
            Open::Call {
                id,
                key,
                call_id: call_id.to_string(),
                name: name.to_string(),
                arguments: String::new(),
            },
            out,
        );
    }

    /// Arguments for the call the provider knows as `key`; a delta for a call that is no
    /// longer open cannot be placed any more and is dropped.
    pub fn call_args(&mut self, key: u64, delta: &str, out: &mut Vec<Bytes>) {
        if delta.is_empty() {
            return;
        }
        let index = self.index();
        match &mut self.open {
            Some(Open::Call {
                id,
                key: k,
                arguments,
                ..
            }) if *k == key => {
                arguments.push_str(delta);
                let data = json!({ "item_id": id, "output_index": index, "delta": delta });
                self.event("response.function_call_arguments.delta", data, out);
            }
            _ => log::debug!("dropping arguments for tool call {key} that is not open"),
        }
    }

    /// True when the call the provider knows as `key` is the open item.
    pub fn call_is_open(&self, key: u64) -> bool {
        matches!(&self.open, Some(Open::Call { key: k, .. }) if *k == key)
    }

    /// Closes the open item with its `…done` events.
    pub fn close(&mut self, out: &mut Vec<Bytes>) {
        let Some(open) = self.open.take() else {
            return;
        };
        let index = self.index();
        let item = match open {
            Open::Reasoning {
                id,
                text,
                signature,
            } => {
                let part = json!({ "type": "summary_text", "text": text });
                self.event(
                    "response.reasoning_summary_text.done",
                    json!({ "item_id": id, "output_index": index, "summary_index": 0, "text": text }),
                    out,
                );
                self.event(
                    "response.reasoning_summary_part.done",
                    json!({ "item_id": id, "output_index": index, "summary_index": 0, "part": part }),
                    out,
                );
                reasoning_item(&id, &text, signature.as_deref())
            }
            Open::Message { id, text } => {
                self.event(
                    "response.output_text.done",
                    json!({ "item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": [] }),
                    out,
                );
                self.event(
                    "response.content_part.done",
                    json!({ "item_id": id, "output_index": index, "content_index": 0,
                            "part": { "type": "output_text", "text": text, "annotations": [] } }),
                    out,
                );
                message_item(&id, &text, "completed")
            }
            Open::Call {
                id,
                call_id,
                name,
                arguments,
                ..
            } => {
                self.event(
                    "response.function_call_arguments.done",
                    json!({ "item_id": id, "output_index": index, "arguments": arguments }),
                    out,
                );
                call_item(&id, &call_id, &name, &arguments, "completed")
            }
        };
        self.event(
            "response.output_item.done",
            json!({ "output_index": index, "item": item }),
            out,
        );
        self.output.push(item);
    }

    /// The final event, once: `response.completed`, `response.incomplete` or
    /// `response.failed`, with the output and the provider's usage.
    pub fn end(&mut self, end: End<'_>, out: &mut Vec<Bytes>) {
        if self.done {
            return;
        }
        self.close(out);
        self.start(out);
        self.done = true;
        let c = self.counts;
        let (kind, status) = match end {
            End::Completed => ("response.completed", "completed"),
            End::Incomplete(_) => ("response.incomplete", "incomplete"),
            End::Failed { .. } => ("response.failed", "failed"),
        };
        let mut r = self.snapshot(status);
        set(
            &mut r,
            "usage",
            usage(c.input, c.cached, c.output, c.reasoning),
        );
        match end {
            End::Incomplete(reason) => {
                set(&mut r, "incomplete_details", json!({ "reason": reason }))
            }
            End::Failed { code, message } => {
                set(&mut r, "error", json!({ "code": code, "message": message }));
            }
            End::Completed => {}
        }
        self.event(kind, json!({ "response": r }), out);
    }
}
