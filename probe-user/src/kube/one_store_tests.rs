//! The one store (issue #52) against the stores it replaced: after every kind of watch event
//! and a relist, the store fed event by event derives for each Service the
//! [`PrunedService::from_api`] the table held before, and gives the same expected table, the
//! same index and the same answers as (1) the API table made afresh from kube-proxy's pruned
//! objects ([`PrunedService::from_api`], [`PrunedSlice::from_api`]) and (2) the index built
//! from the objects (`Index::build`, what `kube::kept` was held equal to).

use std::{collections::BTreeMap, net::IpAddr};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use probe_contract::Proto;
use probe_core::service::ServiceFacts;
use serde_json::{Value, json};

use super::{ApiServiceTable, NodeView, PrunedService, PrunedSlice, StoredService};
use crate::{kube::index::Index, state::ServiceSource};

/// The objects the API holds now, by `namespace/name`.
#[derive(Default)]
struct Api {
    services: BTreeMap<String, Service>,
    slices: BTreeMap<String, EndpointSlice>,
}

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

/// One watch event, as the watcher hands it to the store.
enum Event {
    Service(Value),
    DeleteService(&'static str),
    Slice(Value),
    DeleteSlice(&'static str),
    /// Both sources relisted (the Services first, then the slices, as `InitDone` comes).
    Relist,
    /// A change the watch missed (the API has it, the store does not until a relist).
    Missed(Box<Event>),
}

impl Api {
    fn apply(&mut self, store: &mut ApiServiceTable, event: Event) {
        match event {
            Event::Service(v) => {
                let s: Service = serde_json::from_value(v).unwrap();
                let key = key_of(&s.metadata);
                store.apply_stored(&key, StoredService::from_api(&s));
                self.services.insert(key, s);
            }
            Event::DeleteService(key) => {
                store.apply_stored(key, None);
                self.services.remove(key);
            }
            Event::Slice(v) => {
                let s: EndpointSlice = serde_json::from_value(v).unwrap();
                let key = key_of(&s.metadata);
                store.apply_slice(&key, PrunedSlice::held_from_api(&s));
                self.slices.insert(key, s);
            }
            Event::DeleteSlice(key) => {
                store.apply_slice(key, None);
                self.slices.remove(key);
            }
            Event::Relist => {
                store.replace_services(
                    self.services
                        .iter()
                        .filter_map(|(k, s)| Some((k.clone(), StoredService::from_api(s)?))),
                );
                store.replace_slices(
                    self.slices
                        .iter()
                        .filter_map(|(k, s)| Some((k.clone(), PrunedSlice::held_from_api(s)?))),
                );
            }
            Event::Missed(event) => {
                let mut unseen = ApiServiceTable::new(store.node().clone());
                self.apply(&mut unseen, *event);
            }
        }
    }

    /// The API table as it was made before: from kube-proxy's pruned objects only.
    fn table(&self, node: &NodeView) -> ApiServiceTable {
        let mut t = ApiServiceTable::new(node.clone());
        t.replace(
            self.services
                .iter()
                .filter_map(|(k, s)| Some((k.clone(), PrunedService::from_api(s)?))),
            self.slices
                .iter()
                .filter_map(|(k, s)| Some((k.clone(), PrunedSlice::from_api(s)?))),
        );
        t
    }

    fn index(&self) -> Index {
        Index::build([], self.services.values(), self.slices.values())
    }
}

/// The store answers as the table made afresh and the index built from the objects do.
fn same(store: &ApiServiceTable, api: &Api, node: &NodeView, after: &str) {
    // kube-proxy's view of each Service, derived from the held facts, is what the table held
    // before (and the table made afresh holds it through the same derivation: it must give
    // back what it was given).
    for (key, object) in &api.services {
        let pruned = PrunedService::from_api(object);
        let held = store.services.get(key.as_str());
        let view = held.and_then(StoredService::proxy_view).map(|(v, _)| v);
        assert_eq!(view, pruned, "{key} after {after}");
        if let Some(p) = pruned {
            let back = StoredService::from_proxy(key, p.clone()).proxy_view();
            assert_eq!(back.map(|(v, _)| v), Some(p), "{key} after {after}");
        }
    }
    let old = api.table(node);
    let expected = old.expected();
    assert_eq!(store.expected(), expected, "table after {after}");
    assert_eq!(store.service_count(), old.service_count(), "{after}");
    // Every frontend, NodePort and drop the table holds, and some it does not.
    let mut frontends: Vec<(IpAddr, u16, Proto)> = expected
        .services
        .iter()
        .map(|s| (s.vip, s.port, s.proto))
        .collect();
    frontends.push(("10.96.0.10".parse().unwrap(), 81, Proto::Tcp));
    frontends.push(("203.0.113.10".parse().unwrap(), 80, Proto::Udp));
    frontends.push(("203.0.113.40".parse().unwrap(), 443, Proto::Tcp));
    for &(vip, port, proto) in &frontends {
        assert_eq!(
            store.serves(vip, port, proto),
            old.serves(vip, port, proto),
            "{after}"
        );
        assert_eq!(
            store.no_endpoint_drop(vip, port, proto),
            old.no_endpoint_drop(vip, port, proto),
            "{after}"
        );
    }
    for n in &expected.nodeports {
        assert_eq!(
            store.nodeport(n.port, n.proto),
            old.nodeport(n.port, n.proto),
            "{after}"
        );
    }
    for d in &expected.no_endpoint_drops {
        assert_eq!(
            store.no_endpoint_drop(d.addr, d.port, d.proto),
            old.no_endpoint_drop(d.addr, d.port, d.proto),
            "{after}"
        );
    }

    let built = api.index();
    let index = Index::from_facts([], store.facts());
    let mine: Vec<&ServiceFacts> = index.services().collect();
    let theirs: Vec<&ServiceFacts> = built.services().collect();
    assert_eq!(mine, theirs, "index after {after}");
    for &(vip, port, proto) in &frontends {
        assert_eq!(
            index.service_by_frontend(vip, port, proto),
            built.service_by_frontend(vip, port, proto),
            "{after}"
        );
        assert_eq!(
            index.services_by_lb_ip(vip),
            built.services_by_lb_ip(vip),
            "{after}"
        );
    }
    for port in [30053, 30080, 30443, 31000] {
        assert_eq!(
            index.service_by_node_port(port, Proto::Tcp),
            built.service_by_node_port(port, Proto::Tcp),
            "{after}"
        );
    }
}

fn web(etp: &str, lb: &str) -> Value {
    json!({
        "metadata": {"namespace": "shop", "name": "web", "uid": "u-web",
                     "annotations": {"service.beta.kubernetes.io/aws-load-balancer-type": "nlb"}},
        "spec": {"type": "LoadBalancer", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"],
                 "externalTrafficPolicy": etp, "healthCheckNodePort": 31000,
                 "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080},
                           {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30053}]},
        "status": {"loadBalancer": {"ingress": [{"ip": lb}]}}
    })
}

/// `shop/<name>`, a slice of `service` with `endpoints` (`[addresses, node, ready]`).
fn slice(name: &str, service: &str, endpoints: &[(&[&str], &str, bool)]) -> Value {
    let eps: Vec<Value> = endpoints
        .iter()
        .map(|(a, n, r)| {
            json!({"addresses": a, "nodeName": n,
                   "conditions": {"ready": r, "serving": r, "terminating": !r}})
        })
        .collect();
    json!({
        "metadata": {"namespace": "shop", "name": name,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"},
                  {"name": "dns", "port": 5353, "protocol": "UDP"}]
    })
}

/// Every kind of event, in each kube-proxy mode: the one store gives what the stores it
/// replaced gave.
#[test]
fn the_one_store_equals_the_stores_it_replaced_after_every_event_and_a_relist() {
    for mode in [
        ServiceSource::Iptables,
        ServiceSource::Nftables,
        ServiceSource::Ipvs,
    ] {
        let node = NodeView {
            mode,
            node_name: Some("n1".into()),
            node_ips: vec!["192.168.0.2".parse().unwrap()],
        };
        let mut store = ApiServiceTable::new(node.clone());
        let mut api = Api::default();
        let headless = json!({
            "metadata": {"namespace": "shop", "name": "db"},
            "spec": {"clusterIP": "None", "ports": [{"port": 5432}]}
        });
        let other_proxy = json!({
            "metadata": {"namespace": "shop", "name": "mesh",
                         "labels": {"service.kubernetes.io/service-proxy-name": "other"}},
            "spec": {"clusterIP": "10.96.0.30", "ports": [{"port": 443}]}
        });
        let mut headless_slice = slice("db-1", "db", &[(&["10.244.4.1"], "n2", true)]);
        headless_slice["metadata"]["labels"]["service.kubernetes.io/headless"] = json!("");
        let mut fqdn = slice("web-fqdn", "web", &[(&["web.example.com"], "n1", true)]);
        fqdn["addressType"] = json!("FQDN");
        let events = [
            // A slice before its Service.
            (
                "a slice before its Service",
                Event::Slice(slice(
                    "web-1",
                    "web",
                    &[
                        (&["10.244.1.5"], "n1", true),
                        (&["10.244.1.6"], "n2", false),
                    ],
                )),
            ),
            (
                "the Service",
                Event::Service(web("Cluster", "203.0.113.10")),
            ),
            (
                "a second slice, an endpoint of two addresses",
                Event::Slice(slice(
                    "web-2",
                    "web",
                    &[(&["10.244.2.9", "10.244.2.10"], "n2", true)],
                )),
            ),
            ("an FQDN slice", Event::Slice(fqdn)),
            ("a headless Service", Event::Service(headless)),
            ("its slice", Event::Slice(headless_slice)),
            ("another proxy's Service", Event::Service(other_proxy)),
            (
                "a Service of every other setting kube-proxy reads",
                Event::Service(json!({
                    "metadata": {"namespace": "shop", "name": "edge"},
                    "spec": {"type": "NodePort", "clusterIP": "10.96.0.40",
                             "clusterIPs": ["10.96.0.40"], "externalIPs": ["198.51.100.4"],
                             "externalTrafficPolicy": "Local", "internalTrafficPolicy": "Local",
                             "ports": [{"port": 443, "nodePort": 30443},
                                       {"name": "sctp", "port": 9, "protocol": "SCTP"}]},
                    "status": {"loadBalancer": {"ingress": [
                        {"ip": "203.0.113.40", "ipMode": "Proxy"},
                        {"ip": "203.0.113.41", "ipMode": "VIP"}]}}
                })),
            ),
            (
                "its slice",
                Event::Slice(json!({
                    "metadata": {"namespace": "shop", "name": "edge-1",
                                 "labels": {"kubernetes.io/service-name": "edge"}},
                    "addressType": "IPv4",
                    "endpoints": [{"addresses": ["10.244.6.1"], "nodeName": "n1"},
                                  {"addresses": ["10.244.6.2"], "nodeName": "n2"}],
                    "ports": [{"port": 8443, "protocol": "TCP"},
                              {"name": "sctp", "port": 9999, "protocol": "SCTP"}]
                })),
            ),
            (
                "its slice",
                Event::Slice(slice("mesh-1", "mesh", &[(&["10.244.5.1"], "n1", true)])),
            ),
            (
                "the Service changed (ETP Local, another LB IP)",
                Event::Service(web("Local", "203.0.113.11")),
            ),
            (
                "a slice relabelled to another Service",
                Event::Slice(slice("web-2", "mesh", &[(&["10.244.2.9"], "n2", true)])),
            ),
            ("a slice deleted", Event::DeleteSlice("shop/web-1")),
            ("the Service deleted", Event::DeleteService("shop/web")),
            (
                "the Service back, its slices kept",
                Event::Service(web("Cluster", "203.0.113.10")),
            ),
            (
                "a slice of endpoints that all terminate",
                Event::Slice(slice("web-3", "web", &[(&["10.244.3.3"], "n1", false)])),
            ),
            (
                "a missed slice change",
                Event::Missed(Box::new(Event::Slice(slice(
                    "web-3",
                    "web",
                    &[(&["10.244.3.3"], "n1", true)],
                )))),
            ),
            (
                "a missed deletion",
                Event::Missed(Box::new(Event::DeleteSlice("shop/web-fqdn"))),
            ),
            ("a relist", Event::Relist),
            (
                "another proxy's Service deleted",
                Event::DeleteService("shop/mesh"),
            ),
            ("a relist after it", Event::Relist),
        ];
        for (after, event) in events {
            let missed = matches!(event, Event::Missed(_));
            api.apply(&mut store, event);
            if !missed {
                same(&store, &api, &node, &format!("{after} ({mode:?})"));
            }
        }
        // The overall fixtures of kube-proxy's own tests, event by event, then relisted.
        for v in overall("services.json") {
            api.apply(&mut store, Event::Service(v));
        }
        for v in overall("endpointslices.json") {
            api.apply(&mut store, Event::Slice(v));
        }
        same(
            &store,
            &api,
            &node,
            &format!("kube-proxy's fixtures ({mode:?})"),
        );
        api.apply(&mut store, Event::Relist);
        same(&store, &api, &node, &format!("their relist ({mode:?})"));
    }
}

/// Facts an index holds are not changed under it: a slice event copies that one Service's
/// facts, and facts no index holds are changed in place.
#[test]
fn an_index_keeps_the_facts_it_was_built_from() {
    let node = NodeView {
        mode: ServiceSource::Iptables,
        node_name: None,
        node_ips: Vec::new(),
    };
    let mut store = ApiServiceTable::new(node);
    let mut api = Api::default();
    api.apply(&mut store, Event::Service(web("Cluster", "203.0.113.10")));
    let before = std::sync::Arc::as_ptr(&store.facts()[0]);
    api.apply(
        &mut store,
        Event::Slice(slice("web-1", "web", &[(&["10.244.1.5"], "n1", true)])),
    );
    assert_eq!(std::sync::Arc::as_ptr(&store.facts()[0]), before);
    let index = Index::from_facts([], store.facts());
    api.apply(
        &mut store,
        Event::Slice(slice("web-1", "web", &[(&["10.244.1.7"], "n1", true)])),
    );
    let held: Vec<IpAddr> = index.services().next().unwrap().endpoints.to_vec();
    assert_eq!(held, ["10.244.1.5".parse::<IpAddr>().unwrap()]);
    assert_eq!(
        *store.facts()[0].endpoints,
        ["10.244.1.7".parse::<IpAddr>().unwrap()]
    );
}

/// kube-proxy's overall fixtures (`tests/data/kube-proxy/overall/`) as API objects.
fn overall(file: &str) -> Vec<Value> {
    let path = format!(
        "{}/tests/data/kube-proxy/overall/{file}",
        env!("CARGO_MANIFEST_DIR")
    );
    let list: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    list["items"].as_array().unwrap().clone()
}
