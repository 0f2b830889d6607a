//! `fieldSelector` and `labelSelector` (the equality-based forms).

use serde_json::Value;

/// A parsed selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
}

impl Selector {
    /// Parses `a=b,c!=d` (and, for labels, `k` / `!k`). Set-based forms (`in`, `notin`) are
    /// refused.
    pub fn parse(text: &str, allow_existence: bool) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let requirement = if let Some((key, value)) = term.split_once("!=") {
                Requirement::NotEquals(key.trim().into(), value.trim().into())
            } else if let Some((key, value)) = term.split_once("==") {
                Requirement::Equals(key.trim().into(), value.trim().into())
            } else if let Some((key, value)) = term.split_once('=') {
                Requirement::Equals(key.trim().into(), value.trim().into())
            } else if term.contains(' ') || term.contains('(') {
                return Err(format!(
                    "unsupported selector term {term:?} (the fake server has equality only)"
                ));
            } else if !allow_existence {
                return Err(format!("invalid field selector term {term:?}"));
            } else if let Some(key) = term.strip_prefix('!') {
                Requirement::NotExists(key.into())
            } else {
                Requirement::Exists(term.into())
            };
            requirements.push(requirement);
        }
        Ok(Self { requirements })
    }

    /// Whether `object`'s fields (dotted JSON path) match.
    pub fn matches_fields(&self, object: &Value) -> bool {
        self.matches(|key| field(object, key))
    }

    /// Whether `object`'s `metadata.labels` match.
    pub fn matches_labels(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        self.matches(|key| labels.get(key).and_then(Value::as_str).map(str::to_owned))
    }

    fn matches(&self, lookup: impl Fn(&str) -> Option<String>) -> bool {
        self.requirements
            .iter()
            .all(|requirement| match requirement {
                Requirement::Equals(key, value) => lookup(key).as_deref() == Some(value.as_str()),
                // The real API compares missing fields as "": `spec.nodeName!=` selects scheduled pods.
                Requirement::NotEquals(key, value) => lookup(key).unwrap_or_default() != *value,
                Requirement::Exists(key) => lookup(key).is_some(),
                Requirement::NotExists(key) => lookup(key).is_none(),
            })
    }
}

/// A dotted path's value as the API's field selectors compare it (strings, numbers, bools).
fn field(object: &Value, path: &str) -> Option<String> {
    let value = path
        .split('.')
        .try_fold(object, |value, part| value.get(part))?;
    match value {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        Value::Bool(flag) => Some(flag.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn field_and_label_equality() {
        let pod = json!({"metadata": {"name": "a", "labels": {"app": "web"}}, "spec": {"nodeName": "n1"}});
        assert!(
            Selector::parse("spec.nodeName=n1", false)
                .unwrap()
                .matches_fields(&pod)
        );
        assert!(
            !Selector::parse("spec.nodeName=n2", false)
                .unwrap()
                .matches_fields(&pod)
        );
        assert!(
            Selector::parse("spec.nodeName!=n2,metadata.name==a", false)
                .unwrap()
                .matches_fields(&pod)
        );
        assert!(
            Selector::parse("app=web", true)
                .unwrap()
                .matches_labels(&pod)
        );
        assert!(Selector::parse("app", true).unwrap().matches_labels(&pod));
        assert!(!Selector::parse("!app", true).unwrap().matches_labels(&pod));
        assert!(
            !Selector::parse("app!=web", true)
                .unwrap()
                .matches_labels(&pod)
        );
        assert!(Selector::parse("app in (web)", true).is_err());
        assert!(
            Selector::parse("", true)
                .unwrap()
                .matches_labels(&json!({}))
        );
    }
}
