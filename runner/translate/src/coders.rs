//! Coder safety: making every byte that crosses the Fn API walkable by the
//! runner, and the runner's view ([`Coder`]) of those bytes.
//!
//! The runner must find element boundaries, keys, windows and timestamps in
//! bytes an SDK wrote, but it understands only a few standard coders. So,
//! like Python's FnApiRunner (`maybe_length_prefixed_and_safe_coder`), every
//! coder of a PCollection that crosses a stage boundary is rewritten:
//! - a coder whose URN the runner and every environment know keeps its URN,
//!   with its components rewritten recursively;
//! - anything else — including unknown composites such as Python's `tuple`,
//!   and `row` — is wrapped whole in `length_prefix`, which the SDK still
//!   decodes and the runner treats as opaque bytes;
//! - a window coder the runner does not know becomes
//!   `custom_window[length_prefix(original)]`, so each window carries its max
//!   timestamp in front of the opaque bytes.
//!
//! The engine's [`Coder`] is then derived from the *same* rewritten coder, so
//! both sides agree byte for byte.
//!
//! The Go SDK's `beam:go:coder:custom:v1` is opaque yet self-delimiting: Go
//! writes each value as a varint length and the bytes, and reads
//! `length_prefix[custom]` as the custom coder alone (a bare custom coder on
//! a PCollection it refuses). So it is wrapped like any unknown coder, and
//! `length_prefix[custom]` and `custom` count as one encoding: a Go
//! TestStream names the bare custom coder, its output the wrapped one
//! ([`Coders::is_go_custom`] tells the TestStream its bytes need no prefix).

use std::collections::{BTreeSet, HashMap, HashSet};

use refract_engine::coder::Coder;
use refract_proto::pipeline as pb;
use refract_proto::urns::coder as c;

use crate::error::TranslateError;

/// Coder URNs the runner always relies on (Python's `_REQUIRED_CODER_URNS`).
const ALWAYS_KNOWN: &[&str] = &[
    c::WINDOWED_VALUE,
    c::BYTES,
    c::GLOBAL_WINDOW,
    c::KV,
    c::ITERABLE,
    c::DOUBLE,
    c::TIMER,
    c::LENGTH_PREFIX,
    c::CUSTOM_WINDOW,
];

/// Coder URNs the runner can walk, but relies on only when every environment
/// declares them in its capabilities.
const KNOWN_IF_DECLARED: &[&str] = &[
    c::STRING_UTF8,
    c::VARINT,
    c::BOOL,
    c::INTERVAL_WINDOW,
    c::NULLABLE,
];

/// How many components a known coder URN has.
fn arity(urn: &str) -> usize {
    match urn {
        c::KV | c::WINDOWED_VALUE | c::TIMER => 2,
        c::ITERABLE | c::NULLABLE | c::CUSTOM_WINDOW | c::LENGTH_PREFIX => 1,
        _ => 0,
    }
}

/// Content of a coder, used to reuse an existing coder instead of adding a
/// duplicate.
type CoderKey = (String, Vec<u8>, Vec<String>);

fn key_of(coder: &pb::Coder) -> CoderKey {
    let (urn, payload) = coder
        .spec
        .as_ref()
        .map(|s| (s.urn.clone(), s.payload.clone()))
        .unwrap_or_default();
    (urn, payload, coder.component_coder_ids.clone())
}

/// The pipeline's coders, plus the ones translation adds.
pub(crate) struct Coders {
    map: HashMap<String, pb::Coder>,
    known: HashSet<&'static str>,
    index: HashMap<CoderKey, String>,
    safe_memo: HashMap<String, String>,
    window_memo: HashMap<String, String>,
}

impl Coders {
    /// Takes over the pipeline's coders, refusing any that contains itself
    /// or nests deeper than `max_depth` ([`check_structure`]). Which
    /// optional standard coders count as known depends on the
    /// capabilities of *all* environments.
    pub(crate) fn new(
        map: HashMap<String, pb::Coder>,
        environments: &HashMap<String, pb::Environment>,
        max_depth: usize,
    ) -> Result<Self, TranslateError> {
        check_structure(&map, max_depth)?;
        let mut known: HashSet<&'static str> = ALWAYS_KNOWN.iter().copied().collect();
        for urn in KNOWN_IF_DECLARED {
            if environments
                .values()
                .all(|env| env.capabilities.iter().any(|cap| cap == urn))
            {
                known.insert(urn);
            }
        }
        let mut ids: Vec<&String> = map.keys().collect();
        ids.sort();
        let mut index = HashMap::new();
        for id in ids {
            if let Some(coder) = map.get(id) {
                index.entry(key_of(coder)).or_insert_with(|| id.clone());
            }
        }
        Ok(Coders {
            map,
            known,
            index,
            safe_memo: HashMap::new(),
            window_memo: HashMap::new(),
        })
    }

