//! Label selectors (`k8s.io/apimachinery/pkg/labels` syntax) and the field selectors the server
//! supports (`metadata.name`, `metadata.namespace`). Parse errors are 400 BadRequest.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::meta::{object_name, object_namespace};
use crate::names::{label_key_error, label_value_error};
use crate::status::StatusError;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelRequirement {
    /// `key`
    Exists(String),
    /// `!key`
    NotExists(String),
    /// `key=value`, `key==value`, `key in (a,b)`
    In(String, BTreeSet<String>),
    /// `key!=value`, `key notin (a,b)` (also true when the label is absent)
    NotIn(String, BTreeSet<String>),
    /// `key>N`
    GreaterThan(String, i64),
    /// `key<N`
    LessThan(String, i64),
}

impl LabelRequirement {
    fn matches(&self, labels: Option<&serde_json::Map<String, Value>>) -> bool {
        let get = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        match self {
            Self::Exists(key) => get(key).is_some(),
            Self::NotExists(key) => get(key).is_none(),
            Self::In(key, values) => get(key).is_some_and(|v| values.contains(v)),
            Self::NotIn(key, values) => get(key).is_none_or(|v| !values.contains(v)),
            Self::GreaterThan(key, n) => get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            Self::LessThan(key, n) => get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        }
    }
}

/// A parsed label selector: all requirements must hold; empty matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    /// The requirements, in the order written.
    pub requirements: Vec<LabelRequirement>,
}

impl LabelSelector {
    /// Parses `?labelSelector=`; 400 with the reason on a syntax error.
    pub fn parse(text: &str) -> Result<Self, StatusError> {
        parse_label_selector(text).map_err(|reason| {
            StatusError::bad_request(format!("unable to parse requirement: {text:?}: {reason}"))
        })
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

/// A tiny cursor over the selector text.
struct Cursor<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Cursor<'a> {
    fn skip_spaces(&mut self) {
        while self.text[self.at..].starts_with(' ') {
            self.at += 1;
        }
    }

    fn eat(&mut self, token: &str) -> bool {
        self.skip_spaces();
        if self.text[self.at..].starts_with(token) {
            self.at += token.len();
            true
        } else {
            false
        }
    }

    /// A key or value: everything up to a delimiter.
    fn word(&mut self) -> &'a str {
        self.skip_spaces();
        let rest = &self.text[self.at..];
        let end = rest
            .find([' ', ',', '=', '!', '(', ')', '<', '>'])
            .unwrap_or(rest.len());
        self.at += end;
        &rest[..end]
    }

    fn done(&mut self) -> bool {
        self.skip_spaces();
        self.at >= self.text.len()
    }
}

fn parse_label_selector(text: &str) -> Result<LabelSelector, String> {
    let mut cursor = Cursor { text, at: 0 };
    let mut requirements = Vec::new();
    if cursor.done() {
        return Ok(LabelSelector { requirements });
    }
    loop {
        requirements.push(parse_requirement(&mut cursor)?);
        if cursor.done() {
            return Ok(LabelSelector { requirements });
        }
        if !cursor.eat(",") {
            return Err(format!("found '{}', expected: ','", &text[cursor.at..]));
        }
    }
}

fn checked_key(key: &str) -> Result<String, String> {
    if key.is_empty() {
        return Err("found '', expected: identifier".into());
    }
    match label_key_error(key) {
        Some(reason) => Err(format!("invalid label key {key:?}: {reason}")),
        None => Ok(key.to_string()),
    }
}

fn checked_value(value: &str) -> Result<String, String> {
    match label_value_error(value) {
        Some(reason) => Err(format!("invalid label value: {value:?}: {reason}")),
        None => Ok(value.to_string()),
    }
}

fn parse_requirement(cursor: &mut Cursor<'_>) -> Result<LabelRequirement, String> {
    if cursor.eat("!") {
        return Ok(LabelRequirement::NotExists(checked_key(cursor.word())?));
    }
    let key = checked_key(cursor.word())?;
    let single = |cursor: &mut Cursor<'_>| -> Result<BTreeSet<String>, String> {
        Ok(BTreeSet::from([checked_value(cursor.word())?]))
    };
    if cursor.eat("==") || cursor.eat("=") {
        return Ok(LabelRequirement::In(key, single(cursor)?));
    }
    if cursor.eat("!=") {
        return Ok(LabelRequirement::NotIn(key, single(cursor)?));
    }
    if cursor.eat(">") || cursor.eat("<") {
        let greater = cursor.text[..cursor.at].ends_with('>');
        let word = cursor.word();
        let n: i64 = word.parse().map_err(|_| {
            format!("for 'Gt', 'Lt' operators, the value must be an integer, found {word:?}")
        })?;
        return Ok(if greater {
            LabelRequirement::GreaterThan(key, n)
        } else {
            LabelRequirement::LessThan(key, n)
        });
    }
    let checkpoint = cursor.at;
    match cursor.word() {
        "in" => Ok(LabelRequirement::In(key, value_set(cursor)?)),
        "notin" => Ok(LabelRequirement::NotIn(key, value_set(cursor)?)),
        _ => {
            cursor.at = checkpoint;
            Ok(LabelRequirement::Exists(key))
        }
    }
}

