//! Secrets out of sight: values whose names look secret are replaced by
//! [`REDACTED`] wherever Refract shows them — job messages (the SDK logs
//! its pipeline options at start), `GetJobs`' options, the web UI and the
//! runner's log.
//!
//! A name looks secret when it contains `password`, `passwd`, `secret`,
//! `token` or `credential`, in any case, or ends in the word `key`
//! (`api_key`, `secretKey`, `KEY`; not `handed_out_keys` nor `key_coder`,
//! which are counts and settings, nor `GroupByKey` and `CombinePerKey`,
//! which are Beam's transforms and name stages in Refract's messages). In text, a value is found
//! after such a name in three forms: `name=value` (flags, URLs, log text),
//! a quoted name and a colon (`'name': 'value'` as Python prints a dict,
//! `"name": "value"` in JSON), and `--name value`. An unquoted `name:` is
//! left alone: prose such as `GroupByKey: 3 elements` uses it. SDK workers
//! still receive the options as they were submitted.

use refract_proto::prost_types::{value::Kind, Struct, Value};

/// What a secret value is replaced with.
pub const REDACTED: &str = "***";

/// Words that make a name secret-like wherever they are in it (matched in
/// lower case).
const SECRET_WORDS: &[&str] = &["password", "passwd", "secret", "token", "credential"];

/// Whether an option or field name looks like it holds a secret.
pub fn is_secret_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    SECRET_WORDS.iter().any(|w| lower.contains(w)) || last_word_is_key(name)
}

/// Whether the last word of `name` (words split at `_`, `-`, `.` and
/// lower-to-upper case changes) is `key`, other than in `...ByKey` and
/// `...PerKey` (Beam's grouping transforms).
fn last_word_is_key(name: &str) -> bool {
    let trimmed = name.trim_end_matches(['_', '-', '.']);
    let Some(start) = trimmed.len().checked_sub(3) else {
        return false;
    };
    let Some(word) = trimmed.get(start..) else {
        return false;
    };
    if !word.eq_ignore_ascii_case("key") {
        return false;
    }
    let before = trimmed[..start].chars().next_back();
    let camel = word.starts_with('K')
        && before.is_some_and(|c| c.is_ascii_lowercase())
        && !["By", "Per"].iter().any(|w| trimmed[..start].ends_with(w));
    before.is_none_or(|c| matches!(c, '_' | '-' | '.')) || camel
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')
}

/// Where the value ends when it is not quoted.
fn is_value_end(b: u8) -> bool {
    b.is_ascii_whitespace() || matches!(b, b',' | b'}' | b')' | b']' | b';' | b'&' | b'\'' | b'"')
}

/// `text` with the values of secret-like names replaced by [`REDACTED`].
pub fn redact_text(text: &str) -> std::borrow::Cow<'_, str> {
    let bytes = text.as_bytes();
    // (start, end) of each value to replace, in order.
    let mut values: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let found = match b {
            b'=' => name_before(bytes, i)
                .and_then(|name| is_secret_name(name).then(|| value_at(bytes, i + 1, false))),
            b':' => quoted_name_before(bytes, i).and_then(|name| {
                is_secret_name(name).then(|| value_at(bytes, skip_spaces(bytes, i + 1), false))
            }),
            b'-' if bytes.get(i + 1) == Some(&b'-') && (i == 0 || !is_name_byte(bytes[i - 1])) => {
                flag_value(bytes, i + 2)
            }
            _ => None,
        };
        match found {
            Some((start, end)) if end > start => {
                values.push((start, end));
                i = end;
            }
            _ => i += 1,
        }
    }
    if values.is_empty() {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end) in values {
        out.push_str(&text[at..start]);
        out.push_str(REDACTED);
        at = end;
    }
    out.push_str(&text[at..]);
    std::borrow::Cow::Owned(out)
}

/// The name ending right before `sep` (`name=`).
fn name_before(bytes: &[u8], sep: usize) -> Option<&str> {
    let mut start = sep;
    while start > 0 && is_name_byte(bytes[start - 1]) {
        start -= 1;
    }
    (start < sep)
        .then(|| std::str::from_utf8(&bytes[start..sep]).ok())
        .flatten()
}

/// The quoted name right before `sep` (`'name':`, `"name" :`).
fn quoted_name_before(bytes: &[u8], sep: usize) -> Option<&str> {
    let mut close = sep;
    while close > 0 && bytes[close - 1] == b' ' {
        close -= 1;
    }
    let quote = *bytes.get(close.checked_sub(1)?)?;
    if quote != b'\'' && quote != b'"' {
        return None;
    }
    let end = close - 1;
    let open = bytes[..end].iter().rposition(|&b| b == quote)?;
    std::str::from_utf8(&bytes[open + 1..end]).ok()
}

fn skip_spaces(bytes: &[u8], mut i: usize) -> usize {
    while bytes.get(i) == Some(&b' ') {
        i += 1;
    }
    i
}

/// The value starting at `i`: inside its quotes if quoted, else up to the
/// next delimiter. With `must_follow`, an empty or flag-like value is none.
fn value_at(bytes: &[u8], i: usize, must_follow: bool) -> (usize, usize) {
    match bytes.get(i) {
        Some(&q @ (b'\'' | b'"')) => {
            let start = i + 1;
            let end = bytes[start..]
                .iter()
                .position(|&b| b == q)
                .map_or(bytes.len(), |n| start + n);
            (start, end)
        }
        Some(b'-') if must_follow => (i, i),
        _ => {
            let end = bytes[i..]
                .iter()
                .position(|&b| is_value_end(b))
                .map_or(bytes.len(), |n| i + n);
            (i, end)
        }
    }
}