    /// The coder `id`, or an error naming `referrer`.
    pub(crate) fn get(&self, id: &str, referrer: &str) -> Result<&pb::Coder, TranslateError> {
        self.map
            .get(id)
            .ok_or_else(|| TranslateError::missing("coder", id, referrer))
    }

    /// The URN of coder `id`.
    pub(crate) fn urn(&self, id: &str, referrer: &str) -> Result<&str, TranslateError> {
        Ok(self
            .get(id, referrer)?
            .spec
            .as_ref()
            .map_or("", |s| s.urn.as_str()))
    }

    /// Whether two coder ids describe the same encoding (same URNs,
    /// payloads and, recursively, components), whatever their ids. Each
    /// pair of ids is compared once, so coders that share components cost
    /// what their distinct pairs do, not what their paths do.
    pub(crate) fn same_encoding(&self, a: &str, b: &str) -> bool {
        let mut compared: HashSet<(&str, &str)> = HashSet::new();
        let mut todo: Vec<(&str, &str)> = vec![(a, b)];
        while let Some((a, b)) = todo.pop() {
            let (a, b) = (self.unwrap_go_custom(a), self.unwrap_go_custom(b));
            if a == b || !compared.insert((a, b)) {
                continue;
            }
            let (Some(x), Some(y)) = (self.map.get(a), self.map.get(b)) else {
                return false;
            };
            let same_spec = x.spec.as_ref().map(|s| (&s.urn, &s.payload))
                == y.spec.as_ref().map(|s| (&s.urn, &s.payload));
            if !same_spec || x.component_coder_ids.len() != y.component_coder_ids.len() {
                return false;
            }
            todo.extend(
                x.component_coder_ids
                    .iter()
                    .zip(&y.component_coder_ids)
                    .map(|(ca, cb)| (ca.as_str(), cb.as_str())),
            );
        }
        true
    }

    /// The URN of coder `id`, if the table has it.
    fn urn_of(&self, id: &str) -> Option<&str> {
        let spec = self.map.get(id)?.spec.as_ref()?;
        Some(spec.urn.as_str())
    }

    /// Whether coder `id` is Go's custom coder, bare or length-prefixed:
    /// its values are written with their length prefix already.
    pub(crate) fn is_go_custom(&self, id: &str) -> bool {
        self.urn_of(self.unwrap_go_custom(id)) == Some(c::GO_CUSTOM)
    }

    /// Whether the values of coder `id` carry their own length prefix (a
    /// length-prefix coder, or Go's custom coder): the runner can skip one
    /// without knowing what is inside.
    pub(crate) fn writes_length_prefix(&self, id: &str) -> bool {
        matches!(self.urn_of(id), Some(c::LENGTH_PREFIX | c::GO_CUSTOM))
    }

    /// The Go custom coder `id` wraps, if `id` is `length_prefix[custom]`
    /// (the same encoding, see the module docs); else `id`.
    fn unwrap_go_custom<'a>(&'a self, id: &'a str) -> &'a str {
        match self
            .map
            .get(id)
            .map(|coder| coder.component_coder_ids.as_slice())
        {
            Some([inner])
                if self.urn_of(id) == Some(c::LENGTH_PREFIX)
                    && self.urn_of(inner) == Some(c::GO_CUSTOM) =>
            {
                inner
            }
            _ => id,
        }
    }

    /// The components of coder `id`, checked to be `urn` with `n` components.
    pub(crate) fn components_of(
        &self,
        id: &str,
        urn: &str,
        referrer: &str,
    ) -> Result<Vec<String>, TranslateError> {
        let coder = self.get(id, referrer)?;
        let actual = coder.spec.as_ref().map_or("", |s| s.urn.as_str());
        if actual != urn || coder.component_coder_ids.len() != arity(urn) {
            return Err(TranslateError::unsupported(
                format!(
                    "coder '{id}' ('{actual}' with {} components) where a '{urn}' coder is required",
                    coder.component_coder_ids.len()
                ),
                referrer,
            ));
        }
        Ok(coder.component_coder_ids.clone())
    }