fn value_set(cursor: &mut Cursor<'_>) -> Result<BTreeSet<String>, String> {
    if !cursor.eat("(") {
        return Err("found no '(', expected: '(' after 'in' or 'notin'".into());
    }
    let mut values = BTreeSet::new();
    if cursor.eat(")") {
        return Err("for 'in', 'notin' operators, values set can't be empty".into());
    }
    loop {
        values.insert(checked_value(cursor.word())?);
        if cursor.eat(")") {
            return Ok(values);
        }
        if !cursor.eat(",") {
            return Err("expected ',' or ')' in a value set".into());
        }
    }
}

/// A field the server can select on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SelectableField {
    /// `metadata.name`
    Name,
    /// `metadata.namespace`
    Namespace,
    /// One of [`EVENT_FIELDS`]: (the label, the object's path it reads). Only a kind that
    /// serves it accepts it ([`FieldSelector::unsupported`]).
    Event(&'static str, &'static str),
}

/// kube-apiserver's selectable fields of core `Event`s beyond the metadata ones (its
/// `event.ToSelectableFields`): the label and the path it reads. `kubectl describe` selects an
/// object's events with the four `involvedObject` ones.
pub const EVENT_FIELDS: [(&str, &str); 11] = [
    ("involvedObject.kind", "involvedObject.kind"),
    ("involvedObject.namespace", "involvedObject.namespace"),
    ("involvedObject.name", "involvedObject.name"),
    ("involvedObject.uid", "involvedObject.uid"),
    ("involvedObject.apiVersion", "involvedObject.apiVersion"),
    (
        "involvedObject.resourceVersion",
        "involvedObject.resourceVersion",
    ),
    ("involvedObject.fieldPath", "involvedObject.fieldPath"),
    ("reason", "reason"),
    ("reportingComponent", "reportingComponent"),
    ("source", "source.component"),
    ("type", "type"),
];

/// One `field=value` or `field!=value` term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    /// The field.
    pub field: SelectableField,
    /// `true` for `!=`.
    pub negated: bool,
    /// The value compared with.
    pub value: String,
}

/// A parsed field selector: all terms must hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSelector {
    /// The terms, in the order written.
    pub requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses `?fieldSelector=`; 400 naming the field when it is not `metadata.name` or
    /// `metadata.namespace` (kube's "field label not supported").
    pub fn parse(text: &str) -> Result<Self, StatusError> {
        let mut requirements = Vec::new();
        for term in split_unescaped(text) {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let (field, negated, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, false, v)
            } else {
                return Err(StatusError::bad_request(format!(
                    "invalid selector: '{text}'; can't understand '{term}'"
                )));
            };
            let field = match field.trim() {
                "metadata.name" => SelectableField::Name,
                "metadata.namespace" => SelectableField::Namespace,
                other => match EVENT_FIELDS.iter().find(|(label, _)| *label == other) {
                    Some((label, path)) => SelectableField::Event(label, path),
                    None => return Err(unsupported_field(other)),
                },
            };
            requirements.push(FieldRequirement {
                field,
                negated,
                value: unescape(value.trim()),
            });
        }
        Ok(Self { requirements })
    }

    /// Whether the object satisfies every term (a missing field reads as `""`, as kube's
    /// field sets hold the empty string for an unset one).
    pub fn matches(&self, obj: &Value) -> bool {
        self.requirements.iter().all(|r| {
            let actual = match r.field {
                SelectableField::Name => object_name(obj),
                SelectableField::Namespace => object_namespace(obj),
                SelectableField::Event(_, path) => path
                    .split('.')
                    .try_fold(obj, |value, key| value.get(key))
                    .and_then(Value::as_str)
                    .unwrap_or(""),
            };
            (actual == r.value) != r.negated
        })
    }

    /// 400 "field label not supported" for the first term on an event field when the kind
    /// selected does not serve event fields.
    pub fn unsupported(&self, serves_event_fields: bool) -> Option<StatusError> {
        if serves_event_fields {
            return None;
        }
        self.requirements.iter().find_map(|r| match r.field {
            SelectableField::Event(label, _) => Some(unsupported_field(label)),
            _ => None,
        })
    }

    /// The name an `metadata.name=x` term pins, so the server can read one key instead of
    /// scanning.
    pub fn exact_name(&self) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.field == SelectableField::Name && !r.negated)
            .map(|r| r.value.as_str())
    }
}

fn unsupported_field(label: &str) -> StatusError {
    StatusError::bad_request(format!("field label not supported: {label}"))
}

/// Splits on `,` not preceded by a backslash (fields.ParseSelector's escaping).
fn split_unescaped(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        match c {
            '\\' if !escaped => escaped = true,
            ',' if !escaped => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => escaped = false,
        }
    }
    parts.push(&text[start..]);
    parts
}

fn unescape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(next) = chars.next() {
                out.push(next);
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
#[path = "selector_tests.rs"]
mod tests;
