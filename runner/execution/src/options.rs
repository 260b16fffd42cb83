//! Reading the pipeline options a job was submitted with.
//!
//! Options arrive as a `google.protobuf.Struct` keyed `beam:option:NAME:v1`;
//! Python sends numbers as strings, and flags as booleans or strings.

use std::collections::BTreeMap;

use refract_proto::prost_types;
use refract_proto::prost_types::value::Kind;

fn value<'a>(options: &'a prost_types::Struct, name: &str) -> Option<&'a Kind> {
    options
        .fields
        .get(&format!("beam:option:{name}:v1"))
        .and_then(|v| v.kind.as_ref())
}

/// A count option: absent (or null) is `None`; a whole number at or
/// above 0, sent as a number or as a string, is its value; anything
/// else is an error naming the option, so that a typo is refused at
/// submission rather than quietly replaced by a default.
pub(crate) fn option_count(
    options: &prost_types::Struct,
    name: &str,
) -> Result<Option<usize>, String> {
    let refused = |shown: String| format!("--{name}={shown}: expected a whole number, 0 or more");
    match value(options, name) {
        None | Some(Kind::NullValue(_)) => Ok(None),
        Some(Kind::NumberValue(n)) => {
            if n.fract() == 0.0 && *n >= 0.0 && *n < usize::MAX as f64 {
                Ok(Some(*n as usize))
            } else {
                Err(refused(n.to_string()))
            }
        }
        Some(Kind::StringValue(s)) => s.trim().parse().map(Some).map_err(|_| refused(s.clone())),
        Some(other) => Err(refused(format!("{other:?}"))),
    }
}