    /// Adds a coder with this content (or returns an existing identical one),
    /// under an id derived from `base`.
    pub(crate) fn add(&mut self, base: &str, urn: &str, components: Vec<String>) -> String {
        self.intern(
            base,
            pb::Coder {
                spec: Some(pb::FunctionSpec {
                    urn: urn.to_string(),
                    payload: Vec::new(),
                }),
                component_coder_ids: components,
            },
        )
    }

    /// Adds a copy of coder `id` with other components.
    fn add_like(
        &mut self,
        id: &str,
        base: &str,
        components: Vec<String>,
    ) -> Result<String, TranslateError> {
        let mut coder = self.get(id, "a coder rewrite")?.clone();
        coder.component_coder_ids = components;
        Ok(self.intern(base, coder))
    }

    /// The id of a coder identical to `coder`, adding it under an id derived
    /// from `base` if there is none.
    fn intern(&mut self, base: &str, coder: pb::Coder) -> String {
        let key = key_of(&coder);
        if let Some(existing) = self.index.get(&key) {
            return existing.clone();
        }
        let id = unique_id(base, |candidate| self.map.contains_key(candidate));
        self.map.insert(id.clone(), coder);
        self.index.insert(key, id.clone());
        id
    }

    /// The length-prefix-safe version of coder `id` (see the module docs).
    pub(crate) fn safe(&mut self, id: &str, referrer: &str) -> Result<String, TranslateError> {
        let mut visiting = BTreeSet::new();
        self.safe_inner(id, referrer, &mut visiting)
    }

    fn safe_inner(
        &mut self,
        id: &str,
        referrer: &str,
        visiting: &mut BTreeSet<String>,
    ) -> Result<String, TranslateError> {
        if let Some(done) = self.safe_memo.get(id) {
            return Ok(done.clone());
        }
        if !visiting.insert(id.to_string()) {
            return Err(TranslateError::Invalid(format!(
                "coder '{id}' (used by {referrer}) contains itself"
            )));
        }
        let coder = self.get(id, referrer)?.clone();
        let urn = coder.spec.as_ref().map_or("", |s| s.urn.as_str());
        let result = if urn == c::LENGTH_PREFIX {
            // Already opaque to the runner.
            id.to_string()
        } else if let Some(known) = self.known.get(urn).copied() {
            if coder.component_coder_ids.len() != arity(known) {
                return Err(TranslateError::Invalid(format!(
                    "coder '{id}' ('{urn}', used by {referrer}) has {} components, expected {}",
                    coder.component_coder_ids.len(),
                    arity(known)
                )));
            }
            let mut components = Vec::with_capacity(coder.component_coder_ids.len());
            for (i, component) in coder.component_coder_ids.iter().enumerate() {
                let safe = if (known == c::WINDOWED_VALUE || known == c::TIMER) && i == 1 {
                    self.safe_window(component, referrer)?
                } else {
                    self.safe_inner(component, referrer, visiting)?
                };
                components.push(safe);
            }
            if components == coder.component_coder_ids {
                id.to_string()
            } else {
                self.add_like(id, &format!("{id}_safe"), components)?
            }
        } else {
            self.add(
                &format!("{id}_length_prefixed"),
                c::LENGTH_PREFIX,
                vec![id.to_string()],
            )
        };
        visiting.remove(id);
        self.safe_memo.insert(id.to_string(), result.clone());
        self.safe_memo.insert(result.clone(), result.clone());
        Ok(result)
    }

    /// The runner-readable version of window coder `id`: global and (if
    /// known) interval windows stay; any other window coder becomes
    /// `custom_window[length_prefix(id)]`.
    pub(crate) fn safe_window(
        &mut self,
        id: &str,
        referrer: &str,
    ) -> Result<String, TranslateError> {
        if let Some(done) = self.window_memo.get(id) {
            return Ok(done.clone());
        }
        let urn = self.urn(id, referrer)?.to_string();
        let result = match urn.as_str() {
            c::GLOBAL_WINDOW => id.to_string(),
            c::INTERVAL_WINDOW if self.known.contains(c::INTERVAL_WINDOW) => id.to_string(),
            c::CUSTOM_WINDOW => {
                let inner = self.components_of(id, c::CUSTOM_WINDOW, referrer)?;
                let lp = self.length_prefixed(&inner[0]);
                self.add_like(id, &format!("{id}_safe"), vec![lp])?
            }
            _ => {
                let lp = self.length_prefixed(id);
                self.add(&format!("{id}_custom_window"), c::CUSTOM_WINDOW, vec![lp])
            }
        };
        self.window_memo.insert(id.to_string(), result.clone());
        self.window_memo.insert(result.clone(), result.clone());
        Ok(result)
    }

