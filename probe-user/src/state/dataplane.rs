//! What kube-proxy really programmed for one VIP:port, read per question: the correlator asks
//! when the service table from the API says a Service serves a port the kernel just refused
//! (`correlate/unserved.rs`, [`crate::correlate::Query::Programmed`]).

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use probe_contract::{Proto, sock};

use super::ServiceTable;

/// One dataplane read: where it looked, and what it found there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataplaneRead {
    /// Where, as evidence: `kube-proxy iptables rules (nat KUBE-SERVICES, netlink)`.
    pub read: String,
    /// The rule, map element or virtual service for the VIP:port, as text; None: none.
    pub found: Option<String>,
}

/// Reads what the node's kube-proxy programmed for `addr:port/proto`. Blocking.
pub fn programmed(addr: IpAddr, port: u16, proto: Proto) -> anyhow::Result<DataplaneRead> {
    let table = super::read_services()?;
    Ok(lookup(&table, addr, port, proto))
}

/// The answer from a dataplane table (pure).
pub fn lookup(table: &ServiceTable, addr: IpAddr, port: u16, proto: Proto) -> DataplaneRead {
    let read = match table.source {
        Some(super::ServiceSource::Ipvs) => "IPVS virtual services".to_string(),
        Some(super::ServiceSource::Nftables) => "kube-proxy nftables map service-ips".to_string(),
        Some(super::ServiceSource::Iptables) => "kube-proxy iptables nat KUBE-SERVICES".to_string(),
        None => "the node's rules (no kube-proxy rules found)".to_string(),
    };
    let found = table.serves(addr, port, proto).map(|s| {
        format!(
            "{}/{}{}",
            sock(s.vip, s.port),
            s.proto.as_str(),
            s.service
                .as_deref()
                .map(|n| format!(" ({n})"))
                .unwrap_or_default()
        )
    });
    DataplaneRead { read, found }
}
