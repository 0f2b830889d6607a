//! Unit tests of the nf_tables client: the decoder on captured replies (`tests/data/nft_netlink/`,
//! made by [`real_tables_in_a_namespace`] with `CLB_NFT_CAPTURE`), truncated and garbled
//! input, and the live client in a scratch namespace.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use super::{wire::*, *};
use crate::state::{
    changes::{FAMILY_IP, FAMILY_IP6},
    test_data::data_bytes,
    test_netns::Netns,
};

fn fixture(name: &str) -> Vec<u8> {
    data_bytes(&format!("nft_netlink/{name}"))
}

fn rules_of<'a>(rules: &'a [NftRule], chain: &str) -> Vec<&'a NftRule> {
    rules.iter().filter(|r| r.chain == chain).collect()
}

/// iptables-nft's nat table of `tests/data/iptables/lab-kube-proxy.rules`: compat matches and
/// targets, native payload/cmp/meta, verdicts.
#[test]
fn iptables_nft_rules_decode() {
    let rules = decode_rules(&fixture("lab-nat-rules.bin")).unwrap();
    assert_eq!(rules.len(), 40, "every -A line of the ruleset");
    assert!(
        rules
            .iter()
            .all(|r| r.table == "nat" && r.family == FAMILY_IP)
    );
    let svc = rules_of(&rules, "KUBE-SERVICES");
    let web = svc[0];
    assert!(web.exprs.contains(&Expr::Payload {
        dreg: 1,
        base: NFT_PAYLOAD_NETWORK_HEADER,
        offset: 16,
        len: 4
    }));
    assert!(web.exprs.contains(&Expr::Cmp {
        sreg: 1,
        op: NFT_CMP_EQ,
        data: vec![198, 18, 96, 10]
    }));
    assert!(web.exprs.contains(&Expr::Cmp {
        sreg: 1,
        op: NFT_CMP_EQ,
        data: 80u16.to_be_bytes().to_vec()
    }));
    let comment = web
        .exprs
        .iter()
        .find_map(|e| match e {
            Expr::Match { name, info, .. } if name == "comment" => Some(info.clone()),
            _ => None,
        })
        .expect("a comment match");
    assert!(comment.starts_with(b"default/web:http cluster IP\0"));
    assert_eq!(comment.len(), 256, "struct xt_comment_info");
    assert!(web.exprs.iter().any(|e| matches!(e,
        Expr::Immediate { dreg: 0, data: Data::Verdict(v) } if v.code == NFT_JUMP && v.target() == Some("KUBE-SVC-WEB"))));
    let masq = rules_of(&rules, "KUBE-POSTROUTING");
    assert!(masq.iter().any(|r| r.exprs.iter().any(|e| matches!(e,
        Expr::Target { name, rev: 0, .. } if name == "MASQUERADE"))));
    assert!(masq[0].exprs.iter().any(|e| matches!(
        e,
        Expr::Meta {
            key: NFT_META_MARK,
            dreg: Some(1),
            ..
        }
    )));
    assert!(
        rules
            .iter()
            .all(|r| r.exprs.iter().all(|e| !matches!(e, Expr::Other(_)))),
        "iptables-nft writes nothing this decoder leaves untyped"
    );
}

