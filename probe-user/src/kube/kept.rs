//! What the watcher keeps of Services and EndpointSlices between index builds, instead of
//! kube-runtime's reflector stores (pure: watch events in, [`ServiceFacts`] out).
//!
//! Per Service its facts, the index's entry itself (shared by `Arc`: an index build clones
//! pointers, not Services); per EndpointSlice only its Service and its ready addresses. Each
//! watch event recomputes one Service. Measured at 10,000 Services (`docs/decisions.md`): the
//! two stores of pruned objects held 37 MiB beside an index of 14 MiB built from them again
//! on every change; this holds the index's 14 MiB once.
//!
//! A relist (kube-runtime's `Init`, `InitApply`..., `InitDone`) is gathered beside the kept
//! state and replaces it whole at `InitDone`, as a reflector store does: until then the last
//! complete list stays.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    sync::Arc,
};

use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use probe_core::service::{ServiceFacts, bounded, facts, is_api_name};

use super::service_table::tight;

/// `(namespace, name)`.
type Key = (String, String);

/// One EndpointSlice as kept: its Service's name (in the slice's namespace) and its ready
/// addresses (what the index reads).
#[derive(Clone, Debug, PartialEq, Eq)]
struct KeptSlice {
    service: Box<str>,
    ready: Box<[IpAddr]>,
}

impl KeptSlice {
    /// The slice's key and what is kept of it; None without a namespace, name or Service label.
    fn of(slice: &EndpointSlice) -> Option<(Key, KeptSlice)> {
        let namespace = slice.metadata.namespace.clone()?;
        let name = slice.metadata.name.clone()?;
        let service = slice
            .metadata
            .labels
            .as_ref()?
            .get("kubernetes.io/service-name")?;
        // Ready unless said otherwise (the index's reading, `Index::build`).
        let ready: Vec<IpAddr> = slice
            .endpoints
            .iter()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
            .flat_map(|e| e.addresses.iter())
            .filter_map(|a| a.parse::<IpAddr>().ok())
            .collect();
        Some((
            (namespace, name),
            KeptSlice {
                service: service.as_str().into(),
                ready: ready.into_boxed_slice(),
            },
        ))
    }
}

/// What is kept under one Service's key: its facts when it is a Service the index keeps, and
/// the names of the slices that name it (a slice may come before its Service, or stay after
/// it). One map for both: at 30,000 Services a second map keyed by Service held ~7 MiB of
/// buckets and keys (heaptrack, BENCHMARKS.md 9f).
#[derive(Debug, Default)]
struct KeptService {
    facts: Option<Arc<ServiceFacts>>,
    /// Sorted; a Service has one slice or a few.
    slices: Vec<Box<str>>,
}

/// The Services' facts and their slices' ready addresses, kept per watch event.
#[derive(Debug, Default)]
pub struct Kept {
    /// By (namespace, name): the index lists Services in this order.
    services: BTreeMap<Key, KeptService>,
    /// By (namespace, slice name).
    slices: HashMap<Key, KeptSlice>,
    /// A Services relist in progress: the facts listed so far.
    relisting_services: Option<BTreeMap<Key, Arc<ServiceFacts>>>,
    /// An EndpointSlices relist in progress: the slices listed so far.
    relisting_slices: Option<HashMap<Key, KeptSlice>>,
}

impl Kept {
    /// The Services' facts, in (namespace, name) order.
    pub fn facts(&self) -> impl Iterator<Item = &Arc<ServiceFacts>> {
        self.services.values().filter_map(|s| s.facts.as_ref())
    }

    /// A relist of Services or EndpointSlices is in progress. An index built now would share
    /// the facts that the slices' `InitDone` then changes, one copy each: the watcher waits
    /// (at 30,000 Services the first lists held two copies of every Service's facts, 11 MiB
    /// of the agent's peak; heaptrack, BENCHMARKS.md 9f).
    pub fn relisting(&self) -> bool {
        self.relisting_services.is_some() || self.relisting_slices.is_some()
    }

    /// The ready addresses of `service`'s slices, sorted (as `Index::build` sorts them).
    fn endpoints_of(&self, service: &Key) -> Vec<IpAddr> {
        let Some(kept) = self.services.get(service) else {
            return Vec::new();
        };
        let mut ips: Vec<IpAddr> = kept
            .slices
            .iter()
            .filter_map(|name| self.slices.get(&(service.0.clone(), name.to_string())))
            .flat_map(|s| s.ready.iter().copied())
            .collect();
        ips.sort_unstable();
        ips.dedup();
        tight(ips)
    }

