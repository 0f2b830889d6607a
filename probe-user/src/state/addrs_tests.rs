//! Unit tests of `addrs.rs`: classifying the lab node's addresses, NIC defaults by node shape,
//! prefixes.

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A unicast `proto kernel` route to `dst` out of `oif` in `table`, without a gateway.
fn kernel_route(dst: &str, oif: u32, table: u32) -> RouteEntry {
    RouteEntry {
        dst: Prefix::parse(dst).unwrap(),
        oif: Some(oif),
        gateway: None,
        table,
        local: false,
        protocol: 2,
    }
}

/// Each of `addrs` looks up as `want` (a failure names the address).
#[track_caller]
fn assert_tagged(sets: &AddressSets, want: Option<Tag>, addrs: &[&str]) {
    for a in addrs {
        assert_eq!(sets.lookup(ip(a)), want, "{a}");
    }
}

/// The lab node: eth0 (NIC), kube-ipvs0 (VIP), two pod veths with /32 routes.
fn lab_node() -> NodeState {
    let link = |index, name: &str, kind: Option<&str>| Link {
        index,
        name: name.into(),
        kind: kind.map(Into::into),
    };
    let addr = |ifindex, a: &str, prefix_len| AddrEntry::plain(ifindex, ip(a), prefix_len);
    let route = |dst: &str, oif, gw: Option<&str>| RouteEntry {
        gateway: gw.map(ip),
        ..kernel_route(dst, oif, 254)
    };
    NodeState {
        links: vec![
            link(1, "lo", None),
            link(2, "eth0", Some("veth")),
            link(3, "kube-ipvs0", Some("bridge")),
            link(4, "vpod-a", Some("veth")),
            link(5, "vpod-b", Some("veth")),
        ],
        addrs: vec![
            addr(1, "127.0.0.1", 8),
            addr(2, "198.18.0.2", 24),
            addr(2, "fe80::1", 64),
            addr(3, "203.0.113.10", 32),
            addr(3, "198.18.100.10", 32),
            addr(4, "198.19.1.1", 32),
        ],
        routes: vec![
            route("0.0.0.0/0", 2, Some("198.18.0.1")),
            route("198.18.0.0/24", 2, None),
            route("198.19.1.10/32", 4, None),
            route("198.19.1.11/32", 5, None),
        ],
        route_sources: vec![ip("198.18.0.2")],
    }
}

fn cfg() -> AddrConfig {
    AddrConfig {
        nics: vec![],
        vip_iface: "kube-ipvs0".into(),
        pod_cidrs: vec![],
    }
}

#[test]
fn classifies_the_lab_node() {
    let sets = classify(&lab_node(), &cfg());
    assert_eq!(sets.nics, vec![("eth0".to_string(), 2)]);
    assert_eq!(sets.vip_iface, Some(("kube-ipvs0".to_string(), 3)));
    assert_tagged(&sets, Some(Tag::Vip), &["203.0.113.10", "198.18.100.10"]);
    assert_tagged(&sets, Some(Tag::Node), &["198.18.0.2", "198.19.1.1"]);
    assert_tagged(&sets, Some(Tag::Pod), &["198.19.1.10", "198.19.1.11"]);
    // The NIC's subnet and the gateway are other hosts, not us.
    assert_tagged(&sets, None, &["198.18.0.1", "198.51.100.10", "fe80::1"]);
    assert_eq!(sets.count(Tag::Vip), 2);
    assert_eq!(sets.count(Tag::Pod), 2);
}

