//! Safe apply (pure part): the Service's diff as the API server answers a fix, the undo that
//! restores every field the change moved, and where that undo is kept.
//!
//! The diff and the undo are computed from the Service as read and the server's answer to
//! the fix (its `dryRun=All` answer before applying), not from the fix's own patch: the API
//! server moves fields the patch does not name. `externalTrafficPolicy: Local -> Cluster`
//! releases `healthCheckNodePort`, and the way back allocates a new one unless the undo
//! names the old port, so the undo sets it back explicitly (the LB's health check is
//! configured on that port).
//!
//! **Where the undo is kept: an annotation on the Service itself** ([`UNDO_ANNOTATION`]),
//! written by the same patch that applies the fix (one write, guarded by the same
//! resourceVersion: a fix is never applied without its undo being kept). Not a file under
//! `$XDG_STATE_HOME`: the undo then lives with what it undoes: any operator with the plugin
//! finds it (not only whoever applied the fix, on that machine), it goes away with the
//! Service (no stale undo for a recreated Service of the same name), and it needs no
//! permission beyond the `patch services` the fix already needs. What it costs: the Service
//! carries one more annotation, which a GitOps tool reports as drift (as it does the fix).
//! Whoever can write the annotation can patch the Service anyway, and `--undo` only ever
//! patches that same Service with `spec`, annotations and labels ([`undo_request`] refuses
//! anything else), so a forged annotation grants nothing.
//!
//! `--undo` is guarded: it refuses if a field the fix moved no longer holds what the fix left
//! (someone changed it since: the undo would overwrite their change), and sends the patch
//! with the resourceVersion it checked that against (409 if the Service moves in between).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::fix::Refused;

/// The annotation holding the undo of the fixes applied to the Service ([`UndoRecord`] as
/// JSON).
pub const UNDO_ANNOTATION: &str = "clb-probe.io/undo";

/// One field a change moves; None: unset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    /// `spec.externalTrafficPolicy`, `metadata.annotations["a/b"]`, `spec.ports[0].nodePort`.
    pub path: String,
    pub before: Option<Value>,
    pub after: Option<Value>,
}

/// What `fix --undo` reads back from [`UNDO_ANNOTATION`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UndoRecord {
    /// The fixes applied, oldest first.
    pub fixes: Vec<String>,
    /// The merge patch restoring every field the fixes moved to its value before the first.
    pub restore: Value,
    /// Those fields as the fixes left them (null: unset): `--undo` refuses once one moved.
    pub left: Value,
}

/// The parts of a Service a fix may move: `spec`, `metadata.annotations` (without
/// [`UNDO_ANNOTATION`]) and `metadata.labels`. Status, resourceVersion, managedFields are the
/// server's.
fn movable(service: &Value) -> Value {
    let mut metadata = Map::new();
    if let Some(annotations) = service["metadata"]["annotations"].as_object() {
        let mut annotations = annotations.clone();
        annotations.remove(UNDO_ANNOTATION);
        if !annotations.is_empty() {
            metadata.insert("annotations".into(), Value::Object(annotations));
        }
    }
    if let Some(labels) = service["metadata"]["labels"].as_object()
        && !labels.is_empty()
    {
        metadata.insert("labels".into(), Value::Object(labels.clone()));
    }
    let mut out = Map::new();
    if !metadata.is_empty() {
        out.insert("metadata".into(), Value::Object(metadata));
    }
    if !service["spec"].is_null() {
        out.insert("spec".into(), service["spec"].clone());
    }
    Value::Object(out)
}

/// A path step: `.name`, or `["a/b.c"]` for keys a dot would make ambiguous.
fn step(parent: &str, key: &str) -> String {
    let plain = key
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    match (parent.is_empty(), plain) {
        (true, _) => key.to_string(),
        (false, true) => format!("{parent}.{key}"),
        (false, false) => format!("{parent}[{}]", Value::from(key)),
    }
}