    /// `service`'s facts with its endpoints as kept now; None when the index leaves it out.
    fn facts_of(&self, service: &Service) -> Option<(Key, Arc<ServiceFacts>)> {
        let key = (
            service.metadata.namespace.clone()?,
            service.metadata.name.clone()?,
        );
        let mut endpoints = HashMap::from([(key.clone(), self.endpoints_of(&key))]);
        let f = facts(service, &mut endpoints)?;
        (is_api_name(&f.namespace) && is_api_name(&f.name)).then(|| (key, Arc::new(bounded(f))))
    }

    /// Sets or clears `key`'s facts; an entry with neither facts nor slices is removed.
    fn set_facts(&mut self, key: Key, facts: Option<Arc<ServiceFacts>>) {
        match facts {
            Some(f) => self.services.entry(key).or_default().facts = Some(f),
            None => {
                if let Some(kept) = self.services.get_mut(&key) {
                    kept.facts = None;
                    if kept.slices.is_empty() {
                        self.services.remove(&key);
                    }
                }
            }
        }
    }

    /// A Service created or changed.
    pub fn apply_service(&mut self, service: &Service) {
        match self.facts_of(service) {
            Some((key, f)) => self.set_facts(key, Some(f)),
            // Not indexable now (e.g. a name the index refuses): not kept either.
            None => self.delete_service(service),
        }
    }

    pub fn delete_service(&mut self, service: &Service) {
        if let (Some(ns), Some(name)) = (&service.metadata.namespace, &service.metadata.name) {
            self.set_facts((ns.clone(), name.clone()), None);
        }
    }

    /// An EndpointSlice created or changed: its Service's endpoints (and its former Service's,
    /// when relabelled) follow.
    pub fn apply_slice(&mut self, slice: &EndpointSlice) {
        let Some((key, kept)) = KeptSlice::of(slice) else {
            // No Service label (any more): whatever it was is forgotten.
            self.delete_slice(slice);
            return;
        };
        let new_service = (key.0.clone(), kept.service.to_string());
        let old = self.slices.insert(key.clone(), kept);
        if let Some(old) = old
            && *old.service != *new_service.1
        {
            let old_service = (key.0.clone(), old.service.to_string());
            self.unlink(&old_service, &key.1);
            self.refresh_endpoints(&old_service);
        }
        self.link(new_service.clone(), &key.1);
        self.refresh_endpoints(&new_service);
    }

    pub fn delete_slice(&mut self, slice: &EndpointSlice) {
        let (Some(ns), Some(name)) = (&slice.metadata.namespace, &slice.metadata.name) else {
            return;
        };
        if let Some(old) = self.slices.remove(&(ns.clone(), name.clone())) {
            let service = (ns.clone(), old.service.to_string());
            self.unlink(&service, name);
            self.refresh_endpoints(&service);
        }
    }

    /// Adds slice `name` to `service`'s sorted list (once).
    fn link(&mut self, service: Key, name: &str) {
        let names = &mut self.services.entry(service).or_default().slices;
        if let Err(at) = names.binary_search_by(|n| (**n).cmp(name)) {
            names.insert(at, name.into());
            names.shrink_to_fit();
        }
    }

    fn unlink(&mut self, service: &Key, slice: &str) {
        if let Some(kept) = self.services.get_mut(service) {
            kept.slices.retain(|n| &**n != slice);
            if kept.slices.is_empty() && kept.facts.is_none() {
                self.services.remove(service);
            }
        }
    }

    /// `service`'s facts with its endpoints as kept now (a copy of one Service's facts when
    /// an index holds them; changed in place when not).
    fn refresh_endpoints(&mut self, service: &Key) {
        let endpoints = self.endpoints_of(service);
        if let Some(f) = self
            .services
            .get_mut(service)
            .and_then(|s| s.facts.as_mut())
            && f.endpoints != endpoints
        {
            Arc::make_mut(f).endpoints = endpoints;
        }
    }