/// Default NICs: which interfaces a node's shape makes monitored without `--nic`. Each row:
/// extra links, extra routes (dst, oif, table), the expected NIC names.
#[test]
fn default_nics_by_node_shape() {
    type Row = (
        &'static str,
        Vec<(u32, &'static str, Option<&'static str>)>,
        Vec<(&'static str, u32, u32)>,
        Vec<&'static str>,
    );
    let rows: Vec<Row> = vec![
        (
            "the lab: eth0 (a veth) has main's default route",
            vec![],
            vec![],
            vec!["eth0"],
        ),
        (
            "secondary ENI: a default route only in its per-ENI table",
            vec![(6, "eth1", Some("veth"))],
            vec![("0.0.0.0/0", 6, 2)],
            vec!["eth0", "eth1"],
        ),
        (
            "IPv6 default route in a per-ENI table",
            vec![(6, "eth1", Some("veth"))],
            vec![("::/0", 6, 10001)],
            vec!["eth0", "eth1"],
        ),
        (
            "a physical device without any route is still a NIC",
            vec![(6, "ens5", None)],
            vec![],
            vec!["eth0", "ens5"],
        ),
        (
            "a virtual device without a default route is not",
            vec![(6, "cni0", Some("bridge")), (7, "flannel.1", Some("vxlan"))],
            vec![("10.244.0.0/16", 7, 254)],
            vec!["eth0"],
        ),
        (
            "a non-default route in another table does not make a NIC",
            vec![(6, "eth1", Some("veth"))],
            vec![("198.18.7.0/24", 6, 2)],
            vec!["eth0"],
        ),
    ];
    for (what, links, routes, want) in rows {
        let mut st = lab_node();
        for (index, name, kind) in links {
            st.links.push(Link {
                index,
                name: name.into(),
                kind: kind.map(Into::into),
            });
        }
        for (dst, oif, table) in routes {
            st.routes.push(kernel_route(dst, oif, table));
        }
        let mut got: Vec<String> = classify(&st, &cfg())
            .nics
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        got.sort();
        let mut want: Vec<String> = want.into_iter().map(String::from).collect();
        want.sort();
        assert_eq!(got, want, "{what}");
    }
}

#[test]
fn pods_come_from_the_main_table_only() {
    let mut st = lab_node();
    // A per-ENI table's route to a pod-facing veth (policy routing for the pod's replies)
    // must not tag anything beyond what main says.
    st.routes.push(kernel_route("198.19.9.0/24", 4, 2));
    let sets = classify(&st, &cfg());
    assert_eq!(sets.lookup(ip("198.19.9.5")), None);
    assert_eq!(sets.lookup(ip("198.19.1.10")), Some(Tag::Pod));
}

#[test]
fn explicit_nics_and_pod_cidrs() {
    let mut c = cfg();
    c.nics = vec!["eth0".into(), "nonexistent0".into()];
    c.pod_cidrs = vec![Prefix::parse("10.244.0.0/16").unwrap()];
    let sets = classify(&lab_node(), &c);
    assert_eq!(sets.nics, vec![("eth0".to_string(), 2)]);
    assert_eq!(sets.lookup(ip("10.244.3.7")), Some(Tag::Pod));
}

#[test]
fn vip_wins_over_node_and_node_over_pod() {
    let mut st = lab_node();
    // The same address on the NIC and on kube-ipvs0.
    st.addrs.push(AddrEntry::plain(2, ip("203.0.113.10"), 32));
    // A pod route covering a node address.
    st.routes.push(kernel_route("198.19.1.1/32", 4, 254));
    let sets = classify(&st, &cfg());
    assert_eq!(sets.lookup(ip("203.0.113.10")), Some(Tag::Vip));
    assert_eq!(sets.lookup(ip("198.19.1.1")), Some(Tag::Node));
}

#[test]
fn missing_vip_interface_is_not_an_error() {
    let mut st = lab_node();
    st.links.retain(|l| l.name != "kube-ipvs0");
    st.addrs.retain(|a| a.ifindex != 3);
    let sets = classify(&st, &cfg());
    assert_eq!(sets.vip_iface, None);
    assert_eq!(sets.count(Tag::Vip), 0);
}

/// Over capacity, each map keeps node addresses, then pods, then VIPs, lowest address first:
/// the same subset whatever the order the addresses came in.
#[test]
fn a_full_map_keeps_a_deterministic_subset() {
    let mut want = BTreeMap::new();
    for i in 0..20u8 {
        want.insert(Prefix::host(IpAddr::from([203, 0, 113, 200 - i])), Tag::Vip);
    }
    want.insert(Prefix::host(ip("198.18.0.2")), Tag::Node);
    want.insert(Prefix::host(ip("198.19.1.10")), Tag::Pod);
    // Other maps have room of their own.
    want.insert(Prefix::parse("10.244.0.0/16").unwrap(), Tag::Pod);
    want.insert(Prefix::host(ip("2001:db8::1")), Tag::Vip);
    let f = fit(&want, 8);
    let hosts_v4: Vec<(String, Tag)> = f
        .kept
        .iter()
        .filter(|(p, _)| p.is_host() && p.addr.is_ipv4())
        .map(|(p, t)| (p.addr.to_string(), *t))
        .collect();
    assert_eq!(hosts_v4.len(), 8);
    assert!(hosts_v4.contains(&("198.18.0.2".into(), Tag::Node)));
    assert!(hosts_v4.contains(&("198.19.1.10".into(), Tag::Pod)));
    let vips: Vec<&str> = hosts_v4
        .iter()
        .filter(|(_, t)| *t == Tag::Vip)
        .map(|(a, _)| a.as_str())
        .collect();
    assert_eq!(
        vips,
        [
            "203.0.113.181",
            "203.0.113.182",
            "203.0.113.183",
            "203.0.113.184",
            "203.0.113.185",
            "203.0.113.186"
        ]
    );
    assert_eq!(f.left_out, BTreeMap::from([(Tag::Vip, 14)]));
    assert!(
        f.kept
            .contains_key(&Prefix::parse("10.244.0.0/16").unwrap())
    );
    assert!(f.kept.contains_key(&Prefix::host(ip("2001:db8::1"))));
    assert_eq!(fit(&want, 100).kept, want, "under capacity: everything");
}

/// Every `local` route of table local is a VIP candidate unless an interface address is
/// behind it; each local address names its owner.
#[test]
fn local_routes_are_vips_and_every_local_address_has_an_owner() {
    let mut st = lab_node();
    let local = |dst: &str, oif, protocol| RouteEntry {
        dst: Prefix::parse(dst).unwrap(),
        oif: Some(oif),
        gateway: None,
        table: 255,
        local: true,
        protocol,
    };
    st.routes.extend([
        // The kernel's own local routes for interface addresses and loopback.
        local("198.18.0.2/32", 2, 2),
        local("203.0.113.10/32", 3, 2),
        local("127.0.0.0/8", 1, 2),
        local("127.0.0.1/32", 1, 2),
        local("::1/128", 1, 2),
        local("fe80::1/128", 2, 2),
        // The GCE guest agent's forwarding-rule IP: a route, no address.
        local("203.0.113.20/32", 2, 66),
        local("2001:db8::20/128", 2, 66),
        // AnyIP over a range, by hand.
        local("192.0.2.0/28", 1, 4),
    ]);
    // The same in another table is no local address.
    st.routes.push(RouteEntry {
        table: 254,
        ..local("203.0.113.30/32", 2, 4)
    });
    // A VIP on the NIC with no mark: held like an announcer holds it, by whom is unknown.
    st.addrs.push(AddrEntry::plain(2, ip("198.18.0.50"), 32));
    let sets = classify(&st, &cfg());
    assert_tagged(
        &sets,
        Some(Tag::Vip),
        &["203.0.113.20", "2001:db8::20", "192.0.2.5"],
    );
    assert_tagged(&sets, None, &["203.0.113.30", "127.0.0.2", "::1"]);
    assert_tagged(&sets, Some(Tag::Node), &["198.18.0.2"]);
    let owner = |a: &str| sets.owner(ip(a)).map(|o| o.to_string());
    assert_eq!(
        owner("203.0.113.20").as_deref(),
        Some(
            "a local route (table local, dev eth0, proto 66 = cloud guest agent) with no \
             interface address"
        )
    );
    assert_eq!(
        sets.owner(ip("192.0.2.5")),
        Some(&AddressOwner::local_route(Some("lo".into()), 4))
    );
    assert_eq!(
        owner("203.0.113.10").as_deref(),
        Some("an address on kube-ipvs0 (kube-proxy IPVS)")
    );
    assert_eq!(
        sets.owner(ip("198.18.0.50"))
            .and_then(AddressOwner::announcer)
            .map(|a| a.name.as_str()),
        Some("unknown")
    );
    assert_eq!(owner("198.18.0.2").as_deref(), Some("an address on eth0"));
    assert_eq!(sets.owner(ip("198.51.100.1")), None);
    let labels: Vec<String> = ["203.0.113.20", "203.0.113.10", "198.18.0.50"]
        .iter()
        .map(|a| sets.owner(ip(a)).unwrap().label())
        .collect();
    assert_eq!(labels, ["route:66", "kube-ipvs0", "announcer:eth0"]);
}

#[test]
fn a_vip_held_like_an_announcer_holds_it_is_a_vip_named_by_its_marks() {
    let mut st = lab_node();
    // kube-vip, ARP mode: a /32 on the NIC with preferred_lft 0.
    st.addrs.push(AddrEntry {
        deprecated: true,
        ..AddrEntry::plain(2, ip("203.0.113.40"), 32)
    });
    // kube-vip, BGP mode: on lo (host scope).
    st.addrs.push(AddrEntry {
        deprecated: true,
        ..AddrEntry::plain(1, ip("203.0.113.41"), 32)
    });
    // keepalived: its address protocol (an rt_addrprotos number), IPv6 /128.
    st.addrs.push(AddrEntry {
        protocol: 99,
        ..AddrEntry::plain(2, ip("2001:db8::41"), 128)
    });
    // Not VIPs: the kernel's own protocol, a /32 that routes send from (a GCE-style node
    // address), a /32 on a pod-facing veth (a CNI's gateway), a second subnet address.
    st.addrs.push(AddrEntry {
        protocol: 1,
        ..AddrEntry::plain(2, ip("198.18.0.60"), 24)
    });
    st.addrs.push(AddrEntry::plain(2, ip("198.18.7.7"), 32));
    st.route_sources.push(ip("198.18.7.7"));
    st.addrs.push(AddrEntry::plain(5, ip("198.19.1.2"), 32));
    // A DHCPv6 lease: a /128 with a finite lifetime, the node's own.
    st.addrs.push(AddrEntry {
        dynamic: true,
        ..AddrEntry::plain(2, ip("2001:db8::77"), 128)
    });
    let sets = classify(&st, &cfg());
    let announcer = |a: &str| {
        sets.owner(ip(a))
            .and_then(AddressOwner::announcer)
            .map(|x| x.name.clone())
    };
    assert_eq!(announcer("203.0.113.40").as_deref(), Some("kube-vip"));
    assert_eq!(announcer("203.0.113.41").as_deref(), Some("kube-vip"));
    assert_eq!(announcer("2001:db8::41").as_deref(), Some("keepalived"));
    for vip in ["203.0.113.40", "203.0.113.41", "2001:db8::41"] {
        assert_eq!(sets.lookup(ip(vip)), Some(Tag::Vip), "{vip}");
    }
    for own in ["198.18.0.60", "198.18.7.7", "198.19.1.1", "198.18.0.2"] {
        assert_eq!(announcer(own), None, "{own}");
        assert_eq!(sets.lookup(ip(own)), Some(Tag::Node), "{own}");
    }
    assert_eq!(announcer("198.19.1.2"), None);
    assert_eq!(announcer("2001:db8::77"), None, "a lease is the node's own");
    assert_eq!(announcer("127.0.0.1"), None, "loopback is the kernel's");
    assert_eq!(
        sets.owner(ip("203.0.113.41")).unwrap().to_string(),
        "a VIP on lo held by kube-vip"
    );
    assert_eq!(
        sets.owner(ip("203.0.113.40")).unwrap().label(),
        "kube-vip:eth0"
    );
}

#[test]
fn route_protocols_are_named() {
    for (n, name) in [
        (2, "kernel"),
        (3, "boot"),
        (4, "static"),
        (18, "keepalived"),
        (66, "cloud guest agent"),
        (186, "bgp"),
        (250, "unknown"),
    ] {
        assert_eq!(AddressOwner::protocol_name(n), name, "{n}");
    }
}

#[test]
fn prefix_parsing_and_containment() {
    assert!(Prefix::parse("10.0.0.0/33").is_err());
    assert!(Prefix::parse("bogus").is_err());
    let p = Prefix::parse("2001:db8::/32").unwrap();
    assert!(p.contains(ip("2001:db8:1::5")));
    assert!(!p.contains(ip("2001:db9::5")));
    assert!(!p.contains(ip("10.0.0.1")));
    assert!(Prefix::parse("0.0.0.0/0").unwrap().contains(ip("1.2.3.4")));
}
