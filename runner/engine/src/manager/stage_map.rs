//! Which of a plan's stages and transforms a checkpoint's are.
//!
//! A checkpoint is restored onto a plan that may be fused differently
//! from the one it was taken of: another build of Refract may fuse
//! otherwise, and a new version of the pipeline (a savepoint start) may
//! add, remove or rename transforms. What carries over is named the way
//! the pipeline names it (see [`PipelineNames`]):
//!
//! * A stage's queue is the elements its *heads*, the transforms reading
//!   its input, have yet to see. An old stage's queue goes to every new
//!   stage that shares a head with it; two old stages with elements
//!   waiting may not feed one new stage (each head would see the other's
//!   elements), and elements waiting for a transform that is gone, or
//!   that the new plan fuses behind another, have nowhere to go.
//! * Timers, user state and a GroupByKey's buffer belong to one
//!   transform, which is its stage's only head: they go to the one new
//!   stage that shares a head, under the new id of their transform.
//! * Side inputs are kept per reading transform, under its new id.
//!
//! Every refusal names the transforms and the reason; what had nothing to
//! carry (an empty queue, a stage that is gone with nothing in it) needs
//! no counterpart.
//!
//! A name mapping ([`NameMapping`], `--transform_name_mapping`) renames
//! the checkpoint's transforms first. As Dataflow's, it maps name
//! prefixes: an entry for a composite transform renames every transform
//! nested in it (`"Count": "Counted"` makes `Count/ParMultiDo(Fn)`
//! `Counted/ParMultiDo(Fn)`), whole path segments only, the longest entry
//! winning. A transform mapped to `""` is removed, and a stage all of
//! whose heads are removed is dropped with what it held.
//! [`check_update`] is the same map made before a running job is
//! stopped for an update, as if every stage held something.
//!
//! A checkpoint of a format before names were recorded maps by identical
//! stage names, as it was restored when it was written.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::plan::{PipelineNames, Plan, SideInput, StageIdx, StageKind, TransformId};

/// What a checkpoint recorded of the names of the plan it was taken of.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct RecordedNames {
    /// Each stage's name, by stage number.
    pub(super) stage_names: Vec<String>,
    /// Each stage's heads, by stage number; empty in a format that did not
    /// record them.
    pub(super) stage_heads: Vec<Vec<String>>,
    /// Transform id → unique name.
    pub(super) transforms: Vec<(String, String)>,
}

impl RecordedNames {
    /// The names of `plan`, as a checkpoint of it records them.
    pub(super) fn of(plan: &Plan) -> Self {
        RecordedNames {
            stage_names: plan.stages.iter().map(|s| s.name.clone()).collect(),
            stage_heads: plan.stages.indices().map(|i| plan.stage_heads(i)).collect(),
            transforms: transform_names(&plan.names),
        }
    }
}

/// `names`' transforms as a checkpoint lists them: sorted by id.
fn transform_names(names: &PipelineNames) -> Vec<(String, String)> {
    names
        .transforms
        .iter()
        .map(|(id, name)| (id.to_string(), name.clone()))
        .collect()
}

/// How a checkpoint's stages and transforms map onto a plan.
#[derive(Debug)]
pub(super) struct StageMap {
    /// Per old stage, the new stages its queue goes to.
    targets: Vec<Vec<StageIdx>>,
    /// Per old stage, its heads (for errors).
    old_heads: Vec<Vec<String>>,
    /// Per new stage, the old stages mapped onto it.
    sources: HashMap<StageIdx, Vec<usize>>,
    /// Per old stage, a head the new plan has but not as a head (the
    /// elements waiting for it would have nowhere to go), with the stage
    /// it is fused into there.
    fused_behind: Vec<Option<(String, String)>>,
    /// Old transform id → its new id (`None`: not in the new plan);
    /// an id the checkpoint named no transform for keeps its id.
    renames: HashMap<String, Option<TransformId>>,
    /// Old transform id → its unique name.
    old_names: BTreeMap<String, String>,
    /// Per old stage, whether a name mapping removed every head of it:
    /// what it held goes, on purpose.
    dropped: Vec<bool>,
    /// The names the checkpoint's transforms have in the new pipeline.
    carried_names: HashSet<String>,
    /// The checkpoint recorded the pipeline's names (format 5 on).
    names_recorded: bool,
}

