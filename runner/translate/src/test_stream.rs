//! TestStream (`beam:transform:teststream:v1`) as engine events.
//!
//! Python and Java write each scripted element with `coder.encode(value)`,
//! i.e. in the *outer* context of the TestStream's element coder. The engine
//! moves nested values in the (length-prefix-safe) coder of the output
//! PCollection, so every element is converted here, once, at translation.
//! The Go SDK has one encoding for values, the nested one (a string carries
//! its length, a custom coder's blob its prefix: see `coders.rs`), so a Go
//! TestStream's element bytes are the nested form as they are.

use std::collections::HashMap;

use bytes::Bytes;
use refract_engine::coder::{encode_varint_u64, Coder};
use refract_engine::plan::{PCollectionIdx, Plan, TestStreamEvent};
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

/// The engine events of TestStream `node`, whose outputs are in `plan`;
/// `from_go` says the Go SDK wrote it.
pub(crate) fn events(
    node: &Node,
    plan: &Plan,
    index: &HashMap<String, PCollectionIdx>,
    coders: &Coders,
    from_go: bool,
) -> Result<Vec<TestStreamEvent>, TranslateError> {
    let location = format!("transform '{}'", node.name);
    let payload = payload(node)?;
    let nested_by_sdk = from_go || coders.is_go_custom(&payload.coder_id);
    let outputs = sorted_by_tag(&node.transform.outputs);
    // An event's tag names the output; with one output any tag means it.
    let only_output = match outputs.as_slice() {
        [(_, only)] => Some(only),
        _ => None,
    };
    let output_for = |tag: &str| -> Result<PCollectionIdx, TranslateError> {
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
                        let nested = if nested_by_sdk {
                            let mut nested = Vec::with_capacity(bytes.len() + 2);
                            go_value_to_engine(coders, &payload.coder_id, coder, bytes, &mut nested)
                                .map(|()| nested)
                        } else {
                            coder.outer_to_nested(bytes).map_err(|err| err.to_string())
                        };
                        nested
                            .map(|nested| (Bytes::from(nested), e.timestamp))
                            .map_err(|err| {
                                TranslateError::Invalid(format!(
                                    "TestStream {location}: an element does not decode with its coder \
                                     ({coder:?}): {err}; its bytes: {}",
                                    hex_preview(bytes)
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

/// Writes to `out` the engine's nested form of `bytes`, one Go SDK value:
/// the nested encoding of the SDK's coder `sdk`, which the engine sees as
/// `engine` (the same tree, with the coders it does not know, such as Go's
/// schema rows, standing as opaque length-prefixed blobs). Known coders
/// keep their bytes; an unknown one gets the prefix the engine's blob has,
/// unless Go wrote one already (its custom coder, or a length prefix).
fn go_value_to_engine(
    coders: &Coders,
    sdk: &str,
    engine: &Coder,
    bytes: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), String> {
    match engine {
        Coder::LengthPrefix if !coders.writes_length_prefix(sdk) => {
            encode_varint_u64(bytes.len() as u64, out);
            out.extend_from_slice(bytes);
            Ok(())
        }
        Coder::Kv(key, value) => {
            let [key_id, value_id] = coders
                .get(sdk, "a TestStream element")
                .map(|c| c.component_coder_ids.as_slice())
                .map_err(|e| e.to_string())?
            else {
                return Err(format!("its coder '{sdk}' is not a two-component KV coder"));
            };
            if matches!(**key, Coder::LengthPrefix) && !coders.writes_length_prefix(key_id) {
                return Err(format!(
                    "its key's coder '{key_id}' is unknown to the runner, which cannot find where the key ends"
                ));
            }
            let key_len = key.nested_len(bytes).map_err(|e| e.to_string())?;
            out.extend_from_slice(&bytes[..key_len]);
            go_value_to_engine(coders, value_id, value, &bytes[key_len..], out)
        }
        _ => match engine.nested_len(bytes) {
            Ok(n) if n == bytes.len() => {
                out.extend_from_slice(bytes);
                Ok(())
            }
            Ok(n) => Err(format!("{} bytes follow its value", bytes.len() - n)),
            Err(err) => Err(err.to_string()),
        },
    }
}

/// Up to 32 bytes of `bytes` in hex, for error messages.
fn hex_preview(bytes: &[u8]) -> String {
    const SHOWN: usize = 32;
    let mut text: String = bytes
        .iter()
        .take(SHOWN)
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ");
    if bytes.len() > SHOWN {
        text.push_str(&format!(" ... ({} bytes)", bytes.len()));
    }
    text
}
