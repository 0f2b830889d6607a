//! [`table_rules`] chain by chain hands over exactly what one dump of the table does: the
//! same rules in the same order (iptables-nft's nat table and kube-proxy's nftables table).

use std::{path::Path, process::Command};

use super::{table_rules, wire::NftRule};
use crate::state::{
    changes::{FAMILY_IP, FAMILY_IP6},
    test_netns::Netns,
};

fn root_with_tools() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && ["nft", "iptables-nft-restore"].iter().all(|t| {
        Command::new(t)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

fn collected(family: u8, table: &str, max_whole_chains: usize) -> Vec<NftRule> {
    let out = std::cell::RefCell::new(Vec::new());
    table_rules(
        family,
        table,
        max_whole_chains,
        &mut || out.borrow_mut().clear(),
        &mut |r| out.borrow_mut().push(r),
    )
    .unwrap();
    out.into_inner()
}

#[test]
fn chain_by_chain_equals_one_dump() {
    if !root_with_tools() {
        return;
    }
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let ns = Netns::new("nftchn", &[""]);
    let load = |cmd: &[&str], file: &str| {
        ns.restore_without_comments(0, cmd, &std::fs::read_to_string(data.join(file)).unwrap())
    };
    load(&["iptables-nft-restore"], "iptables/lab-kube-proxy.rules");
    load(&["nft", "-f", "-"], "nftables/etp-local.nft");
    ns.run_in(0, || {
        for table in ["nat", "kube-proxy"] {
            let whole = collected(FAMILY_IP, table, usize::MAX);
            assert!(whole.len() > 10, "{table}: {} rules", whole.len());
            assert_eq!(collected(FAMILY_IP, table, 0), whole, "{table}");
        }
        // A missing table: no rules either way (or absent).
        for max in [0, usize::MAX] {
            let out = std::cell::RefCell::new(Vec::new());
            match table_rules(FAMILY_IP6, "no-such", max, &mut || {}, &mut |r| {
                out.borrow_mut().push(r)
            }) {
                Ok(()) => assert!(out.borrow().is_empty()),
                Err(e) => assert!(e.is_absent(), "{e}"),
            }
        }
    });
}