fn collect(path: &str, before: Option<&Value>, after: Option<&Value>, out: &mut Vec<Change>) {
    let before = before.filter(|v| !v.is_null());
    let after = after.filter(|v| !v.is_null());
    if before == after {
        return;
    }
    let empty = Value::Object(Map::new());
    // An object on one side only (annotations added where there were none): per key.
    let (before, after) = match (before, after) {
        (None, Some(Value::Object(_))) => (Some(&empty), after),
        (Some(Value::Object(_)), None) => (before, Some(&empty)),
        sides => sides,
    };
    match (before, after) {
        (Some(Value::Object(b)), Some(Value::Object(a))) => {
            let mut keys: Vec<&String> = b.keys().chain(a.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                collect(&step(path, k), b.get(k), a.get(k), out);
            }
        }
        // Same length: per element (a port's nodePort); else the list as a whole.
        (Some(Value::Array(b)), Some(Value::Array(a))) if a.len() == b.len() => {
            for (i, (b, a)) in b.iter().zip(a).enumerate() {
                collect(&format!("{path}[{i}]"), Some(b), Some(a), out);
            }
        }
        _ => out.push(Change {
            path: path.to_string(),
            before: before.cloned(),
            after: after.cloned(),
        }),
    }
}

/// The fields of the Service that differ between `before` and `after` (whole Service
/// objects as the API gives them), in path order.
pub fn changes(before: &Value, after: &Value) -> Vec<Change> {
    let mut out = Vec::new();
    collect("", Some(&movable(before)), Some(&movable(after)), &mut out);
    out
}

/// `  spec.externalTrafficPolicy: "Local" -> "Cluster"` per change; `(unset)` for absent.
pub fn render_changes(changes: &[Change]) -> String {
    let show = |v: &Option<Value>| v.as_ref().map_or("(unset)".to_string(), Value::to_string);
    let mut out = String::new();
    for c in changes {
        let _ = writeln!(
            out,
            "  {}: {} -> {}",
            c.path,
            show(&c.before),
            show(&c.after)
        );
    }
    out
}

/// The merge patch that takes `to`'s movable fields from `from`'s values back to `to`'s:
/// per differing key `to`'s value (null where `to` has none); objects key by key, lists
/// whole (a merge patch replaces lists).
fn merge_diff(from: &Value, to: &Value) -> Option<Value> {
    match (from, to) {
        (Value::Object(f), Value::Object(t)) => {
            let mut out = Map::new();
            for (k, tv) in t {
                if let Some(d) = merge_diff(f.get(k).unwrap_or(&Value::Null), tv) {
                    out.insert(k.clone(), d);
                }
            }
            for (k, fv) in f {
                if fv.is_null() || t.get(k).is_some_and(|v| !v.is_null()) {
                    continue;
                }
                // An object `to` lacks (annotations a fix added to a Service that had none)
                // is undone key by key: a null for the object itself would ask the server to
                // drop all of `metadata` (refused) or every annotation, others' included.
                let undo = match fv {
                    Value::Object(_) => merge_diff(fv, &Value::Object(Map::new())),
                    _ => Some(Value::Null),
                };
                if let Some(undo) = undo {
                    out.insert(k.clone(), undo);
                }
            }
            (!out.is_empty()).then_some(Value::Object(out))
        }
        _ if from == to || to.is_null() && from.is_null() => None,
        _ => Some(to.clone()),
    }
}

/// The undo of one applied change: `restore` takes `after` back to `before`, `left` is what
/// the change left (the forward diff), both on the movable fields only.
pub fn undo_of(fix_id: &str, before: &Value, after: &Value) -> UndoRecord {
    let (before, after) = (movable(before), movable(after));
    UndoRecord {
        fixes: vec![fix_id.to_string()],
        restore: merge_diff(&after, &before).unwrap_or_else(|| json!({})),
        left: merge_diff(&before, &after).unwrap_or_else(|| json!({})),
    }
}

