//! TestStream (`beam:transform:teststream:v1`) as engine events.
//!
//! The SDK writes each scripted element with `coder.encode(value)`, i.e. in
//! the *outer* context of the TestStream's element coder. The engine moves
//! nested values in the (length-prefix-safe) coder of the output
//! PCollection, so every element is converted here, once, at translation.
//! Go's custom coder writes its values with their length prefix already
//! (see `coders.rs`): those bytes are the nested form as they are.

use std::collections::HashMap;

use bytes::Bytes;
use refract_engine::plan::{Plan, TestStreamEvent};
use refract_proto::pipeline as pb;
use refract_proto::prost::Message;

use crate::coders::Coders;
use crate::error::TranslateError;
use crate::graph::{sorted_by_tag, Node};

/// The decoded payload of TestStream `node`.
pub(crate) fn payload(node: &Node) -> Result<pb::TestStreamPayload, TranslateError> {
    let bytes = node
        .transform
        .spec
        .as_ref()
        .map_or(&[][..], |s| s.payload.as_slice());
    pb::TestStreamPayload::decode(bytes).map_err(|e| {
        TranslateError::bad_payload("TestStreamPayload", format!("transform '{}'", node.name), e)
    })
}

/// The engine events of TestStream `node`, whose outputs are in `plan`.
pub(crate) fn events(
    node: &Node,
    plan: &Plan,
    index: &HashMap<String, usize>,
    coders: &Coders,
) -> Result<Vec<TestStreamEvent>, TranslateError> {
    let location = format!("transform '{}'", node.name);
    let payload = payload(node)?;
    let prefixed_by_sdk = coders.is_go_custom(&payload.coder_id);
    let outputs = sorted_by_tag(&node.transform.outputs);
    // An event's tag names the output; with one output any tag means it.
    let only_output = match outputs.as_slice() {
        [(_, only)] => Some(only),
        _ => None,
    };
    let output_for = |tag: &str| -> Result<usize, TranslateError> {
        let pcoll = node
            .transform
            .outputs
            .get(tag)
            .or(only_output)
            .ok_or_else(|| {
                TranslateError::Invalid(format!(
                    "TestStream {location} has events for output '{tag}', which it does not have"
                ))
            })?;
        index
            .get(pcoll)
            .copied()
            .ok_or_else(|| TranslateError::missing("PCollection", pcoll, location.clone()))
    };
    let mut events = Vec::with_capacity(payload.events.len());
    for event in payload.events {
        use pb::test_stream_payload::event::Event;
        match event.event {
            Some(Event::ElementEvent(add)) => {
                let output = output_for(&add.tag)?;
                let coder = &plan.pcollections[output].value_coder;
                let elements = add
                    .elements
                    .iter()
                    .map(|e| {
                        let bytes = &e.encoded_element;
                        let nested = if prefixed_by_sdk {
                            // Already the nested form: exactly one
                            // length-prefixed value.
                            match coder.nested_len(bytes) {
                                Ok(n) if n == bytes.len() => Ok(bytes.clone()),
                                Ok(n) => Err(format!("{} bytes follow its value", bytes.len() - n)),
                                Err(err) => Err(err.to_string()),
                            }
                        } else {
                            coder.outer_to_nested(bytes).map_err(|err| err.to_string())
                        };
                        nested
                            .map(|nested| (Bytes::from(nested), e.timestamp))
                            .map_err(|err| {
                                TranslateError::Invalid(format!(
                                    "TestStream {location}: an element does not decode with its coder: {err}"
                                ))
                            })
                    })
                    .collect::<Result<_, _>>()?;
                events.push(TestStreamEvent::Elements { output, elements });
            }
            Some(Event::WatermarkEvent(w)) => {
                events.push(TestStreamEvent::Watermark(w.new_watermark))
            }
            Some(Event::ProcessingTimeEvent(p)) => {
                events.push(TestStreamEvent::ProcessingTime(p.advance_duration))
            }
            None => {}
        }
    }
    tracing::debug!(transform = %node.name, events = events.len(), "TestStream translated");
    Ok(events)
}