/// `--name value`: the value of a secret-like flag given after a space
/// (`--name=value` is found at its `=`).
fn flag_value(bytes: &[u8], name_start: usize) -> Option<(usize, usize)> {
    let mut end = name_start;
    while end < bytes.len() && is_name_byte(bytes[end]) {
        end += 1;
    }
    if end == name_start || bytes.get(end) != Some(&b' ') {
        return None;
    }
    let name = std::str::from_utf8(&bytes[name_start..end]).ok()?;
    if !is_secret_name(name) {
        return None;
    }
    Some(value_at(bytes, skip_spaces(bytes, end), true))
}

/// Pipeline options with the values of secret-like options replaced, and
/// secrets inside other string values (an experiment `db_password=x`)
/// redacted as text.
pub fn redact_options(options: &Struct) -> Struct {
    Struct {
        fields: options
            .fields
            .iter()
            .map(|(name, value)| {
                let value = if is_secret_name(option_name(name)) {
                    Value {
                        kind: Some(Kind::StringValue(REDACTED.to_string())),
                    }
                } else {
                    redact_value(value)
                };
                (name.clone(), value)
            })
            .collect(),
    }
}

/// `db_password` of `beam:option:db_password:v1`; other keys as they are.
fn option_name(key: &str) -> &str {
    key.strip_prefix("beam:option:")
        .and_then(|rest| rest.rsplit_once(':').map(|(name, _)| name))
        .unwrap_or(key)
}

fn redact_value(value: &Value) -> Value {
    let kind = match &value.kind {
        Some(Kind::StringValue(s)) => Some(Kind::StringValue(redact_text(s).into_owned())),
        Some(Kind::ListValue(list)) => {
            Some(Kind::ListValue(refract_proto::prost_types::ListValue {
                values: list.values.iter().map(redact_value).collect(),
            }))
        }
        Some(Kind::StructValue(inner)) => Some(Kind::StructValue(redact_options(inner))),
        other => other.clone(),
    };
    Value { kind }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_dicts_json_flags_and_assignments_are_redacted() {
        let cases = [
            (
                "Pipeline_options: {'db_password': 'hunter2', 'runner': 'PortableRunner'}",
                "Pipeline_options: {'db_password': '***', 'runner': 'PortableRunner'}",
            ),
            (
                r#"{"apiToken": "abc123", "n": 3}"#,
                r#"{"apiToken": "***", "n": 3}"#,
            ),
            (
                "args: --aws_secret_access_key=AKIA/x+y --job_name=j",
                "args: --aws_secret_access_key=*** --job_name=j",
            ),
            (
                "run --api_token s3cr3t --fast",
                "run --api_token *** --fast",
            ),
            (
                "jdbc:postgresql://h/db?user=u&password=pw&ssl=1",
                "jdbc:postgresql://h/db?user=u&password=***&ssl=1",
            ),
            ("'Credentials' : \"x y z\"", "'Credentials' : \"***\""),
            ("KEY=value", "KEY=***"),
        ];
        for (text, expected) in cases {
            assert_eq!(redact_text(text), expected, "{text}");
        }
    }

    #[test]
    fn names_ending_in_the_word_key_are_secret_and_others_with_key_are_not() {
        for name in [
            "key",
            "KEY",
            "api_key",
            "apiKey",
            "aws.secret-key",
            "kms_key_",
            "SSH_KEY",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in [
            "handed_out_keys",
            "key_coder",
            "hot_key_logging",
            "monkey",
            "Keyed",
            "sortkeys",
            "GroupByKey",
            "CombinePerKey",
        ] {
            assert!(!is_secret_name(name), "{name}");
        }
        assert_eq!(
            redact_text("finished handed_out_keys=1 api_key=abc"),
            "finished handed_out_keys=1 api_key=***"
        );
    }

    #[test]
    fn ordinary_text_is_left_alone() {
        for text in [
            "GroupByKey: 3 elements",
            "stage 'GroupByKey': spilling to disk",
            "a == b",
            "--runner PortableRunner",
            "--flag=--password",
            "ratio=0.5 done",
            "",
            "=",
            "'unterminated: x",
        ] {
            assert_eq!(redact_text(text), text, "{text}");
        }
        // A flag-like word after a secret flag is the next flag, not its value.
        assert_eq!(redact_text("--token --other"), "--token --other");
    }

    #[test]
    fn options_are_redacted_by_name_and_inside_strings() {
        let string = |s: &str| Value {
            kind: Some(Kind::StringValue(s.into())),
        };
        let options = Struct {
            fields: [
                ("beam:option:db_password:v1".to_string(), string("hunter2")),
                ("beam:option:job_name:v1".to_string(), string("my_job")),
                (
                    "beam:option:experiments:v1".to_string(),
                    Value {
                        kind: Some(Kind::ListValue(refract_proto::prost_types::ListValue {
                            values: vec![string("use_x"), string("secret_key=abc")],
                        })),
                    },
                ),
            ]
            .into_iter()
            .collect(),
        };
        let redacted = redact_options(&options);
        let get = |k: &str| redacted.fields.get(k).cloned().and_then(|v| v.kind);
        assert_eq!(
            get("beam:option:db_password:v1"),
            Some(Kind::StringValue(REDACTED.into()))
        );
        assert_eq!(
            get("beam:option:job_name:v1"),
            Some(Kind::StringValue("my_job".into()))
        );
        let Some(Kind::ListValue(list)) = get("beam:option:experiments:v1") else {
            panic!("experiments")
        };
        assert_eq!(list.values[1], string("secret_key=***"));
    }
}
