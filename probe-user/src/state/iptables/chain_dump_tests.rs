//! The nat table read chain by chain (a large table, `nft_netlink::WHOLE_DUMP_MAX_CHAINS`)
//! makes the same chains and service table as one dump of it.

use std::process::Command;

use super::read_nat_chains_with;
use crate::state::{changes::FAMILY_IP, test_netns::Netns};

#[test]
fn the_nat_table_read_chain_by_chain_equals_one_dump() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let tool = Command::new("iptables-nft-restore")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !root || !tool {
        return;
    }
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/iptables/lab-kube-proxy.rules"
    ))
    .unwrap();
    let ns = Netns::new("iptchn", &[""]);
    ns.restore_without_comments(0, &["iptables-nft-restore"], &text);
    ns.run_in(0, || {
        let whole = read_nat_chains_with(FAMILY_IP, usize::MAX).unwrap();
        let by_chain = read_nat_chains_with(FAMILY_IP, 0).unwrap();
        assert!(!whole.table().services.is_empty());
        assert_eq!(by_chain.table(), whole.table());
        assert_eq!(
            by_chain.order().collect::<Vec<_>>(),
            whole.order().collect::<Vec<_>>()
        );
        for chain in whole.order() {
            assert_eq!(by_chain.rules(chain), whole.rules(chain), "{chain}");
        }
    });
}