/// kube-proxy's nftables maps (`tests/data/nftables/etp-local.nft`): keys as concatenated
/// 4-byte registers, verdict data, comments.
#[test]
fn map_elements_decode() {
    let elems = decode_set_elems(&fixture("kube-proxy-service-ips.bin")).unwrap();
    assert_eq!(elems.len(), 3);
    let lb = elems
        .iter()
        .find(|e| e.key[..4] == [192, 0, 2, 44])
        .expect("the LB IP's element");
    assert_eq!(lb.key.len(), 12, "ipv4_addr . inet_proto . inet_service");
    assert_eq!(lb.key[4], 6, "tcp");
    assert_eq!(&lb.key[8..10], &443u16.to_be_bytes());
    match &lb.data {
        Some(Data::Verdict(v)) => {
            assert_eq!(v.code, NFT_GOTO);
            assert!(v.target().unwrap().starts_with("external-"), "{v:?}");
        }
        other => panic!("{other:?}"),
    }
    let rules = decode_rules(&fixture("kube-proxy-rules.bin")).unwrap();
    assert!(rules.iter().any(|r| r.exprs.iter().any(|e| matches!(e,
        Expr::Lookup { set, .. } if set == "service-ips"))));
    assert!(rules.iter().any(|r| r.exprs.iter().any(|e| matches!(
        e,
        Expr::Nat {
            kind: NFT_NAT_DNAT,
            ..
        }
    ))));
    assert!(
        rules
            .iter()
            .any(|r| r.exprs.iter().any(|e| matches!(e, Expr::Masq { .. })))
    );
    assert!(
        rules
            .iter()
            .any(|r| r.exprs.iter().any(|e| matches!(e, Expr::Numgen { .. })))
    );
    assert!(
        rules
            .iter()
            .any(|r| r.exprs.iter().any(|e| matches!(e, Expr::Fib { .. })))
    );
    assert!(
        rules.iter().any(|r| r.comment.is_some()),
        "nft rule comments"
    );
}

/// Every prefix of a captured reply, and every byte of it overwritten, decodes to a result or
/// an error: never a panic, never a read past the buffer.
#[test]
fn truncated_and_garbled_replies_never_panic() {
    for name in [
        "lab-nat-rules.bin",
        "kube-proxy-rules.bin",
        "kube-proxy-service-ips.bin",
    ] {
        let good = fixture(name);
        for cut in 0..good.len().min(4096) {
            let _ = decode_rules(&good[..cut]);
            let _ = decode_set_elems(&good[..cut]);
        }
        let mut bad = good.clone();
        for at in (0..good.len()).step_by(5) {
            for v in [0x00, 0xff, 0x04, 0x80] {
                let was = bad[at];
                bad[at] = v;
                let _ = decode_rules(&bad);
                let _ = decode_set_elems(&bad);
                bad[at] = was;
            }
        }
        // An interrupted dump says so.
        let mut intr = good.clone();
        intr[6] |= NLM_F_DUMP_INTR as u8;
        assert_eq!(decode_rules(&intr), Err(WireError::Interrupted));
    }
    assert!(decode_rules(&[]).unwrap().is_empty());
    assert!(decode_rules(&[1, 2, 3]).is_err());
    // Attribute lengths that lie.
    assert!(attrs("t", &[8, 0, 1, 0, 1]).next().unwrap().is_err());
    assert!(attrs("t", &[2, 0, 1, 0]).next().unwrap().is_err());
    assert!(expr(&[]).is_err(), "an expression without a name");
}

/// A request is an nfgenmsg and NUL-terminated string attributes, each padded to 4 bytes.
#[test]
fn requests_encode() {
    use netlink_packet_core::NetlinkSerializable;
    let req = NftRequest::new(NFT_MSG_GETRULE, FAMILY_IP)
        .with_str(NFTA_RULE_TABLE, "nat")
        .with_str(NFTA_RULE_CHAIN, "KUBE-SERVICES");
    assert_eq!(req.message_type(), 0x0a07);
    let mut buf = vec![0xaa; req.buffer_len()];
    req.serialize(&mut buf);
    assert_eq!(&buf[..4], &[2, 0, 0, 0]);
    let got: Vec<_> = attrs("t", &buf[4..]).map(Result::unwrap).collect();
    assert_eq!(
        got,
        [
            (NFTA_RULE_TABLE, &b"nat\0"[..]),
            (NFTA_RULE_CHAIN, &b"KUBE-SERVICES\0"[..])
        ]
    );
}