    /// `id` itself if it is a length prefix already, else `length_prefix[id]`.
    fn length_prefixed(&mut self, id: &str) -> String {
        if self.urn_of(id) == Some(c::LENGTH_PREFIX) {
            id.to_string()
        } else {
            self.add(
                &format!("{id}_length_prefixed"),
                c::LENGTH_PREFIX,
                vec![id.to_string()],
            )
        }
    }

    /// The port coder for a PCollection: `windowed_value[elem, window]`.
    pub(crate) fn windowed(&mut self, elem: &str, window: &str) -> String {
        self.add(
            &format!("{elem}_windowed"),
            c::WINDOWED_VALUE,
            vec![elem.to_string(), window.to_string()],
        )
    }

    /// The engine's view of a coder that [`Coders::safe`] or
    /// [`Coders::safe_window`] produced. The engine's coder is a tree, so
    /// a coder whose components share coders unfolds into more nodes than
    /// it has ids: at most [`MAX_ENGINE_CODER_NODES`] are built.
    pub(crate) fn engine(&self, id: &str, referrer: &str) -> Result<Coder, TranslateError> {
        let mut budget = MAX_ENGINE_CODER_NODES;
        self.engine_inner(id, referrer, 0, &mut budget)
    }

    fn engine_inner(
        &self,
        id: &str,
        referrer: &str,
        depth: usize,
        budget: &mut usize,
    ) -> Result<Coder, TranslateError> {
        if depth > 64 || *budget == 0 {
            return Err(TranslateError::Invalid(format!(
                "coder '{id}' (used by {referrer}) is nested too deeply or unfolds into more \
                 than {MAX_ENGINE_CODER_NODES} coders the runner must read"
            )));
        }
        *budget -= 1;
        let coder = self.get(id, referrer)?;
        let urn = coder.spec.as_ref().map_or("", |s| s.urn.as_str());
        let n = coder.component_coder_ids.len();
        if urn != c::LENGTH_PREFIX && n != arity(urn) {
            return Err(TranslateError::Invalid(format!(
                "coder '{id}' ('{urn}', used by {referrer}) has {n} components, expected {}",
                arity(urn)
            )));
        }
        let mut sub = |i: usize| -> Result<Box<Coder>, TranslateError> {
            Ok(Box::new(self.engine_inner(
                &coder.component_coder_ids[i],
                referrer,
                depth + 1,
                budget,
            )?))
        };
        Ok(match urn {
            c::LENGTH_PREFIX => Coder::LengthPrefix,
            c::BYTES => Coder::Bytes,
            c::STRING_UTF8 => Coder::StringUtf8,
            c::VARINT => Coder::Varint,
            c::BOOL => Coder::Bool,
            c::DOUBLE => Coder::Double,
            c::KV => Coder::Kv(sub(0)?, sub(1)?),
            c::ITERABLE => Coder::Iterable(sub(0)?),
            c::NULLABLE => Coder::Nullable(sub(0)?),
            c::GLOBAL_WINDOW => Coder::GlobalWindow,
            c::INTERVAL_WINDOW => Coder::IntervalWindow,
            c::CUSTOM_WINDOW => Coder::CustomWindow,
            c::WINDOWED_VALUE => {
                let value = sub(0)?;
                Coder::WindowedValue {
                    value,
                    window: sub(1)?,
                }
            }
            c::TIMER => {
                let key = sub(0)?;
                Coder::Timer {
                    key,
                    window: sub(1)?,
                }
            }
            other => {
                return Err(TranslateError::unsupported(
                    format!("coder '{id}' with URN '{other}' on the runner side"),
                    referrer,
                ))
            }
        })
    }

    /// The coders `roots` need, transitively closed under components.
    pub(crate) fn closure<'a>(
        &self,
        roots: impl IntoIterator<Item = &'a String>,
        referrer: &str,
    ) -> Result<HashMap<String, pb::Coder>, TranslateError> {
        let mut out = HashMap::new();
        let mut stack: Vec<String> = roots.into_iter().cloned().collect();
        while let Some(id) = stack.pop() {
            if out.contains_key(&id) {
                continue;
            }
            let coder = self.get(&id, referrer)?;
            stack.extend(coder.component_coder_ids.iter().cloned());
            out.insert(id, coder.clone());
        }
        Ok(out)
    }
}