/// Old unique name (or prefix) → new unique name (or prefix), as
/// `--transform_name_mapping` gives it; an empty new name removes the
/// transform, and every transform nested in it, on purpose.
pub type NameMapping = BTreeMap<String, String>;

/// What the transform `name` is called after `renamed` (`None`: removed
/// on purpose): the longest entry that is `name` or a whole-segment
/// prefix of it (`A` is a prefix of `A/B`, not of `AB`) swaps that
/// prefix. The one reading of a mapping, for state and metrics alike.
pub fn renamed_name(renamed: &NameMapping, name: &str) -> Option<String> {
    let entry = renamed
        .iter()
        .filter(|(from, _)| is_within(name, from))
        .max_by_key(|(from, _)| from.len());
    match entry {
        None => Some(name.to_string()),
        Some((_, to)) if to.is_empty() => None,
        Some((from, to)) => Some(format!("{to}{}", &name[from.len()..])),
    }
}

/// Whether `name` is transform `prefix` or nested in it.
fn is_within(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

impl StageMap {
    /// Maps `recorded` onto `plan`, with the transforms `renamed` names
    /// renamed (or removed); with no heads recorded (an older format),
    /// stage by stage, which requires the same stage names (the error says
    /// why the checkpoint does not fit).
    pub(super) fn new(
        recorded: &RecordedNames,
        plan: &Plan,
        renamed: &NameMapping,
    ) -> Result<Self, String> {
        let new_names: Vec<&str> = plan.stages.iter().map(|s| s.name.as_str()).collect();
        let old_heads: Vec<Vec<String>> = if recorded.stage_heads.is_empty() {
            if recorded.stage_names != new_names {
                return Err(format!(
                    "its stages are [{}], the pipeline's are [{}]",
                    recorded.stage_names.join(", "),
                    new_names.join(", ")
                ));
            }
            plan.stages.indices().map(|i| plan.stage_heads(i)).collect()
        } else {
            recorded.stage_heads.clone()
        };
        let new_heads: Vec<(StageIdx, Vec<String>)> = plan
            .stages
            .indices()
            .map(|idx| (idx, plan.stage_heads(idx)))
            .collect();
        let head_owner: HashMap<&str, StageIdx> = new_heads
            .iter()
            .flat_map(|(idx, heads)| heads.iter().map(move |h| (h.as_str(), *idx)))
            .collect();
        // Which new stage runs each transform, to tell "gone" from "fused
        // behind another".
        let runs_in: HashMap<&str, StageIdx> = plan
            .stages
            .iter_enumerated()
            .flat_map(|(idx, s)| crate::plan::fused_transform_names(&s.name).map(move |n| (n, idx)))
            .collect();
        check_mapping(recorded, &old_heads, renamed, |prefix| {
            (head_owner.keys().chain(runs_in.keys())).any(|name| is_within(name, prefix))
        })?;
        // A name as the new pipeline calls it; `None`: removed on purpose.
        let renamed_to = |name: &str| renamed_name(renamed, name);
        let mut targets = Vec::with_capacity(old_heads.len());
        let mut fused_behind = Vec::with_capacity(old_heads.len());
        let mut dropped = Vec::with_capacity(old_heads.len());
        let mut sources: HashMap<StageIdx, Vec<usize>> = HashMap::new();
        for (old, heads) in old_heads.iter().enumerate() {
            let heads: Vec<String> = heads.iter().filter_map(|h| renamed_to(h)).collect();
            dropped.push(heads.is_empty() && !old_heads[old].is_empty());
            let mut to: Vec<StageIdx> = heads
                .iter()
                .filter_map(|h| head_owner.get(h.as_str()).copied())
                .collect();
            to.sort();
            to.dedup();
            for &n in &to {
                sources.entry(n).or_default().push(old);
            }
            fused_behind.push(heads.iter().find_map(|h| {
                if head_owner.contains_key(h.as_str()) {
                    return None;
                }
                runs_in
                    .get(h.as_str())
                    .map(|&idx| (h.clone(), plan.stages[idx].name.clone()))
            }));
            targets.push(to);
        }
        let new_ids: HashMap<&str, &TransformId> = plan
            .names
            .transforms
            .iter()
            .map(|(id, name)| (name.as_str(), id))
            .collect();
        let old_names: BTreeMap<String, String> = recorded.transforms.iter().cloned().collect();
        let carried_names = old_names.values().filter_map(|n| renamed_to(n)).collect();
        let renames = old_names
            .iter()
            .map(|(id, name)| {
                let new_id = renamed_to(name)
                    .and_then(|name| new_ids.get(name.as_str()).map(|&i| i.clone()));
                (id.clone(), new_id)
            })
            .collect();
        Ok(StageMap {
            targets,
            old_heads,
            sources,
            fused_behind,
            renames,
            old_names,
            dropped,
            carried_names,
            names_recorded: !recorded.stage_heads.is_empty(),
        })
    }

    /// Whether a name mapping removed old stage `old`'s every head: what
    /// it holds is dropped, not carried.
    pub(super) fn dropped(&self, old: usize) -> bool {
        self.dropped[old]
    }

    /// How many stages the checkpoint has.
    pub(super) fn old_stages(&self) -> usize {
        self.targets.len()
    }

    /// The new stages old stage `old`'s queue goes to.
    pub(super) fn targets(&self, old: usize) -> &[StageIdx] {
        &self.targets[old]
    }

    /// The old stages mapped onto new stage `idx`.
    pub(super) fn sources(&self, idx: StageIdx) -> &[usize] {
        self.sources.get(&idx).map_or(&[], Vec::as_slice)
    }

    /// Old stage `old`'s heads, for errors.
    pub(super) fn describe(&self, old: usize) -> String {
        self.old_heads[old].join(", ")
    }

    /// Why the elements waiting in old stage `old` cannot be carried over
    /// (`None`: they can), given where its queue goes.
    pub(super) fn queue_refusal(&self, old: usize) -> Option<String> {
        if let Some((head, stage)) = &self.fused_behind[old] {
            return Some(format!(
                "elements wait for '{head}', which the pipeline now fuses into stage '{stage}' \
                 behind another transform"
            ));
        }
        if self.targets[old].is_empty() {
            return Some(format!(
                "elements wait for '{}', which the pipeline does not have",
                self.describe(old)
            ));
        }
        None
    }

    /// Old transform id `id`'s new id (`None`: the new plan does not have
    /// it).
    pub(super) fn rename(&self, id: &TransformId) -> Option<TransformId> {
        match self.renames.get(id.as_str()) {
            Some(new) => new.clone(),
            None => Some(id.clone()),
        }
    }

    /// Old transform id `id`'s unique name, for errors.
    pub(super) fn old_name(&self, id: &TransformId) -> String {
        self.old_names
            .get(id.as_str())
            .cloned()
            .unwrap_or_else(|| id.to_string())
    }

    /// Whether the checkpoint knew the transform the new pipeline calls
    /// `name` (under that name, or one the mapping renames to it).
    fn knew(&self, name: &str) -> bool {
        self.carried_names.contains(name)
    }

    /// The side inputs of `plan` (the one mapped onto) read by transforms
    /// the checkpoint did not know, with their readers' unique names: side
    /// input values are kept per reading transform, so a new reader would
    /// miss what the producer sent before the cut. None when the
    /// checkpoint recorded no names (a format before 5).
    pub(super) fn new_side_input_readers<'a>(
        &'a self,
        plan: &'a Plan,
    ) -> impl Iterator<Item = (&'a str, &'a SideInput)> + 'a {
        plan.stages
            .iter()
            .flat_map(|stage| stage.side_inputs.iter())
            .filter(|_| self.names_recorded)
            .filter_map(|side| {
                let name = plan.names.transforms.get(&side.id.transform_id)?;
                (!self.knew(name)).then_some((name.as_str(), side))
            })
    }
}

