//! A pod's bridge port and its `hairpin_mode`, and br_netfilter's sysctl: two of the three
//! pieces a pod's call to its own Service needs on a bridge-based node (kubenet's `cbr0`, the
//! bridge CNI's `cni0`); the third, the hairpin SNAT, is kube-proxy's (`ipset`, conntrack).
//!
//! With br_netfilter on (`net.bridge.bridge-nf-call-iptables=1`, which kube-proxy expects)
//! kube-proxy's DNAT runs while the frame is still being bridged; a DNAT back to the calling
//! pod then sends the frame out the port it came in on, which the bridge does only with
//! `hairpin_mode` on that port (the kubelet's `--hairpin-mode=hairpin-veth`). Everything is
//! read from the calling thread's network namespace: `/proc/net/arp` (the pod's MAC and the
//! device it is reached on), `/sys/class/net/<bridge>/brforward` (the bridge's forwarding
//! table: MAC -> port number), `brif/<port>/{port_no,hairpin_mode}`, and
//! `/proc/sys/net/bridge/`. The parsers are pure; [`read`] does the file reads.

use std::{
    net::{IpAddr, Ipv4Addr},
    path::Path,
};

use super::BridgePort;

/// `/proc/net/arp`: the hardware address and device of `ip`, from a complete entry.
pub fn arp_entry(text: &str, ip: Ipv4Addr) -> Option<([u8; 6], String)> {
    text.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // IP address, HW type, Flags, HW address, Mask, Device; flag 0x2 = complete.
        if f.len() < 6 || f[0].parse::<Ipv4Addr>().ok()? != ip {
            return None;
        }
        let flags = u32::from_str_radix(f[2].trim_start_matches("0x"), 16).ok()?;
        if flags & 0x2 == 0 {
            return None;
        }
        Some((parse_mac(f[3])?, f[5].to_string()))
    })
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// Size of the kernel's `struct __fdb_entry` (uapi `if_bridge.h`), the records of
/// `/sys/class/net/<bridge>/brforward`.
const FDB_ENTRY: usize = 16;

/// The port number `mac` is learned on, from `brforward`'s records (`mac_addr[6]`,
/// `port_no`, `is_local`, `ageing_timer_value` (u32), `port_hi`, pad, unused (u16)); local
/// entries (the bridge's own addresses) are skipped.
pub fn fdb_port(brforward: &[u8], mac: [u8; 6]) -> Option<u16> {
    brforward
        .chunks_exact(FDB_ENTRY)
        .find_map(|e| (e[..6] == mac && e[7] == 0).then(|| u16::from(e[12]) << 8 | u16::from(e[6])))
}

/// The pod's bridge port, read under `sys` (`/sys/class/net`) and `arp` (`/proc/net/arp`):
/// `None` when the pod is not reached through a bridge (a routed veth), has no complete ARP
/// entry, or its MAC is not in the bridge's forwarding table.
pub fn find_port(sys: &Path, arp: &str, pod: Ipv4Addr) -> Option<BridgePort> {
    let (mac, dev) = arp_entry(arp, pod)?;
    let bridge = sys.join(&dev);
    if !bridge.join("bridge").is_dir() {
        return None;
    }
    let port_no = fdb_port(&std::fs::read(bridge.join("brforward")).ok()?, mac)?;
    std::fs::read_dir(bridge.join("brif"))
        .ok()?
        .flatten()
        .find_map(|p| {
            let no = std::fs::read_to_string(p.path().join("port_no")).ok()?;
            let no = u16::from_str_radix(no.trim().trim_start_matches("0x"), 16).ok()?;
            (no == port_no).then(|| BridgePort {
                bridge: dev.clone(),
                port: p.file_name().to_string_lossy().into_owned(),
                hairpin_mode: read_flag(&p.path().join("hairpin_mode")).unwrap_or(false),
            })
        })
}

/// The bridge port `port` of some bridge (the interface a drop on the node arrived on):
/// `None` when it is no bridge port.
pub fn port_of(sys: &Path, port: &str) -> Option<BridgePort> {
    let brport = sys.join(port).join("brport");
    let bridge = std::fs::read_link(brport.join("bridge")).ok()?;
    Some(BridgePort {
        bridge: bridge.file_name()?.to_string_lossy().into_owned(),
        port: port.to_string(),
        hairpin_mode: read_flag(&brport.join("hairpin_mode")).unwrap_or(false),
    })
}

