//! The index's side of the store ([`ApiServiceTable`]): each Service's [`ServiceFacts`] with
//! its ready endpoints, read from the same held slices kube-proxy's view is computed from. An
//! index is built from these facts by pointer (`index::Index::from_facts`); the store holds no
//! second copy of the Services or slices for it (issue #52, BENCHMARKS.md 9f).

use std::{net::IpAddr, sync::Arc};

use probe_core::service::ServiceFacts;

use super::ApiServiceTable;

impl ApiServiceTable {
    /// The Services' facts for the index, in (namespace, name) order (the order the index
    /// lists them in, as `Index::build` sorts them).
    pub fn facts(&self) -> Vec<Arc<ServiceFacts>> {
        let mut list: Vec<&Arc<ServiceFacts>> = self
            .services
            .values()
            .filter(|s| s.indexed)
            .map(|s| &s.facts)
            .collect();
        list.sort_unstable_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        list.into_iter().cloned().collect()
    }

    /// The ready addresses of Service `key`'s slices, sorted, once each (as `Index::build`
    /// reads them: every address of a ready endpoint, of any slice naming the Service).
    fn ready_endpoints(&self, key: &str) -> Box<[IpAddr]> {
        let mut ips: Vec<IpAddr> = self
            .slices_of
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|k| self.slices.get(k))
            .flat_map(|s| s.endpoints.iter().filter(|e| e.ready).map(|e| e.addr))
            .collect();
        ips.sort_unstable();
        ips.dedup();
        ips.into()
    }

    /// Service `key`'s facts with its endpoints as held now: changed in place when no index
    /// holds them, else one copy of this Service's facts (the index keeps the old ones).
    pub(super) fn refresh_facts(&mut self, key: &str) {
        let endpoints = self.ready_endpoints(key);
        if let Some(s) = self.services.get_mut(key)
            && *s.facts.endpoints != *endpoints
        {
            Arc::make_mut(&mut s.facts).endpoints = endpoints;
        }
    }

    pub(super) fn refresh_all_facts(&mut self) {
        let keys: Vec<Arc<str>> = self.services.keys().cloned().collect();
        for key in keys {
            self.refresh_facts(&key);
        }
    }
}
