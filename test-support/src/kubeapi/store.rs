//! The fake server's objects and their change history (one resourceVersion counter, as etcd).

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// A resource the server knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResourceInfo {
    pub resource: &'static str,
    pub kind: &'static str,
    /// `v1`, `discovery.k8s.io/v1`, ...
    pub api_version: &'static str,
    /// The API group (`""` for core).
    pub group: &'static str,
    pub namespaced: bool,
    /// A `/status` subresource: writes to the object ignore `status`, writes to `/status`
    /// change only `status` (as for a CRD with `subresources.status`).
    pub status_subresource: bool,
}

pub(crate) const RESOURCES: [ResourceInfo; 9] = [
    ResourceInfo {
        resource: "pods",
        kind: "Pod",
        api_version: "v1",
        group: "",
        namespaced: true,
        status_subresource: false,
    },
    ResourceInfo {
        resource: "services",
        kind: "Service",
        api_version: "v1",
        group: "",
        namespaced: true,
        status_subresource: false,
    },
    // The evidence token's Secret (issue #49, H9), read by `kubectl clb-probe evidence`.
    ResourceInfo {
        resource: "secrets",
        kind: "Secret",
        api_version: "v1",
        group: "",
        namespaced: true,
        status_subresource: false,
    },
    ResourceInfo {
        resource: "nodes",
        kind: "Node",
        api_version: "v1",
        group: "",
        namespaced: false,
        status_subresource: true,
    },
    ResourceInfo {
        resource: "endpointslices",
        kind: "EndpointSlice",
        api_version: "discovery.k8s.io/v1",
        group: "discovery.k8s.io",
        namespaced: true,
        status_subresource: false,
    },
    ResourceInfo {
        resource: "events",
        kind: "Event",
        api_version: "events.k8s.io/v1",
        group: "events.k8s.io",
        namespaced: true,
        status_subresource: false,
    },
    // clb-probe's per-node report (the chart's CRD `loopbackreports.clb-probe.io`).
    ResourceInfo {
        resource: "loopbackreports",
        kind: "LoopbackReport",
        api_version: "clb-probe.io/v1alpha1",
        group: "clb-probe.io",
        namespaced: false,
        status_subresource: true,
    },
    // A request to the agents to test a Service now (the chart's CRD
    // `loopbackverifications.clb-probe.io`); each agent patches its node's entry of `status`.
    ResourceInfo {
        resource: "loopbackverifications",
        kind: "LoopbackVerification",
        api_version: "clb-probe.io/v1alpha1",
        group: "clb-probe.io",
        namespaced: false,
        status_subresource: true,
    },
    // The same Events through core/v1 (read only, converted as the API server converts them):
    // `kubectl describe` lists a Service's Events there. Last, so `resource_of("Event")` is
    // the events.k8s.io one.
    ResourceInfo {
        resource: "events",
        kind: "Event",
        api_version: "v1",
        group: "",
        namespaced: true,
        status_subresource: false,
    },
];

/// The core/v1 view of an events.k8s.io/v1 Event (the API server's conversion: `regarding`
/// is `involvedObject`, `note` is `message`, `reportingController` is `reportingComponent` and
/// `source.component`, the `deprecated*` fields lose their prefix).
pub(crate) fn core_event(event: &Value) -> Value {
    let mut core = json!({
        "kind": "Event",
        "apiVersion": "v1",
        "metadata": event["metadata"],
        "involvedObject": event["regarding"],
        "reason": event["reason"],
        "message": event["note"],
        "type": event["type"],
        "action": event["action"],
        "eventTime": event["eventTime"],
        "reportingComponent": event["reportingController"],
        "reportingInstance": event["reportingInstance"],
        "source": {
            "component": event["reportingController"],
            "host": event["reportingInstance"],
        },
    });
    for (from, to) in [
        ("related", "related"),
        ("series", "series"),
        ("deprecatedFirstTimestamp", "firstTimestamp"),
        ("deprecatedLastTimestamp", "lastTimestamp"),
        ("deprecatedCount", "count"),
    ] {
        if !event[from].is_null() {
            core[to] = event[from].clone();
        }
    }
    core
}

/// Whether `info` is the core/v1 view of the Events.
pub(crate) fn is_core_event(info: &ResourceInfo) -> bool {
    info.resource == "events" && info.group.is_empty()
}