    /// A watch failed (a relist that fails starts again with `Init`): what it listed so far is
    /// dropped, the last complete list stays, and indexes are built again meanwhile.
    pub fn relist_failed(&mut self, services: bool) {
        if services {
            self.relisting_services = None;
        } else {
            self.relisting_slices = None;
        }
    }

    /// A Services relist begins (`Init`).
    pub fn services_relist(&mut self) {
        self.relisting_services = Some(BTreeMap::new());
    }

    /// One Service of the relist (`InitApply`).
    pub fn services_relisted(&mut self, service: &Service) {
        let entry = self.facts_of(service);
        if let (Some(list), Some((key, f))) = (&mut self.relisting_services, entry) {
            list.insert(key, f);
        }
    }

    /// The Services relist is complete (`InitDone`): it replaces the kept Services (the
    /// slices' links stay).
    pub fn services_relist_done(&mut self) {
        let Some(list) = self.relisting_services.take() else {
            return;
        };
        for kept in self.services.values_mut() {
            kept.facts = None;
        }
        self.services.retain(|_, kept| !kept.slices.is_empty());
        for (key, f) in list {
            self.services.entry(key).or_default().facts = Some(f);
        }
    }

    /// An EndpointSlices relist begins (`Init`).
    pub fn slices_relist(&mut self) {
        self.relisting_slices = Some(HashMap::new());
    }

    /// One EndpointSlice of the relist (`InitApply`).
    pub fn slices_relisted(&mut self, slice: &EndpointSlice) {
        if let (Some(list), Some((key, kept))) = (&mut self.relisting_slices, KeptSlice::of(slice))
        {
            list.insert(key, kept);
        }
    }

    /// The EndpointSlices relist is complete (`InitDone`): it replaces the kept slices, and
    /// every Service's endpoints follow.
    pub fn slices_relist_done(&mut self) {
        let Some(list) = self.relisting_slices.take() else {
            return;
        };
        for kept in self.services.values_mut() {
            kept.slices = Vec::new();
        }
        self.services.retain(|_, kept| kept.facts.is_some());
        let links: Vec<(Key, String)> = list
            .iter()
            .map(|((ns, name), s)| ((ns.clone(), s.service.to_string()), name.clone()))
            .collect();
        self.slices = list;
        for (service, name) in links {
            self.link(service, &name);
        }
        let services: Vec<Key> = self.services.keys().cloned().collect();
        for s in services {
            self.refresh_endpoints(&s);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::kube::index::Index;

    fn service(ns: &str, name: &str, ip: &str, lb: Option<&str>) -> Service {
        let mut s = json!({
            "metadata": {"namespace": ns, "name": name},
            "spec": {"type": "LoadBalancer", "clusterIP": ip, "clusterIPs": [ip],
                     "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080}]},
        });
        if let Some(lb) = lb {
            s["status"] = json!({"loadBalancer": {"ingress": [{"ip": lb}]}});
        }
        serde_json::from_value(s).unwrap()
    }

    fn slice(
        ns: &str,
        name: &str,
        service: &str,
        ready: &[&str],
        not_ready: &[&str],
    ) -> EndpointSlice {
        let mut endpoints: Vec<_> = ready.iter().map(|a| json!({"addresses": [a]})).collect();
        endpoints.extend(
            not_ready
                .iter()
                .map(|a| json!({"addresses": [a], "conditions": {"ready": false}})),
        );
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "endpoints": endpoints,
        }))
        .unwrap()
    }

