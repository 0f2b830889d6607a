//! Address prefixes and who owns the node's local addresses (probe-user's `state::addrs` reads
//! them over rtnetlink).

use std::{collections::BTreeMap, net::IpAddr};

use serde::Serialize;

/// Who made each local address local (the agent's node sync publishes it; the correlator and
/// the node report's writer read it). Shared by pointer: a new `Arc` only when owners change.
pub type Owners = std::sync::Arc<BTreeMap<Prefix, probe_contract::facts::AddressOwner>>;

/// Why a prefix did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    #[error("{0:?} is not an IP address or CIDR")]
    NotAnAddress(String),
    #[error("{input:?}: prefix length must be 0..={max}")]
    Length { input: String, max: u8 },
}

/// An IP prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Prefix {
    pub addr: IpAddr,
    pub len: u8,
}

impl Prefix {
    pub fn host(addr: IpAddr) -> Self {
        let len = if addr.is_ipv4() { 32 } else { 128 };
        Self { addr, len }
    }

    /// Parses `a.b.c.d/n`, `x::/n` or a bare address.
    pub fn parse(s: &str) -> Result<Self, PrefixError> {
        let (addr, len) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| PrefixError::NotAnAddress(s.to_owned()))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len =
            match len {
                Some(l) => l.parse::<u8>().ok().filter(|l| *l <= max).ok_or_else(|| {
                    PrefixError::Length {
                        input: s.to_owned(),
                        max,
                    }
                })?,
                None => max,
            };
        Ok(Self { addr, len })
    }

    /// A single address (/32 or /128).
    pub fn is_host(&self) -> bool {
        self.len == if self.addr.is_ipv4() { 32 } else { 128 }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(p), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - self.len as u32).unwrap_or(0);
                u32::from(p) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(p), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - self.len as u32).unwrap_or(0);
                u128::from(p) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for Prefix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}