/// Most nodes of one engine coder tree (see [`Coders::engine`]); real
/// coders the runner reads have a handful.
pub(crate) const MAX_ENGINE_CODER_NODES: usize = 10_000;

/// Refuses coders that contain themselves (directly or through their
/// components) or nest deeper than `max_depth`, walking every coder once
/// without recursion. Every later walk over components (rewriting,
/// comparing, building the engine's view) then ends within `max_depth`
/// levels. Components missing from the map are reported where they are
/// used.
fn check_structure(
    map: &HashMap<String, pb::Coder>,
    max_depth: usize,
) -> Result<(), TranslateError> {
    let components = |id: &str| {
        map.get(id)
            .map_or(&[][..], |c| c.component_coder_ids.as_slice())
    };
    // Height of every coder walked so far: 1 for a coder without components.
    let mut height: HashMap<&str, usize> = HashMap::with_capacity(map.len());
    let mut on_path: HashSet<&str> = HashSet::new();
    let mut roots: Vec<&String> = map.keys().collect();
    roots.sort();
    for root in roots {
        if height.contains_key(root.as_str()) {
            continue;
        }
        // The path from `root`, each coder with the next component to visit.
        let mut path: Vec<(&str, usize)> = vec![(root.as_str(), 0)];
        on_path.insert(root.as_str());
        while let Some((id, next)) = path.last_mut() {
            let id: &str = id;
            if let Some(child) = components(id).get(*next) {
                *next += 1;
                let child = child.as_str();
                if height.contains_key(child) || !map.contains_key(child) {
                    continue;
                }
                if on_path.contains(child) {
                    return Err(TranslateError::Invalid(format!(
                        "coder '{child}' contains itself (through its components)"
                    )));
                }
                if path.len() >= max_depth {
                    return Err(too_deep(root, path.len() + 1, max_depth));
                }
                on_path.insert(child);
                path.push((child, 0));
                continue;
            }
            let h = 1 + components(id)
                .iter()
                .filter_map(|c| height.get(c.as_str()))
                .max()
                .copied()
                .unwrap_or(0);
            if h > max_depth {
                return Err(too_deep(id, h, max_depth));
            }
            height.insert(id, h);
            on_path.remove(id);
            path.pop();
        }
    }
    Ok(())
}

fn too_deep(id: &str, depth: usize, limit: usize) -> TranslateError {
    TranslateError::TooLarge {
        what: format!("levels of components in coder '{id}' (at least)"),
        count: depth,
        limit,
    }
}