    /// The kept facts are exactly what `Index::build` makes from the same objects, after
    /// every kind of event: the index built from them cannot tell the difference.
    #[test]
    fn kept_facts_equal_a_build_from_the_objects() {
        let mut services = vec![
            service("shop", "web", "10.96.0.10", Some("203.0.113.7")),
            service("shop", "api", "10.96.0.11", None),
            service("kube-system", "dns", "10.96.0.12", None),
        ];
        let mut slices = vec![
            slice("shop", "web-1", "web", &["10.244.1.5"], &["10.244.1.6"]),
            slice("shop", "web-2", "web", &["10.244.2.9"], &[]),
            slice("shop", "api-1", "api", &["10.244.3.1"], &[]),
        ];
        let mut kept = Kept::default();
        for s in &services {
            kept.apply_service(s);
        }
        for s in &slices {
            kept.apply_slice(s);
        }
        let same = |kept: &Kept, services: &[Service], slices: &[EndpointSlice]| {
            let built = Index::build([], services, slices);
            let mine: Vec<&ServiceFacts> = kept.facts().map(|f| &**f).collect();
            let theirs: Vec<&ServiceFacts> = built.services().collect();
            assert_eq!(mine, theirs);
        };
        same(&kept, &services, &slices);
        assert_eq!(
            kept.services[&("shop".into(), "web".into())]
                .facts
                .as_ref()
                .unwrap()
                .endpoints,
            [
                "10.244.1.5".parse::<IpAddr>().unwrap(),
                "10.244.2.9".parse().unwrap()
            ]
        );

        // A slice moves to another Service (relabelled), one is deleted, a Service changes.
        slices[1] = slice("shop", "web-2", "api", &["10.244.2.9"], &[]);
        kept.apply_slice(&slices[1]);
        same(&kept, &services, &slices);
        let gone = slices.remove(0);
        kept.delete_slice(&gone);
        same(&kept, &services, &slices);
        services[1] = service("shop", "api", "10.96.0.11", Some("203.0.113.8"));
        kept.apply_service(&services[1]);
        same(&kept, &services, &slices);
        let gone = services.remove(2);
        kept.delete_service(&gone);
        same(&kept, &services, &slices);

        // A relist: until it is done the last list stays; then it replaces everything.
        kept.services_relist();
        kept.slices_relist();
        let relisted = [service("shop", "web", "10.96.0.10", None)];
        let relisted_slices = [slice("shop", "web-9", "web", &["10.244.9.9"], &[])];
        kept.services_relisted(&relisted[0]);
        kept.slices_relisted(&relisted_slices[0]);
        same(&kept, &services, &slices);
        assert!(kept.relisting());
        kept.services_relist_done();
        kept.slices_relist_done();
        assert!(!kept.relisting());
        same(&kept, &relisted, &relisted_slices);

        // A relist that fails is dropped, the last complete list kept.
        kept.slices_relist();
        kept.slices_relisted(&slice("shop", "web-10", "web", &["10.244.10.1"], &[]));
        kept.relist_failed(false);
        assert!(!kept.relisting());
        same(&kept, &relisted, &relisted_slices);
    }

    /// A slice may come before its Service and stay after it: the Service's endpoints are
    /// there whenever it is.
    #[test]
    fn slices_outlive_their_service_s_facts() {
        let mut kept = Kept::default();
        let web = service("shop", "web", "10.96.0.10", None);
        kept.apply_slice(&slice("shop", "web-1", "web", &["10.244.1.5"], &[]));
        assert_eq!(kept.facts().count(), 0);
        kept.apply_service(&web);
        let ready = ["10.244.1.5".parse::<IpAddr>().unwrap()];
        assert_eq!(kept.facts().next().unwrap().endpoints, ready);
        kept.delete_service(&web);
        assert_eq!(kept.facts().count(), 0);
        kept.apply_service(&web);
        assert_eq!(kept.facts().next().unwrap().endpoints, ready);
        // The Service relisted: its slices' links stay.
        kept.services_relist();
        kept.services_relisted(&web);
        kept.services_relist_done();
        assert_eq!(kept.facts().next().unwrap().endpoints, ready);
        kept.delete_slice(&slice("shop", "web-1", "web", &[], &[]));
        kept.delete_service(&web);
        assert!(kept.services.is_empty() && kept.slices.is_empty());
    }

    /// Facts the slices' relist changes are changed in place when nothing else holds them
    /// (the watcher builds no index during a relist): no second copy of every Service.
    #[test]
    fn a_first_list_changes_the_facts_in_place() {
        let mut kept = Kept::default();
        kept.services_relist();
        kept.slices_relist();
        kept.services_relisted(&service("shop", "web", "10.96.0.10", None));
        kept.services_relist_done();
        let before = Arc::as_ptr(kept.facts().next().unwrap());
        kept.slices_relisted(&slice("shop", "web-1", "web", &["10.244.1.5"], &[]));
        kept.slices_relist_done();
        let after = kept.facts().next().unwrap();
        assert_eq!(Arc::as_ptr(after), before);
        assert_eq!(after.endpoints, ["10.244.1.5".parse::<IpAddr>().unwrap()]);
    }
}
