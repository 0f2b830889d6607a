//! `kubectl get`'s server-side printing: a list asked for as a `meta.k8s.io/v1` Table (the
//! `Accept: application/json;as=Table;...` kubectl sends) comes back as the API server would
//! answer it, with the columns a CRD declares (`additionalPrinterColumns`). For the chart's
//! `loopbackreports.clb-probe.io` and `loopbackverifications.clb-probe.io` the columns are read
//! from the chart's own CRD templates, so a test of `kubectl get loopbackreports` (or
//! `loopbackverifications`) checks the columns users will see. Other resources
//! answer with NAME and AGE (what the API server's default table has).

use serde_json::{Value, json};

/// One printer column of a CRD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub name: String,
    pub kind: String,
    pub json_path: String,
    pub priority: u32,
}

/// Whether an `Accept` header asks for a Table.
pub fn wants_table(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        a.split(',')
            .next()
            .is_some_and(|first| first.contains("as=Table"))
    })
}

/// The `additionalPrinterColumns` of a CRD manifest (YAML, the chart's template: its Helm
/// directives are on lines of their own and skipped). Reads the block as the chart writes it:
/// `- name:` items with `type`, `jsonPath` and an optional `priority`.
pub fn printer_columns(crd_yaml: &str) -> Vec<Column> {
    let mut columns = Vec::new();
    let mut inside: Option<usize> = None;
    for line in crd_yaml.lines() {
        let indent = line.len() - line.trim_start().len();
        let text = line.trim();
        if text.starts_with("{{") {
            continue;
        }
        if text == "additionalPrinterColumns:" {
            inside = Some(indent);
            continue;
        }
        let Some(block) = inside else { continue };
        if !text.is_empty() && indent <= block && !text.starts_with('-') {
            break;
        }
        let (item, text) = match text.strip_prefix("- ") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        if item {
            columns.push(Column {
                name: String::new(),
                kind: String::new(),
                json_path: String::new(),
                priority: 0,
            });
        }
        let (Some(c), Some((key, value))) = (columns.last_mut(), text.split_once(':')) else {
            continue;
        };
        let value = value.trim().trim_matches('"').to_string();
        match key.trim() {
            "name" => c.name = value,
            "type" => c.kind = value,
            "jsonPath" => c.json_path = value,
            "priority" => c.priority = value.parse().unwrap_or(0),
            _ => {}
        }
    }
    columns
}

/// The value at a simple JSONPath (`.status.node`, `.spec.nodes[0]`), null when absent.
fn at(object: &Value, path: &str) -> Value {
    path.trim_start_matches('.')
        .split('.')
        .filter(|p| !p.is_empty())
        .try_fold(object, |v, step| {
            // `name[i]`: the field, then its i-th item.
            match step.split_once('[') {
                Some((key, index)) => {
                    let i: usize = index.strip_suffix(']')?.parse().ok()?;
                    v.get(key)?.get(i)
                }
                None => v.get(step),
            }
        })
        .cloned()
        .unwrap_or(Value::Null)
}

/// A `date` cell as the API server prints it: the age (`k8s.io/apimachinery`'s
/// `HumanDuration`), from an RFC 3339 time.
fn age(value: &Value) -> Value {
    let Some(then) = value.as_str().and_then(unix_of_rfc3339) else {
        return value.clone();
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or_default();
    json!(human_duration(now - then))
}

/// Unix seconds of `YYYY-MM-DDTHH:MM:SS[.frac]Z` (what the API writes), None otherwise.
pub fn unix_of_rfc3339(t: &str) -> Option<i64> {
    let t = t.strip_suffix('Z')?;
    let (date, time) = t.split_once('T')?;
    let num = |s: &str| s.parse::<i64>().ok();
    let mut d = date.split('-').map(num);
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut c = time.split('.').next()?.split(':').map(num);
    let (hh, mm, ss) = (c.next()??, c.next()??, c.next()??);
    // Days from the civil date (H. Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// `HumanDuration` of apimachinery's `util/duration`, to the year.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    let (m, h) = (s / 60, s / 3600);
    let with = |big: i64, unit: &str, small: i64, small_unit: &str| {
        if small == 0 {
            format!("{big}{unit}")
        } else {
            format!("{big}{unit}{small}{small_unit}")
        }
    };
    match () {
        _ if s < 120 => format!("{s}s"),
        _ if m < 10 => with(m, "m", s % 60, "s"),
        _ if m < 180 => format!("{m}m"),
        _ if h < 8 => with(h, "h", m % 60, "m"),
        _ if h < 48 => format!("{h}h"),
        _ if h < 24 * 8 => with(h / 24, "d", h % 24, "h"),
        _ if h < 24 * 365 * 2 => format!("{}d", h / 24),
        _ if h < 24 * 365 * 8 => with(h / 24 / 365, "y", (h / 24) % 365, "d"),
        _ => format!("{}y", h / 24 / 365),
    }
}

/// A Table of `items` (objects with their `metadata`) with `columns` after NAME (and AGE when
/// the CRD has none of its own, as the API server does); `date` cells are ages.
pub fn table(columns: &[Column], items: &[Value], resource_version: &str) -> Value {
    let mut defs = vec![json!({"name": "Name", "type": "string", "format": "name",
        "description": "Name must be unique within a namespace.", "priority": 0})];
    let default_age = columns.is_empty();
    for c in columns {
        defs.push(
            json!({"name": c.name, "type": c.kind, "format": "", "description": "",
            "priority": c.priority}),
        );
    }
    if default_age {
        defs.push(
            json!({"name": "Age", "type": "date", "format": "", "description": "",
            "priority": 0}),
        );
    }
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let mut cells = vec![at(o, ".metadata.name")];
            cells.extend(columns.iter().map(|c| {
                let v = at(o, &c.json_path);
                if c.kind == "date" { age(&v) } else { v }
            }));
            if default_age {
                cells.push(age(&at(o, ".metadata.creationTimestamp")));
            }
            json!({
                "cells": cells,
                "object": {
                    "kind": "PartialObjectMetadata",
                    "apiVersion": "meta.k8s.io/v1",
                    "metadata": o.get("metadata").cloned().unwrap_or(Value::Null),
                },
            })
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": defs,
        "rows": rows,
    })
}

