//! IPVS virtual services of the current network namespace.
//!
//! Read from `/proc/net/ip_vs` (present in every namespace once the `ip_vs` module is loaded,
//! the same table `ipvsadm -Ln` prints). On a kernel without IPVS the file is absent and
//! [`read`] answers `Ok(None)`: the caller then uses kube-proxy's iptables rules.
//!
//! Decision: the text table carries everything the correlator needs (VIP, port, protocol, real
//! servers); the generic-netlink (`IPVS` family) reader replaces it in the VM tier work.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{ServiceEntry, ServiceSource, ServiceTable};
use crate::event::Proto;

pub const PROC_IP_VS: &str = "/proc/net/ip_vs";

/// The IPVS table, or None when this kernel (or namespace) has no IPVS.
pub fn read() -> std::io::Result<Option<ServiceTable>> {
    match std::fs::read_to_string(PROC_IP_VS) {
        Ok(text) => Ok(Some(parse_proc(&text))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Parses `/proc/net/ip_vs`:
/// ```text
/// IP Virtual Server version 1.2.1 (size=4096)
/// Prot LocalAddress:Port Scheduler Flags
///   -> RemoteAddress:Port Forward Weight ActiveConn InActConn
/// TCP  CB00710A:0050 rr
///   -> C613010B:1F90      Masq    1      0          0
/// TCP  [2001:0db8:0000:0000:0000:0000:0000:0001]:0050 rr
/// FWM  00000001 rr
/// ```
/// Firewall-mark services have no address and are skipped. Malformed lines are ignored.
pub fn parse_proc(text: &str) -> ServiceTable {
    let mut table = ServiceTable {
        source: Some(ServiceSource::Ipvs),
        ..Default::default()
    };
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("->") {
            let Some(first) = rest.split_whitespace().next() else {
                continue;
            };
            if let (Some(svc), Some((ip, port))) = (table.services.last_mut(), addr_port(first)) {
                svc.backends.push(socket_string(ip, port));
            }
            continue;
        }
        let mut fields = trimmed.split_whitespace();
        let proto = match fields.next() {
            Some("TCP") => Proto::Tcp,
            Some("UDP") => Proto::Udp,
            Some("SCTP") => Proto::Other(132),
            _ => continue,
        };
        let Some((vip, port)) = fields.next().and_then(addr_port) else {
            continue;
        };
        table.services.push(ServiceEntry {
            vip,
            port,
            proto,
            service: None,
            backends: Vec::new(),
        });
    }
    table
}

fn socket_string(ip: IpAddr, port: u16) -> String {
    match ip {
        IpAddr::V4(a) => format!("{a}:{port}"),
        IpAddr::V6(a) => format!("[{a}]:{port}"),
    }
}

/// `CB00710A:0050` (IPv4, hex, host order as printed) or `[2001:0db8:...]:0050`.
fn addr_port(s: &str) -> Option<(IpAddr, u16)> {
    let (addr, port) = s.rsplit_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip = if let Some(v6) = addr.strip_prefix('[').and_then(|a| a.strip_suffix(']')) {
        IpAddr::V6(v6.parse::<Ipv6Addr>().ok()?)
    } else if addr.len() == 8 {
        IpAddr::V4(Ipv4Addr::from(u32::from_str_radix(addr, 16).ok()?))
    } else {
        return None;
    };
    Some((ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The format of `ip_vs_info_seq_show` (net/netfilter/ipvs/ip_vs_ctl.c): synthesized from
    /// the kernel's format strings; the VM tier checks it against a real kernel.
    const SAMPLE: &str = "\
IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  CB00710A:0050 rr
  -> C613010B:1F90      Masq    1      0          0
  -> C613010C:1F90      Masq    1      0          0
UDP  C6126409:0035 rr
TCP  [2001:0db8:0000:0000:0000:0000:0000:0001]:01BB rr
  -> [2001:0db8:0000:0000:0000:0000:0000:0002]:1F90      Masq    1      0          0
FWM  00000001 rr
garbage line
TCP  ZZZZ:0050 rr
";

    #[test]
    fn parses_services_and_real_servers() {
        let t = parse_proc(SAMPLE);
        assert_eq!(t.source, Some(ServiceSource::Ipvs));
        assert_eq!(t.services.len(), 3);
        let vip: IpAddr = "203.0.113.10".parse().unwrap();
        let web = t
            .serves(vip, 80, Proto::Tcp)
            .expect("203.0.113.10:80 served");
        assert_eq!(web.backends, vec!["198.19.1.11:8080", "198.19.1.12:8080"]);
        assert!(t.serves(vip, 443, Proto::Tcp).is_none());
        assert!(
            t.serves("198.18.100.9".parse().unwrap(), 53, Proto::Udp)
                .is_some()
        );
        let v6 = t
            .serves("2001:db8::1".parse().unwrap(), 443, Proto::Tcp)
            .unwrap();
        assert_eq!(v6.backends, vec!["[2001:db8::2]:8080"]);
    }

    #[test]
    fn empty_table_when_ipvs_has_no_services() {
        let t = parse_proc(
            "IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n",
        );
        assert!(t.services.is_empty());
        assert_eq!(t.source, Some(ServiceSource::Ipvs));
    }
}