/// `base` if `taken(base)` is false, else the first free `base_N`.
pub(crate) fn unique_id(base: &str, taken: impl Fn(&str) -> bool) -> String {
    if !taken(base) {
        return base.to_string();
    }
    let mut n = 1usize;
    loop {
        let candidate = format!("{base}_{n}");
        if !taken(&candidate) {
            return candidate;
        }
        n += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn coder(urn: &str, components: &[&str]) -> pb::Coder {
        pb::Coder {
            spec: Some(pb::FunctionSpec {
                urn: urn.to_string(),
                payload: Vec::new(),
            }),
            component_coder_ids: components.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn env(caps: &[&str]) -> pb::Environment {
        pb::Environment {
            capabilities: caps.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn table(envs: &[pb::Environment]) -> Coders {
        let map: HashMap<String, pb::Coder> = [
            ("bytes", coder(c::BYTES, &[])),
            ("varint", coder(c::VARINT, &[])),
            ("pickled", coder("beam:coder:pickled_python:v1", &[])),
            ("tuple", coder("beam:coder:tuple:v1", &["bytes", "varint"])),
            ("kv", coder(c::KV, &["varint", "pickled"])),
            ("gw", coder(c::GLOBAL_WINDOW, &[])),
            ("iw", coder(c::INTERVAL_WINDOW, &[])),
            ("wv", coder(c::WINDOWED_VALUE, &["kv", "pickled"])),
            ("go", coder(c::GO_CUSTOM, &[])),
            ("lp_go", coder(c::LENGTH_PREFIX, &["go"])),
            ("lp_bytes", coder(c::LENGTH_PREFIX, &["bytes"])),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let envs: HashMap<String, pb::Environment> = envs
            .iter()
            .enumerate()
            .map(|(i, e)| (format!("env{i}"), e.clone()))
            .collect();
        Coders::new(map, &envs, 100).expect("well-formed coders")
    }

    #[test]
    fn unknown_coders_are_wrapped_whole() {
        let mut t = table(&[env(&[c::VARINT])]);
        let safe = t.safe("tuple", "test").unwrap();
        assert_eq!(t.urn(&safe, "test").unwrap(), c::LENGTH_PREFIX);
        assert_eq!(
            t.get(&safe, "test").unwrap().component_coder_ids,
            vec!["tuple"]
        );
        assert_eq!(t.engine(&safe, "test").unwrap(), Coder::LengthPrefix);
        // Idempotent.
        assert_eq!(t.safe(&safe, "test").unwrap(), safe);
    }

    #[test]
    fn go_custom_coders_are_self_delimiting() {
        let mut t = table(&[env(&[])]);
        // Go refuses a bare custom coder on a PCollection: it is wrapped.
        let safe = t.safe("go", "test").unwrap();
        assert_eq!(safe, "lp_go");
        assert_eq!(t.engine(&safe, "test").unwrap(), Coder::LengthPrefix);
        assert!(t.is_go_custom("go") && t.is_go_custom("lp_go"));
        assert!(!t.is_go_custom("lp_bytes"));
        assert!(t.same_encoding("lp_go", "go"));
        assert!(t.same_encoding("go", "lp_go"));
        assert!(!t.same_encoding("lp_bytes", "bytes"));
    }

    #[test]
    fn known_composites_recurse() {
        let mut t = table(&[env(&[c::VARINT])]);
        let safe = t.safe("kv", "test").unwrap();
        assert_ne!(safe, "kv");
        assert_eq!(
            t.engine(&safe, "test").unwrap(),
            Coder::Kv(Box::new(Coder::Varint), Box::new(Coder::LengthPrefix))
        );
    }

    #[test]
    fn optional_coders_need_every_environment() {
        let mut t = table(&[env(&[c::VARINT]), env(&[])]);
        let safe = t.safe("varint", "test").unwrap();
        assert_eq!(t.engine(&safe, "test").unwrap(), Coder::LengthPrefix);
    }

    #[test]
    fn unknown_windows_become_custom_windows() {
        let mut t = table(&[env(&[c::VARINT])]);
        // interval_window is not declared, so it is not known here.
        let w = t.safe_window("iw", "test").unwrap();
        assert_eq!(t.urn(&w, "test").unwrap(), c::CUSTOM_WINDOW);
        let inner = &t.get(&w, "test").unwrap().component_coder_ids[0].clone();
        assert_eq!(t.urn(inner, "test").unwrap(), c::LENGTH_PREFIX);
        assert_eq!(t.engine(&w, "test").unwrap(), Coder::CustomWindow);
        let wv = t.safe("wv", "test").unwrap();
        assert_eq!(
            t.engine(&wv, "test").unwrap(),
            Coder::WindowedValue {
                value: Box::new(Coder::Kv(
                    Box::new(Coder::Varint),
                    Box::new(Coder::LengthPrefix)
                )),
                window: Box::new(Coder::CustomWindow),
            }
        );
        assert_eq!(t.safe_window("gw", "test").unwrap(), "gw");
    }

    #[test]
    fn adding_reuses_identical_coders() {
        let mut t = table(&[]);
        assert_eq!(t.add("x", c::BYTES, vec![]), "bytes");
        let a = t.add("bytes", c::ITERABLE, vec!["bytes".into()]);
        assert_eq!(a, "bytes_1");
        assert_eq!(t.add("other", c::ITERABLE, vec!["bytes".into()]), a);
    }

    #[test]
    fn closure_includes_components_and_reports_missing() {
        let t = table(&[]);
        let closed = t.closure([&"wv".to_string()], "test").unwrap();
        let mut ids: Vec<_> = closed.keys().cloned().collect();
        ids.sort();
        assert_eq!(ids, vec!["kv", "pickled", "varint", "wv"]);
        let err = t.closure([&"nope".to_string()], "stage 1").unwrap_err();
        assert_eq!(
            err.to_string(),
            "coder 'nope' referenced by stage 1 is missing from the pipeline"
        );
    }
}