/// Whether a job running plan `old` can hand whatever it holds to one
/// running plan `new` (a pipeline update), its transforms renamed by
/// `renamed`: every reason it could not, naming the transforms, as if
/// every stage of `old` held elements, and every keyed one state.
///
/// A restore ([`super::Engine::restore_renamed`]) checks what a cut
/// actually holds; this is the stricter check made before the running job
/// is stopped, so that an update a cut could refuse is refused while the
/// old job keeps running.
pub fn check_update(old: &Plan, new: &Plan, renamed: &NameMapping) -> Result<(), Vec<String>> {
    let map = StageMap::new(&RecordedNames::of(old), new, renamed).map_err(|e| vec![e])?;
    let mut refusals = Vec::new();
    for (idx, stage) in old.stages.iter_enumerated() {
        let o = idx.index();
        if map.dropped(o) {
            continue;
        }
        let heads = map.describe(o);
        if let Some(reason) = map.queue_refusal(o) {
            refusals.push(format!(
                "'{heads}': {}; give its new name in --transform_name_mapping, or \"\" to drop \
                 what it holds",
                reason.replacen("elements wait", "elements may wait", 1)
            ));
            continue;
        }
        if !stage.is_keyed() {
            continue;
        }
        match map.targets(o) {
            [target] => {
                let now = &new.stages[*target];
                let same_kind = matches!(
                    (&stage.kind, &now.kind),
                    (StageKind::GroupByKey(_), StageKind::GroupByKey(_))
                ) || (matches!(stage.kind, StageKind::Sdk(_)) && now.is_keyed());
                if !same_kind {
                    refusals.push(format!(
                        "'{heads}' keeps state by key, and in the new pipeline stage '{}' does \
                         not",
                        now.name
                    ));
                }
            }
            targets => refusals.push(format!(
                "'{heads}' keeps state by key, and the new pipeline reads its input in {} stages",
                targets.len()
            )),
        }
    }
    for (name, side) in map.new_side_input_readers(new) {
        refusals.push(format!(
            "'{name}' is new and reads side input '{}', whose values so far are kept only for \
             the transforms that read it before",
            side.id.tag
        ));
    }
    if refusals.is_empty() {
        Ok(())
    } else {
        Err(refusals)
    }
}