/// The resource of a kind (`Pod`) or resource name (`pods`), case-insensitive.
pub(crate) fn resource_of(kind: &str) -> Option<&'static ResourceInfo> {
    RESOURCES
        .iter()
        .find(|r| r.kind.eq_ignore_ascii_case(kind) || r.resource.eq_ignore_ascii_case(kind))
}

/// The resource served at an API group/version path and plural name.
pub(crate) fn resource_at(
    group: &str,
    version: &str,
    resource: &str,
) -> Option<&'static ResourceInfo> {
    RESOURCES.iter().find(|r| {
        let (g, v) = r
            .api_version
            .rsplit_once('/')
            .unwrap_or(("", r.api_version));
        g == group && v == version && r.resource == resource
    })
}

/// One change, as a watch reports it.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub resource_version: u64,
    pub resource: &'static str,
    /// `ADDED`, `MODIFIED`, `DELETED`.
    pub kind: &'static str,
    pub object: Value,
}

/// Why a write was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WriteError {
    AlreadyExists,
    NotFound,
    Invalid(String),
}

type Key = (&'static str, String, String);

#[derive(Default)]
pub(crate) struct Store {
    resource_version: u64,
    objects: BTreeMap<Key, Value>,
    history: Vec<Change>,
    /// resourceVersions at or below this are gone from the history (0: none).
    expired_through: u64,
    next_uid: u64,
}

impl Store {
    pub fn resource_version(&self) -> u64 {
        self.resource_version
    }

    /// Whether a client's resourceVersion is too old to watch or list from.
    pub fn is_expired(&self, resource_version: u64) -> bool {
        resource_version <= self.expired_through
    }

    pub fn expire_history(&mut self) {
        self.expired_through = self.resource_version;
        // Lists now report a version past the expiry, so a relist's watch is not 410 again.
        self.resource_version += 1;
        self.history.clear();
    }

    /// Changes of `resource` after `since`, or `None` if `since` has expired.
    pub fn changes_since(&self, resource: &str, since: u64) -> Option<Vec<Change>> {
        if self.is_expired(since) {
            return None;
        }
        Some(
            self.history
                .iter()
                .filter(|c| c.resource_version > since && c.resource == resource)
                .cloned()
                .collect(),
        )
    }

    pub fn get(&self, resource: &'static str, namespace: &str, name: &str) -> Option<Value> {
        self.objects
            .get(&(resource, namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Objects of `resource` (in `namespace` if given), sorted by namespace and name.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((r, ns, _), _)| *r == resource && namespace.is_none_or(|want| want == ns))
            .map(|(_, object)| object.clone())
            .collect()
    }

    /// [`list`](Self::list) without the copies: `(namespace, name, object)`, in the same order.
    pub fn iter<'a>(
        &'a self,
        resource: &'a str,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a str, &'a str, &'a Value)> + 'a {
        self.objects
            .iter()
            .filter(move |((r, ns, _), _)| {
                *r == resource && namespace.is_none_or(|want| want == ns)
            })
            .map(|((_, ns, name), object)| (ns.as_str(), name.as_str(), object))
    }

    pub fn objects(&self, info: &ResourceInfo) -> Vec<Value> {
        self.list(info.resource, None)
    }

    /// Creates or replaces from a test: the object's `kind` picks the resource.
    pub fn apply(&mut self, object: Value) -> Result<Value, WriteError> {
        let kind = object["kind"].as_str().unwrap_or_default();
        let info = resource_of(kind)
            .ok_or_else(|| WriteError::Invalid(format!("unknown kind {kind:?}")))?;
        let namespace = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_owned();
        self.write(info, &namespace, object, WriteMode::Upsert)
    }

    /// Stores `object` (name from `metadata.name`, or generated from `generateName`).
    pub fn write(
        &mut self,
        info: &'static ResourceInfo,
        namespace: &str,
        mut object: Value,
        mode: WriteMode,
    ) -> Result<Value, WriteError> {
        if !object.is_object() {
            return Err(WriteError::Invalid("the body is not a JSON object".into()));
        }
        let namespace = if info.namespaced {
            namespace.to_owned()
        } else {
            String::new()
        };
        if !object["metadata"].is_object() {
            object["metadata"] = json!({});
        }
        let name = match object["metadata"]["name"].as_str() {
            Some(name) if !name.is_empty() => name.to_owned(),
            _ => match object["metadata"]["generateName"].as_str() {
                Some(prefix) => {
                    self.next_uid += 1;
                    format!("{prefix}{:05x}", self.next_uid)
                }
                None => return Err(WriteError::Invalid("metadata.name: Required value".into())),
            },
        };
        let key = (info.resource, namespace.clone(), name.clone());
        let previous = self.objects.get(&key);
        match (mode, previous) {
            (WriteMode::Create, Some(_)) => return Err(WriteError::AlreadyExists),
            (WriteMode::Replace, None) => return Err(WriteError::NotFound),
            _ => {}
        }
        let (uid, created) = match previous {
            Some(old) => (
                old["metadata"]["uid"].clone(),
                old["metadata"]["creationTimestamp"].clone(),
            ),
            None => {
                self.next_uid += 1;
                (
                    json!(format!("00000000-0000-4000-8000-{:012x}", self.next_uid)),
                    // Set when created, as the API server does (an agent ignores verification
                    // requests older than a bound).
                    json!(super::table::rfc3339_now()),
                )
            }
        };
        let change_kind = if previous.is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        self.resource_version += 1;
        object["kind"] = json!(info.kind);
        object["apiVersion"] = json!(info.api_version);
        let metadata = &mut object["metadata"];
        metadata["name"] = json!(name);
        if info.namespaced {
            metadata["namespace"] = json!(namespace);
        } else if let Some(m) = metadata.as_object_mut() {
            m.remove("namespace");
        }
        metadata["uid"] = uid;
        metadata["creationTimestamp"] = created;
        metadata["resourceVersion"] = json!(self.resource_version.to_string());
        self.objects.insert(key, object.clone());
        self.history.push(Change {
            resource_version: self.resource_version,
            resource: info.resource,
            kind: change_kind,
            object: object.clone(),
        });
        Ok(object)
    }

    pub fn delete(&mut self, info: &ResourceInfo, namespace: &str, name: &str) -> Option<Value> {
        let namespace = if info.namespaced { namespace } else { "" };
        let mut object =
            self.objects
                .remove(&(info.resource, namespace.to_owned(), name.to_owned()))?;
        self.resource_version += 1;
        object["metadata"]["resourceVersion"] = json!(self.resource_version.to_string());
        self.history.push(Change {
            resource_version: self.resource_version,
            resource: info.resource,
            kind: "DELETED",
            object: object.clone(),
        });
        Some(object)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteMode {
    /// POST: refuse an existing name.
    Create,
    /// PUT: refuse a missing name.
    Replace,
    /// A test's apply, or a server-side apply patch.
    Upsert,
}

/// A strategic merge patch as the API server applies it to the lists this fake's clients
/// patch: a list whose patch items are all objects with a `type` (a Node's or a Pod's
/// `status.conditions`, merge key `type`) is merged item by item on `type`; everything
/// else as [`merge_patch`].
pub(crate) fn strategic_merge_patch(target: &mut Value, patch: &Value) {
    apply_patch(target, patch, PatchKind::Strategic);
}

/// RFC 7386 JSON merge patch.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    apply_patch(target, patch, PatchKind::Merge);
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum PatchKind {
    Strategic,
    Merge,
}

/// Both patches: an object merges key by key (null removes), anything else replaces; only
/// the strategic one merges lists of typed items on `type`.
fn apply_patch(target: &mut Value, patch: &Value, kind: PatchKind) {
    let Some(patch) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let target = target.as_object_mut().expect("made an object above");
    for (key, value) in patch {
        let by_type = kind == PatchKind::Strategic
            && value.as_array().is_some_and(|items| {
                items.iter().all(|i| i["type"].is_string()) && !items.is_empty()
            });
        if value.is_null() {
            target.remove(key);
        } else if by_type && target.get(key).is_some_and(Value::is_array) {
            let list = target[key].as_array_mut().expect("checked above");
            for item in value.as_array().expect("checked above") {
                match list.iter_mut().find(|t| t["type"] == item["type"]) {
                    Some(existing) => merge_patch(existing, item),
                    None => list.push(item.clone()),
                }
            }
        } else {
            apply_patch(
                target.entry(key.clone()).or_insert(Value::Null),
                value,
                kind,
            );
        }
    }
}
