//! Plan-building helpers shared by the engine's smaller test files.

#![allow(dead_code)]

use refract_engine::coder::Coder;
use refract_engine::plan::{PCollection, Stage, StageKind};

/// A bounded PCollection of `coder` values in the global window.
pub fn global_pcollection(id: &str, coder: Coder) -> PCollection {
    PCollection {
        id: id.into(),
        value_coder: coder,
        window_coder: Coder::GlobalWindow,
        bounded: true,
    }
}

/// A stage without side inputs.
pub fn stage(name: &str, kind: StageKind, inputs: Vec<usize>, outputs: Vec<usize>) -> Stage {
    Stage {
        name: name.into(),
        kind,
        inputs,
        side_inputs: vec![],
        outputs,
    }
}