#[allow(clippy::print_stdout, reason = "a test's diagnostics")]
fn root_with_tools() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let tools = ["nft", "iptables-nft-restore"].iter().all(|t| {
        Command::new(t)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if !root || !tools {
        eprintln!("skipping: needs root, nft and iptables-nft-restore");
    }
    root && tools
}

/// Loads `file` into `ns`'s namespace with the restore tool `cmd`, its `#` lines left out.
fn load(ns: &Netns, cmd: &[&str], file: &Path) {
    ns.restore_without_comments(0, cmd, &std::fs::read_to_string(file).unwrap());
}

/// The live client in a scratch namespace holding the lab's iptables-nft nat table and the
/// nftables fixture's kube-proxy tables: the generation moves with a commit, chains and
/// per-chain dumps are what was loaded, a missing table is absent. With
/// `CLB_NFT_CAPTURE=<dir>` the raw replies are written there (how `tests/data/nft_netlink/`
/// was made).
#[test]
fn real_tables_in_a_namespace() {
    if !root_with_tools() {
        return;
    }
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let ns = Netns::new("nftnl", &[""]);
    load(
        &ns,
        &["iptables-nft-restore"],
        &data.join("iptables/lab-kube-proxy.rules"),
    );
    load(
        &ns,
        &["nft", "-f", "-"],
        &data.join("nftables/etp-local.nft"),
    );
    ns.run_in(0, || {
        if let Some(dir) = std::env::var_os("CLB_NFT_CAPTURE") {
            let dir = PathBuf::from(dir);
            std::fs::create_dir_all(&dir).unwrap();
            let w = |name: &str, bytes: Vec<u8>| std::fs::write(dir.join(name), bytes).unwrap();
            w("lab-nat-rules.bin", raw_rules(FAMILY_IP, "nat").unwrap());
            w(
                "kube-proxy-rules.bin",
                raw_rules(FAMILY_IP, "kube-proxy").unwrap(),
            );
            w(
                "kube-proxy-service-ips.bin",
                raw_set_elems(FAMILY_IP, "kube-proxy", "service-ips").unwrap(),
            );
        }
        let g0 = super::generation().unwrap();
        assert_eq!(
            super::generation().unwrap(),
            g0,
            "no commit, same generation"
        );
        let all = rules_vec(FAMILY_IP, "nat", None).unwrap();
        assert_eq!(all.len(), 40);
        let svc = rules_vec(FAMILY_IP, "nat", Some("KUBE-SERVICES")).unwrap();
        assert_eq!(
            svc,
            rules_of(&all, "KUBE-SERVICES")
                .into_iter()
                .cloned()
                .collect::<Vec<_>>()
        );
        assert!(
            rules_vec(FAMILY_IP, "nat", Some("NO-SUCH"))
                .unwrap()
                .is_empty()
        );
        let chains = chains(FAMILY_IP, "nat").unwrap();
        assert!(chains.iter().any(|c| c.name == "POSTROUTING" && c.base));
        assert!(chains.iter().any(|c| c.name == "KUBE-SVC-WEB" && !c.base));
        let ips = super::set_elems(FAMILY_IP, "kube-proxy", "service-ips").unwrap();
        assert_eq!(ips.len(), 3);
        let missing = super::set_elems(FAMILY_IP6, "no-such-table", "x").unwrap_err();
        assert!(missing.is_absent(), "{missing}");
        assert!(
            missing.to_string().contains("ip6 no-such-table set x"),
            "{missing}"
        );

        let ok = Command::new("iptables-nft")
            .args([
                "-t",
                "nat",
                "-A",
                "KUBE-SERVICES",
                "-d",
                "10.1.1.1/32",
                "-j",
                "RETURN",
            ])
            .status()
            .unwrap()
            .success();
        assert!(ok);
        assert_ne!(
            super::generation().unwrap(),
            g0,
            "a commit moves the generation"
        );
        assert_eq!(
            rules_vec(FAMILY_IP, "nat", Some("KUBE-SERVICES"))
                .unwrap()
                .len(),
            svc.len() + 1
        );
    });
}