/// The printer columns of the chart's LoopbackReport CRD.
pub fn loopbackreport_columns() -> Vec<Column> {
    chart_crd_columns("crd-loopbackreport.yaml")
}

/// The printer columns of the chart's CRD for `resource` (`loopbackreports`,
/// `loopbackverifications`), read from its template as for [`loopbackreport_columns`]; none for
/// the built-in resources (the API server's default NAME and AGE).
pub fn columns_of(resource: &str) -> Vec<Column> {
    match resource {
        "loopbackreports" => loopbackreport_columns(),
        "loopbackverifications" => chart_crd_columns("crd-loopbackverification.yaml"),
        _ => Vec::new(),
    }
}

fn chart_crd_columns(template: &str) -> Vec<Column> {
    let path = crate::workspace_root()
        .join("deploy/helm/clb-probe/templates")
        .join(template);
    std::fs::read_to_string(path)
        .map(|t| printer_columns(&t))
        .unwrap_or_default()
}

/// `unix_secs` as RFC 3339 UTC (`2026-11-27T13:00:00Z`): the inverse of [`unix_of_rfc3339`]
/// (days to civil date as in H. Hinnant's `civil_from_days`).
pub fn rfc3339_of_unix(unix_secs: i64) -> String {
    let (days, secs) = (unix_secs.div_euclid(86_400), unix_secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// Now, as [`rfc3339_of_unix`].
pub fn rfc3339_now() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(0))
        .unwrap_or(0);
    rfc3339_of_unix(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_charts_crd_columns_are_read_and_filled_from_each_object() {
        let columns = loopbackreport_columns();
        let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "Node",
                "Mode",
                "Risks",
                "Active-Loops",
                "Last-Update",
                "Kernel",
                "Agent"
            ]
        );
        assert_eq!(columns[2].json_path, ".status.riskCount");
        assert_eq!(columns[6].priority, 1);
        let t = table(
            &columns,
            &[json!({"metadata": {"name": "node-a"},
                "status": {"node": "node-a", "kubeProxyMode": "ipvs", "riskCount": 2}})],
            "7",
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["node-a", "node-a", "ipvs", 2, null, null, null, null])
        );
        assert_eq!(t["columnDefinitions"][1]["name"], "Node");
        assert!(wants_table(Some(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
        )));
        assert!(!wants_table(Some("application/json")));
        assert!(!wants_table(None));
        assert_eq!(unix_of_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(unix_of_rfc3339("2026-11-25T01:53:50Z"), Some(1_795_571_630));
        assert_eq!(
            unix_of_rfc3339("2024-02-29T12:00:00.5Z"),
            Some(1_709_208_000)
        );
        assert_eq!(unix_of_rfc3339("yesterday"), None);
        for (secs, text) in [
            (5, "5s"),
            (150, "2m30s"),
            (600, "10m"),
            (7_200, "120m"),
            (4 * 3600 + 60, "4h1m"),
            (30 * 3600, "30h"),
            (3 * 86_400, "3d"),
            (400 * 86_400, "400d"),
        ] {
            assert_eq!(human_duration(secs), text);
        }
    }
}