/// `first` then `then` as one merge patch (`then` wins; its nulls stay nulls, to delete).
fn compose(first: &Value, then: &Value) -> Value {
    match (first, then) {
        (Value::Object(f), Value::Object(t)) => {
            let mut out = f.clone();
            for (k, tv) in t {
                let merged = match out.get(k) {
                    Some(fv) if fv.is_object() && tv.is_object() => compose(fv, tv),
                    _ => tv.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        _ => then.clone(),
    }
}

impl UndoRecord {
    /// `self` (a later fix) on top of `earlier` (the record already on the Service): the
    /// restore goes back to before the first fix, the left state is the latest.
    pub fn on_top_of(self, earlier: Option<UndoRecord>) -> UndoRecord {
        let Some(earlier) = earlier else { return self };
        UndoRecord {
            fixes: earlier.fixes.into_iter().chain(self.fixes).collect(),
            restore: compose(&self.restore, &earlier.restore),
            left: compose(&earlier.left, &self.left),
        }
    }

    /// The record as the annotation holds it.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The record already on `service`; an annotation that does not parse is refused (applying
/// over it would lose the earlier undo).
pub fn kept(service: &Value) -> Result<Option<UndoRecord>, Refused> {
    let Some(raw) = service["metadata"]["annotations"][UNDO_ANNOTATION].as_str() else {
        return Ok(None);
    };
    let record: UndoRecord = serde_json::from_str(raw).map_err(|e| {
        Refused(format!(
            "the annotation {UNDO_ANNOTATION} on the Service does not parse ({e}): restore the \
             Service by hand and remove the annotation"
        ))
    })?;
    // Only what `undo_of` writes: `spec`, annotations, labels; never the record itself.
    let shaped = |patch: &Value| {
        patch.as_object().is_some_and(|top| {
            top.iter().all(|(k, v)| match k.as_str() {
                "spec" => v.is_object(),
                "metadata" => v.as_object().is_some_and(|m| {
                    m.keys().all(|k| k == "annotations" || k == "labels")
                        && v["annotations"].get(UNDO_ANNOTATION).is_none()
                }),
                _ => false,
            })
        })
    };
    if !shaped(&record.restore) || !shaped(&record.left) {
        return Err(Refused(format!(
            "the annotation {UNDO_ANNOTATION} on the Service touches more than spec, \
             annotations and labels: not written by clb-probe; not applied"
        )));
    }
    Ok(Some(record))
}

/// The patch `--apply` sends: the fix's guarded patch, plus the undo kept in the annotation.
pub fn apply_patch(guarded_fix_patch: &Value, record: &UndoRecord) -> Value {
    compose(
        guarded_fix_patch,
        &json!({"metadata": {"annotations": {UNDO_ANNOTATION: record.to_annotation()}}}),
    )
}

/// The undo as one merge patch without a version guard (for `kubectl patch` by hand): the
/// restore, and the annotation removed.
pub fn restore_patch(record: &UndoRecord) -> Value {
    compose(
        &record.restore,
        &json!({"metadata": {"annotations": {UNDO_ANNOTATION: null}}}),
    )
}

/// The fields of `left` (a merge patch's shape) whose value in `current` differs.
fn moved_since(path: &str, left: &Value, current: &Value, out: &mut Vec<Change>) {
    match left {
        Value::Object(fields) => {
            for (k, v) in fields {
                moved_since(&step(path, k), v, &current[k.as_str()], out);
            }
        }
        _ if left == current || left.is_null() && current.is_null() => {}
        _ => out.push(Change {
            path: path.to_string(),
            before: (!left.is_null()).then(|| left.clone()),
            after: (!current.is_null()).then(|| current.clone()),
        }),
    }
}

/// The patch `fix --undo` sends to `current` (the Service as read now): the kept restore,
/// the annotation removed, guarded by `current`'s resourceVersion. Refused when nothing is
/// kept, or when a field the fixes moved has moved again since (its value now is named).
pub fn undo_request(current: &Value) -> Result<(UndoRecord, Value), Refused> {
    let service = format!(
        "{}/{}",
        current["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default(),
        current["metadata"]["name"].as_str().unwrap_or_default()
    );
    let Some(record) = kept(current)? else {
        return Err(Refused(format!(
            "no undo kept on Service {service} (annotation {UNDO_ANNOTATION}): no fix applied \
             with `kubectl clb-probe fix --apply`, or already undone"
        )));
    };
    let mut moved = Vec::new();
    moved_since("", &record.left, &movable(current), &mut moved);
    if !moved.is_empty() {
        return Err(Refused(format!(
            "Service {service} changed since {} was applied (left -> now):\n{}the undo would \
             overwrite that; restore by hand if still wanted: {}",
            record.fixes.join(", "),
            render_changes(&moved),
            restore_patch(&record)
        )));
    }
    let mut patch = restore_patch(&record);
    if let Some(rv) = current["metadata"]["resourceVersion"].as_str() {
        patch["metadata"]["resourceVersion"] = json!(rv);
    }
    Ok((record, patch))
}

#[cfg(test)]
#[path = "undo_tests.rs"]
mod tests;