/// A text option, if set to text.
pub(crate) fn option_string(options: &prost_types::Struct, name: &str) -> Option<String> {
    match value(options, name) {
        Some(Kind::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

/// A boolean option; absent or unreadable means false.
pub(crate) fn option_bool(options: &prost_types::Struct, name: &str) -> bool {
    match value(options, name) {
        Some(Kind::BoolValue(b)) => *b,
        Some(Kind::StringValue(s)) => s.eq_ignore_ascii_case("true"),
        _ => false,
    }
}

/// Whether `--experiments` lists `experiment`.
pub(crate) fn has_experiment(options: &prost_types::Struct, experiment: &str) -> bool {
    let Some(Kind::ListValue(list)) = value(options, "experiments") else {
        return false;
    };
    list.values
        .iter()
        .any(|v| matches!(&v.kind, Some(Kind::StringValue(s)) if s == experiment))
}

/// Every `--experiments` entry, in order.
pub(crate) fn experiments(options: &prost_types::Struct) -> impl Iterator<Item = &str> {
    let list = match value(options, "experiments") {
        Some(Kind::ListValue(list)) => list.values.as_slice(),
        _ => &[],
    };
    list.iter().filter_map(|v| match &v.kind {
        Some(Kind::StringValue(s)) => Some(s.as_str()),
        _ => None,
    })
}

/// The value of an `--experiments` entry `name=value`.
pub(crate) fn experiment_value(options: &prost_types::Struct, name: &str) -> Option<String> {
    let Some(Kind::ListValue(list)) = value(options, "experiments") else {
        return None;
    };
    list.values.iter().find_map(|v| match &v.kind {
        Some(Kind::StringValue(s)) => s
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix('='))
            .map(str::to_string),
        _ => None,
    })
}

/// A map of names to names, sent as an object (Python, Java) or as its
/// JSON text: absent (or null) is empty; anything else is an error naming
/// the option.
pub(crate) fn option_name_map(
    options: &prost_types::Struct,
    name: &str,
) -> Result<BTreeMap<String, String>, String> {
    let refused = |why: String| format!("--{name}: expected an object of names to names, {why}");
    match value(options, name) {
        None | Some(Kind::NullValue(_)) => Ok(BTreeMap::new()),
        Some(Kind::StructValue(map)) => map
            .fields
            .iter()
            .map(|(from, to)| match &to.kind {
                Some(Kind::StringValue(to)) => Ok((from.clone(), to.clone())),
                other => Err(refused(format!("and '{from}' maps to {other:?}"))),
            })
            .collect(),
        Some(Kind::StringValue(text)) => {
            serde_json::from_str(text).map_err(|e| refused(format!("not '{text}' ({e})")))
        }
        Some(other) => Err(refused(format!("not {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost_types::{ListValue, Struct, Value};

    fn options(entries: Vec<(&str, Kind)>) -> Struct {
        Struct {
            fields: entries
                .into_iter()
                .map(|(k, v)| (format!("beam:option:{k}:v1"), Value { kind: Some(v) }))
                .collect(),
        }
    }

    #[test]
    fn reads_what_python_sends() {
        let o = options(vec![
            ("streaming", Kind::BoolValue(true)),
            ("sdk_worker_parallelism", Kind::StringValue("2".into())),
            (
                "experiments",
                Kind::ListValue(ListValue {
                    values: vec![
                        Value {
                            kind: Some(Kind::StringValue("drain_on_start".into())),
                        },
                        Value {
                            kind: Some(Kind::StringValue("refract_savepoint=/tmp/a=b".into())),
                        },
                    ],
                }),
            ),
        ]);
        assert!(option_bool(&o, "streaming"));
        assert!(!option_bool(&o, "missing"));
        assert_eq!(option_count(&o, "sdk_worker_parallelism"), Ok(Some(2)));
        assert_eq!(option_count(&o, "missing"), Ok(None));
        assert!(has_experiment(&o, "drain_on_start"));
        assert!(!has_experiment(&o, "other"));
        assert_eq!(
            experiment_value(&o, "refract_savepoint").as_deref(),
            Some("/tmp/a=b")
        );
        assert_eq!(experiment_value(&o, "drain_on_start"), None);
    }

    #[test]
    fn a_name_map_is_read_as_an_object_or_its_json_text() {
        let map = |kind: Kind| option_name_map(&options(vec![("m", kind)]), "m");
        let object = Struct {
            fields: [(
                "old".to_string(),
                Value {
                    kind: Some(Kind::StringValue("new".into())),
                },
            )]
            .into_iter()
            .collect(),
        };
        let want: BTreeMap<String, String> = [("old".to_string(), "new".to_string())].into();
        assert_eq!(map(Kind::StructValue(object)), Ok(want.clone()));
        assert_eq!(map(Kind::StringValue(r#"{"old": "new"}"#.into())), Ok(want));
        assert_eq!(option_name_map(&options(vec![]), "m"), Ok(BTreeMap::new()));
        for bad in [Kind::StringValue("old=new".into()), Kind::NumberValue(1.0)] {
            let error = map(bad).expect_err("refused");
            assert!(error.starts_with("--m: expected an object"), "{error}");
        }
    }

    #[test]
    fn a_count_that_is_not_a_whole_number_is_refused_naming_the_option() {
        let count = |kind: Kind| option_count(&options(vec![("n", kind)]), "n");
        assert_eq!(count(Kind::NumberValue(3.0)), Ok(Some(3)));
        assert_eq!(count(Kind::StringValue(" 0 ".into())), Ok(Some(0)));
        assert_eq!(count(Kind::NullValue(0)), Ok(None));
        for bad in [
            Kind::NumberValue(-1.0),
            Kind::NumberValue(1.5),
            Kind::NumberValue(f64::INFINITY),
            Kind::NumberValue(f64::NAN),
            Kind::StringValue("-2".into()),
            Kind::StringValue("many".into()),
            Kind::BoolValue(true),
        ] {
            let e = count(bad.clone()).expect_err(&format!("{bad:?}"));
            assert!(e.starts_with("--n="), "{e}");
            assert!(e.contains("expected a whole number"), "{e}");
        }
    }
}
