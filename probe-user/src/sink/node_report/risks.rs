//! Which Services a node's risk regards (pure).

/// The address of a risk's subject (`ip`, `ip:port/proto`, `[v6]:port/proto`).
fn subject_ip(subject: &str) -> Option<std::net::IpAddr> {
    let addr = subject.split('/').next().unwrap_or(subject);
    addr.parse()
        .ok()
        .or_else(|| addr.parse::<std::net::SocketAddr>().ok().map(|a| a.ip()))
}

/// Every Service a risk regards, in the order its fixes name them (a shared LB IP's risk
/// names each Service on it, a port's risk the Service serving it), else the Services on
/// its address: `report --service` of any of them shows the risk.
pub fn risk_services(
    f: &probe_contract::check::Finding,
    targets: &[crate::check::LbTarget],
) -> Vec<String> {
    let mut out: Vec<String> = f.fixes.iter().filter_map(|x| x.service.clone()).collect();
    if out.is_empty() {
        let ip = subject_ip(&f.subject);
        out = targets
            .iter()
            .filter(|t| Some(t.ip) == ip)
            .filter_map(|t| t.service.clone())
            .collect();
    }
    // First mention first, each once.
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|s| seen.insert(s.clone()));
    out.truncate(probe_contract::report::MAX_RISK_SERVICES);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_is_an_address_with_or_without_its_port() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().ok();
        assert_eq!(subject_ip("203.0.113.10"), ip("203.0.113.10"));
        assert_eq!(subject_ip("203.0.113.10:443/tcp"), ip("203.0.113.10"));
        assert_eq!(subject_ip("[2001:db8::10]:53/udp"), ip("2001:db8::10"));
        assert_eq!(subject_ip("2001:db8::10"), ip("2001:db8::10"));
        // Not a substring match: 203.0.113.1 is not 203.0.113.10.
        assert_ne!(subject_ip("203.0.113.10"), ip("203.0.113.1"));
    }
}