/// Refuses a mapping that renames a transform the checkpoint does not
/// have (nor any nested in it), or to one the pipeline (`has`, given a
/// prefix) does not have: a typo would otherwise drop or misplace state
/// without a word.
fn check_mapping(
    recorded: &RecordedNames,
    old_heads: &[Vec<String>],
    renamed: &NameMapping,
    has: impl Fn(&str) -> bool,
) -> Result<(), String> {
    let known = |prefix: &str| {
        old_heads.iter().flatten().any(|h| is_within(h, prefix))
            || recorded
                .transforms
                .iter()
                .any(|(_, n)| is_within(n, prefix))
            || (recorded.stage_names.iter())
                .any(|s| crate::plan::fused_transform_names(s).any(|n| is_within(n, prefix)))
    };
    for (from, to) in renamed {
        if !known(from) {
            return Err(format!(
                "--transform_name_mapping renames '{from}', which the checkpoint has no \
                 transform of"
            ));
        }
        if !to.is_empty() && !has(to) {
            return Err(format!(
                "--transform_name_mapping renames '{from}' to '{to}', which the pipeline has no \
                 transform of"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{PCollectionIdx, SideInputAccess, SideInputId, Stage, WindowingStrategy};

    /// A plan of SDK stages, each given as (name, heads), with transforms
    /// `(id, unique name)`.
    fn plan(stages: &[(&str, &[&str])], transforms: &[(&str, &str)]) -> Plan {
        let mut plan = Plan::default();
        for (name, heads) in stages {
            plan.stages.push(Stage {
                name: name.to_string(),
                kind: StageKind::Flatten,
                inputs: Vec::new(),
                side_inputs: Vec::new(),
                outputs: Vec::new(),
            });
            plan.names
                .stage_heads
                .push(heads.iter().map(|h| h.to_string()).collect());
        }
        plan.names.transforms = transforms
            .iter()
            .map(|(id, name)| (TransformId::new(id), name.to_string()))
            .collect();
        plan
    }

    fn idx(i: usize) -> StageIdx {
        StageIdx::new(i)
    }

    #[test]
    fn stages_are_found_by_their_heads_whatever_their_numbers() {
        let old = plan(&[("A+B", &["A"]), ("C", &["C"])], &[]);
        let new = plan(&[("C", &["C"]), ("A+B", &["A"])], &[]);
        let map =
            StageMap::new(&RecordedNames::of(&old), &new, &NameMapping::new()).expect("a map");
        assert_eq!(map.targets(0), [idx(1)]);
        assert_eq!(map.targets(1), [idx(0)]);
        assert_eq!(map.sources(idx(1)), [0]);
        assert_eq!(map.queue_refusal(0), None);
    }

    #[test]
    fn a_queue_read_by_two_heads_goes_to_both_when_they_are_split() {
        let old = plan(&[("A+B", &["A", "B"])], &[]);
        let new = plan(&[("A", &["A"]), ("B", &["B"])], &[]);
        let map =
            StageMap::new(&RecordedNames::of(&old), &new, &NameMapping::new()).expect("a map");
        assert_eq!(map.targets(0), [idx(0), idx(1)]);
        assert_eq!(map.queue_refusal(0), None);
    }

    #[test]
    fn elements_waiting_for_a_transform_fused_behind_another_or_gone_are_refused() {
        let old = plan(&[("A", &["A"]), ("C", &["C"]), ("X", &["X"])], &[]);
        let new = plan(&[("A+C", &["A"])], &[]);
        let map =
            StageMap::new(&RecordedNames::of(&old), &new, &NameMapping::new()).expect("a map");
        let behind = map.queue_refusal(1).expect("C is fused behind A");
        assert!(
            behind.contains("'C'") && behind.contains("'A+C'"),
            "{behind}"
        );
        let gone = map.queue_refusal(2).expect("X is gone");
        assert!(
            gone.contains("'X'") && gone.contains("does not have"),
            "{gone}"
        );
    }

    #[test]
    fn transforms_are_renamed_by_unique_name() {
        let old = plan(&[("Count", &["Count"])], &[("t1", "Count"), ("t2", "Gone")]);
        let new = plan(&[("Count", &["Count"])], &[("t7", "Count")]);
        let map =
            StageMap::new(&RecordedNames::of(&old), &new, &NameMapping::new()).expect("a map");
        assert_eq!(map.rename(&"t1".into()), Some("t7".into()));
        assert_eq!(map.rename(&"t2".into()), None);
        assert_eq!(map.old_name(&"t2".into()), "Gone");
        // An id the checkpoint named nothing for keeps its id.
        assert_eq!(map.rename(&"t9".into()), Some("t9".into()));
        assert!(map.knew("Count") && !map.knew("New"));
    }

    #[test]
    fn a_mapping_renames_transforms_and_removes_them_on_purpose() {
        let old = plan(
            &[
                ("Count", &["Count"]),
                ("Old", &["Old"]),
                ("Keep", &["Keep"]),
            ],
            &[("t1", "Count"), ("t2", "Old")],
        );
        let new = plan(
            &[("Counted", &["Counted"]), ("Keep", &["Keep"])],
            &[("t5", "Counted")],
        );
        let names = RecordedNames::of(&old);
        let mapping = |pairs: &[(&str, &str)]| -> NameMapping {
            pairs
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect()
        };
        let map = StageMap::new(&names, &new, &mapping(&[("Count", "Counted"), ("Old", "")]))
            .expect("a map");
        assert_eq!(map.targets(0), [idx(0)]);
        assert_eq!(map.rename(&"t1".into()), Some("t5".into()));
        assert!(map.dropped(1) && !map.dropped(0) && !map.dropped(2));
        assert!(map.knew("Counted") && !map.knew("Count") && !map.knew("Old"));
        assert_eq!(map.targets(2), [idx(1)]);
        let typo = StageMap::new(&names, &new, &mapping(&[("Cuont", "Counted")]))
            .expect_err("a name the checkpoint lacks");
        assert!(typo.contains("'Cuont'"), "{typo}");
        let nowhere = StageMap::new(&names, &new, &mapping(&[("Count", "Counter")]))
            .expect_err("a name the pipeline lacks");
        assert!(nowhere.contains("'Counter'"), "{nowhere}");
    }

    #[test]
    fn a_mapping_of_a_composite_renames_what_is_nested_in_it() {
        // Java names a ParDo's primitive after its composite.
        let old = plan(
            &[("Count/ParMultiDo(Fn)", &["Count/ParMultiDo(Fn)"])],
            &[("t1", "Count/ParMultiDo(Fn)"), ("t2", "Counter/Sum")],
        );
        let new = plan(
            &[("Counted/ParMultiDo(Fn)", &["Counted/ParMultiDo(Fn)"])],
            &[("t5", "Counted/ParMultiDo(Fn)")],
        );
        let names = RecordedNames::of(&old);
        let by_prefix: NameMapping = [("Count".to_string(), "Counted".to_string())].into();
        let map = StageMap::new(&names, &new, &by_prefix).expect("a map");
        assert_eq!(map.targets(0), [idx(0)]);
        assert_eq!(map.rename(&"t1".into()), Some("t5".into()));
        // Whole segments only: "Count" is no prefix of "Counter/Sum".
        assert_eq!(map.rename(&"t2".into()), None);
        assert!(map.knew("Counted/ParMultiDo(Fn)") && map.knew("Counter/Sum"));
        // The longest entry wins; "" removes what is nested too.
        let longest: NameMapping = [
            ("Count".to_string(), "Gone".to_string()),
            (
                "Count/ParMultiDo(Fn)".to_string(),
                "Counted/ParMultiDo(Fn)".to_string(),
            ),
        ]
        .into();
        assert_eq!(
            renamed_name(&longest, "Count/ParMultiDo(Fn)").as_deref(),
            Some("Counted/ParMultiDo(Fn)")
        );
        let dropped: NameMapping = [("Count".to_string(), String::new())].into();
        assert_eq!(renamed_name(&dropped, "Count/ParMultiDo(Fn)"), None);
        assert_eq!(
            renamed_name(&dropped, "Counter").as_deref(),
            Some("Counter")
        );
        let typo: NameMapping = [("Coun".to_string(), "Counted".to_string())].into();
        let refused = StageMap::new(&names, &new, &typo).expect_err("no transform 'Coun'");
        assert!(refused.contains("'Coun'"), "{refused}");
    }

    #[test]
    fn an_update_is_refused_for_every_stage_that_could_hold_what_has_no_place() {
        let mut old = plan(
            &[
                ("Read", &["Read"]),
                ("Count", &["Count"]),
                ("Write", &["Write"]),
            ],
            &[],
        );
        old.stages[idx(1)].kind = StageKind::GroupByKey(WindowingStrategy::global_default());
        let mut new = plan(&[("Read", &["Read"]), ("Count", &["Count"])], &[]);
        new.stages[idx(1)].kind = StageKind::GroupByKey(WindowingStrategy::global_default());
        let refused = check_update(&old, &new, &NameMapping::new()).expect_err("Write is gone");
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(
            refused[0].starts_with("'Write': elements may wait"),
            "{refused:?}"
        );
        let drop_write: NameMapping = [("Write".to_string(), String::new())].into();
        assert_eq!(check_update(&old, &new, &drop_write), Ok(()));
        // A GroupByKey's buffer needs a GroupByKey.
        new.stages[idx(1)].kind = StageKind::Flatten;
        let refused = check_update(&old, &new, &drop_write).expect_err("not a GroupByKey");
        assert!(refused[0].contains("keeps state by key"), "{refused:?}");
    }

    #[test]
    fn an_update_is_refused_when_a_new_transform_reads_a_side_input() {
        let old = plan(&[("Use", &["Use"])], &[("t1", "Use")]);
        let mut new = plan(&[("Use+Look", &["Use"])], &[("t1", "Use"), ("t2", "Look")]);
        let side = |t: &str| SideInput {
            id: SideInputId::new(t, "side0"),
            pcollection: PCollectionIdx::new(0),
            access: SideInputAccess::Iterable,
            fires_early: false,
        };
        new.stages[idx(0)].side_inputs = vec![side("t1")];
        assert_eq!(check_update(&old, &new, &NameMapping::new()), Ok(()));
        new.stages[idx(0)].side_inputs.push(side("t2"));
        let refused = check_update(&old, &new, &NameMapping::new()).expect_err("a new reader");
        assert!(refused[0].starts_with("'Look' is new"), "{refused:?}");
    }

    #[test]
    fn an_older_format_maps_only_onto_the_same_stage_names() {
        let old = plan(&[("A", &[]), ("B", &[])], &[]);
        let older = RecordedNames {
            stage_names: vec!["A".into(), "B".into()],
            ..RecordedNames::default()
        };
        let map = StageMap::new(&older, &old, &NameMapping::new()).expect("the same names");
        assert_eq!(map.targets(1), [idx(1)]);
        let renamed = plan(&[("A", &[]), ("B2", &[])], &[]);
        let refused =
            StageMap::new(&older, &renamed, &NameMapping::new()).expect_err("other names");
        assert!(refused.contains("[A, B]"), "{refused}");
    }
}