/// Every port of every bridge under `sys` (`/sys/class/net`), with its hairpin mode.
pub fn ports(sys: &Path) -> Vec<BridgePort> {
    let mut out = Vec::new();
    for dev in std::fs::read_dir(sys).into_iter().flatten().flatten() {
        let Ok(brif) = std::fs::read_dir(dev.path().join("brif")) else {
            continue;
        };
        let bridge = dev.file_name().to_string_lossy().into_owned();
        for p in brif.flatten() {
            out.push(BridgePort {
                bridge: bridge.clone(),
                port: p.file_name().to_string_lossy().into_owned(),
                hairpin_mode: read_flag(&p.path().join("hairpin_mode")).unwrap_or(false),
            });
        }
    }
    out.sort_by(|a, b| (&a.bridge, &a.port).cmp(&(&b.bridge, &b.port)));
    out
}

fn read_flag(path: &Path) -> Option<bool> {
    Some(std::fs::read_to_string(path).ok()?.trim() != "0")
}

/// `net.bridge.bridge-nf-call-iptables` (`-ip6tables` for IPv6) of this namespace; `None`
/// when br_netfilter is not loaded (no such sysctl).
pub fn br_netfilter(v6: bool) -> Option<bool> {
    let name = if v6 {
        "bridge-nf-call-ip6tables"
    } else {
        "bridge-nf-call-iptables"
    };
    read_flag(&Path::new("/proc/sys/net/bridge").join(name))
}

/// The bridge facts of a pod that called its own Service: its port found from the interface
/// the looping packet arrived on (`iface`, when that is a bridge port) or else from the ARP
/// table and the bridge's forwarding table; and br_netfilter. Blocking (file reads).
pub fn read(pod: IpAddr, iface: Option<&str>) -> (Option<BridgePort>, Option<bool>) {
    let sys = Path::new("/sys/class/net");
    let port = iface.and_then(|i| port_of(sys, i)).or_else(|| match pod {
        IpAddr::V4(v4) => find_port(
            sys,
            &std::fs::read_to_string("/proc/net/arp").unwrap_or_default(),
            v4,
        ),
        // IPv6 neighbours are not in procfs: the port is known only from the drop's interface.
        IpAddr::V6(_) => None,
    });
    (port, br_netfilter(pod.is_ipv6()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARP: &str = "IP address       HW type     Flags       HW address            Mask     Device\n\
        198.19.3.11      0x1         0x2         5a:1b:2c:3d:4e:5f     *        cbr0\n\
        198.19.3.12      0x1         0x0         00:00:00:00:00:00     *        cbr0\n\
        198.18.0.1       0x1         0x2         aa:bb:cc:dd:ee:01     *        eth0\n";

    #[test]
    fn arp_entries_give_the_mac_and_device_of_complete_entries_only() {
        let ip = |s: &str| s.parse::<Ipv4Addr>().unwrap();
        assert_eq!(
            arp_entry(ARP, ip("198.19.3.11")),
            Some(([0x5a, 0x1b, 0x2c, 0x3d, 0x4e, 0x5f], "cbr0".to_string()))
        );
        assert_eq!(arp_entry(ARP, ip("198.19.3.12")), None, "incomplete");
        assert_eq!(arp_entry(ARP, ip("198.19.3.99")), None);
        assert_eq!(arp_entry("", ip("198.19.3.11")), None);
        assert_eq!(
            arp_entry("header\n1.2.3.4 0x1 0x2 zz *", ip("1.2.3.4")),
            None
        );
    }

    #[test]
    fn fdb_records_map_a_mac_to_its_port_and_skip_local_ones() {
        let rec = |mac: [u8; 6], port: u8, local: u8, hi: u8| {
            let mut r = [0u8; FDB_ENTRY];
            r[..6].copy_from_slice(&mac);
            r[6] = port;
            r[7] = local;
            r[12] = hi;
            r
        };
        let pod = [0x5a, 0x1b, 0x2c, 0x3d, 0x4e, 0x5f];
        let mut table = Vec::new();
        table.extend(rec(pod, 1, 1, 0)); // the same MAC as a local entry: skipped
        table.extend(rec([1, 2, 3, 4, 5, 6], 2, 0, 0));
        table.extend(rec(pod, 3, 0, 1));
        assert_eq!(fdb_port(&table, pod), Some(0x103));
        assert_eq!(fdb_port(&table, [9; 6]), None);
        assert_eq!(fdb_port(&table[..20], pod), None, "a cut record is ignored");
    }
}
