//! kube-proxy's nat rules, read from `iptables-save -t nat` (and `ip6tables-save -t nat`).
//!
//! [`parse_iptables_save`] is pure: it turns the text of `iptables-save -t nat` (or of
//! `iptables -t nat -S [-v]`, or a `grep` of either) into a [`ServiceTable`]:
//!
//! - `KUBE-SERVICES` rules with a `-d VIP/32 --dport P` match that jump to a service chain
//!   (`KUBE-SVC-*`, `KUBE-EXT-*`, `KUBE-FW-*`, `KUBE-XLB-*`, `KUBE-SVL-*`) become
//!   [`ServiceEntry`]s: cluster IPs, external IPs and load-balancer IPs alike;
//! - backends are the `DNAT --to-destination` targets of the `KUBE-SEP-*` chains reachable from
//!   that service chain;
//! - `KUBE-NODEPORTS` rules become [`NodePortEntry`]s. `local_only` (externalTrafficPolicy: Local)
//!   is recognised the way kube-proxy writes it: older releases (< 1.24) jump to a `KUBE-XLB-*`
//!   chain; newer ones jump to a `KUBE-EXT-*` chain which, for `Local`, masquerades only
//!   `--src-type LOCAL` traffic ("masquerade LOCAL traffic for ...") and ends in a jump to the
//!   service-local `KUBE-SVL-*` chain, while for `Cluster` it masquerades everything
//!   ("masquerade traffic for ...") and jumps to `KUBE-SVC-*`;
//! - every `-j MASQUERADE` rule of the nat table is kept, as text, in `masquerade_rules`.
//!
//! The parser ([`rules`]) never fails and never panics: lines it does not understand are
//! skipped.
//!
//! [`read`] runs the commands. A node can hold rules in both iptables backends (nft and legacy):
//! the default `iptables-save` is read, and the other backend is read too when it holds a nat
//! table with `KUBE-` chains; the results are merged.
//!
//! Reading what changed, not everything: on the nf_tables backend (iptables-nft, the default
//! of every current distribution) every commit names the chains it touched
//! ([`super::changes::Touched`]). The nat table is held here chain by chain between reads
//! ([`NatChains`]), and [`read_blocking_after`] re-reads only the touched chains, one
//! `iptables -t nat -S CHAIN` each: iptables-nft fetches that chain alone from the kernel,
//! so at 10,000 Services `-S KUBE-SERVICES` takes 0.1 s where `iptables-save -t nat` takes
//! 1.6 s (measured here). kube-proxy >= 1.28 writes only the chains that changed (plus
//! `KUBE-SERVICES` and `KUBE-NODEPORTS`, always rewritten) and that is what is read. A full
//! restore touches every chain: more than [`MAX_CHAIN_READS`] chains, or a chain count above
//! 1/[`CHAIN_READ_SHARE`] of the table, is one full dump instead. What the messages cannot say
//! (a renamed chain) waits for the next full read: the `--services-every` safety net reads
//! everything. The legacy backend has no messages and is always dumped whole.

mod rules;

use std::{
    hash::{DefaultHasher, Hasher},
    path::Path,
    process::Command,
    sync::{Mutex, OnceLock},
};

use crate::state::{
    ParseCache, ServiceTable,
    changes::{FAMILY_IP, FAMILY_IP6, TableChange, Touched},
};

pub use rules::{
    ACCESS_FILTER_CHAIN, NatChains, digest, merge, parse_access_filter, parse_iptables_save,
};

/// Why the nat rules could not be read.
#[derive(Debug, thiserror::Error)]
pub enum IptablesError {
    /// The command could not be started (not installed, not in PATH, no permission).
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    /// The command ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
    /// The blocking reader task did not complete.
    #[error("iptables reader task failed: {0}")]
    Join(String),
}

/// Reads the nat table(s) of the current network namespace (see the module docs) on a blocking
/// thread.
pub async fn read() -> Result<ServiceTable, IptablesError> {
    tokio::task::spawn_blocking(read_blocking)
        .await
        .map_err(|e| IptablesError::Join(e.to_string()))?
}

/// Reads the nat table(s) of the calling thread's network namespace, all of them. Blocking.
pub fn read_blocking() -> Result<ServiceTable, IptablesError> {
    read_blocking_after(&Touched::everything())
}

/// Reads the nat table(s) of the calling thread's network namespace, re-reading of the
/// nf_tables backend only what `touched` names (see the module docs). Blocking.
///
/// `iptables-save -t nat` must work (its failure is the error). `ip6tables-save` and the other
/// backend are best effort: their failures are logged and skipped. The legacy backend is only
/// asked when the kernel already has a legacy nat table (`/proc/thread-self/net/ip_tables_names`), because
/// `iptables-legacy-save -t nat` would otherwise load the legacy nat module as a side effect.
pub fn read_blocking_after(touched: &Touched) -> Result<ServiceTable, IptablesError> {
    static PARSED: ParseCache<ServiceTable> = ParseCache::new();
    static DEFAULT_IS_NFT: OnceLock<bool> = OnceLock::new();

    // The backend of the installed iptables does not change while we run: asked once.
    let default_is_nft = *DEFAULT_IS_NFT.get_or_init(|| {
        run("iptables-save", &["--version"])
            .map(|v| v.contains("nf_tables"))
            .unwrap_or(false)
    });
    let mut table = if default_is_nft {
        read_nft_family(&NFT_V4, touched)?
    } else {
        let v4 = run("iptables-save", &["-t", "nat"])?;
        PARSED.parse("iptables-save", &v4, digest, parse_iptables_save)
    };

    let mut extra: Vec<(&str, Option<&str>)> = Vec::new();
    if default_is_nft {
        match read_nft_family(&NFT_V6, touched) {
            Ok(v6) => merge(&mut table, v6),
            Err(e) => tracing::debug!(error = %e, "skipping ip6tables-save"),
        }
        extra.push((
            "iptables-legacy-save",
            Some("/proc/thread-self/net/ip_tables_names"),
        ));
        extra.push((
            "ip6tables-legacy-save",
            Some("/proc/thread-self/net/ip6_tables_names"),
        ));
    } else {
        extra.push(("ip6tables-save", None));
        extra.push(("iptables-nft-save", None));
        extra.push(("ip6tables-nft-save", None));
    }
    for (cmd, needs_proc_table) in extra {
        if let Some(names) = needs_proc_table {
            let loaded = std::fs::read_to_string(names)
                .map(|t| t.lines().any(|l| l.trim() == "nat"))
                .unwrap_or(false);
            if !loaded {
                continue;
            }
        }
        if !command_exists(cmd) {
            continue;
        }
        match run(cmd, &["-t", "nat"]) {
            Ok(text) => {
                // The second backend only matters when kube-proxy (or a stale kube-proxy) wrote
                // into it; ip6tables-save is always merged.
                if cmd == "ip6tables-save" || text.contains("KUBE-") {
                    merge(
                        &mut table,
                        PARSED.parse(cmd, &text, digest, parse_iptables_save),
                    );
                }
            }
            Err(e) => tracing::debug!(error = %e, "skipping {cmd}"),
        }
    }
    table.access_filter = read_access_filter(default_is_nft, touched);
    Ok(table)
}

/// A chain count above which one full dump is cheaper than one `-S` per chain (a process
/// each, a few ms; a full dump of 10,000 Services is 1.6 s, of 100 Services 15 ms).
pub const MAX_CHAIN_READS: usize = 64;
/// Chains are read one by one only while they are at most 1/this of the held chains.
pub const CHAIN_READ_SHARE: usize = 16;

/// One family of the nf_tables backend: its dump and listing commands and its nfgenmsg family.
struct NftFamily {
    save: &'static str,
    list: &'static str,
    family: u8,
}

const NFT_V4: NftFamily = NftFamily {
    save: "iptables-save",
    list: "iptables",
    family: FAMILY_IP,
};
const NFT_V6: NftFamily = NftFamily {
    save: "ip6tables-save",
    list: "ip6tables",
    family: FAMILY_IP6,
};

/// What is held of one family between reads: its chains, the digest of the dump they came
/// from (an unchanged dump is not parsed again), the table they make.
struct Held {
    save: &'static str,
    /// The network namespace read (its inode): a process may read several (tests do).
    netns: u64,
    chains: NatChains,
    dump_digest: u64,
    table: ServiceTable,
}

/// Per family and network namespace; a full read (every `probe check`, the safety net)
/// replaces it.
static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());

/// The calling thread's network namespace (the one the commands it spawns run in).
fn netns_id() -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/thread-self/ns/net")
        .map(|m| m.ino())
        .unwrap_or(0)
}

fn take_held(save: &str, netns: u64) -> Option<Held> {
    let mut held = HELD.lock().ok()?;
    let i = held
        .iter()
        .position(|h| h.save == save && h.netns == netns)?;
    Some(held.swap_remove(i))
}

fn put_held(h: Held) {
    if let Ok(mut held) = HELD.lock() {
        held.retain(|o| !(o.save == h.save && o.netns == h.netns));
        held.push(h);
    }
}

/// The nat table of one nf_tables family: the held table when `touched` says nothing of it,
/// the touched chains re-read when they are few, else a full dump.
fn read_nft_family(f: &NftFamily, touched: &Touched) -> Result<ServiceTable, IptablesError> {
    let reuse = crate::state::reuse_parses();
    let netns = netns_id();
    let held = if reuse {
        take_held(f.save, netns)
    } else {
        None
    };
    if let Some(mut h) = held {
        match touched.table(f.family, "nat") {
            TableChange::Untouched => {
                let table = h.table.clone();
                put_held(h);
                return Ok(table);
            }
            TableChange::Named(names)
                if names.len() <= MAX_CHAIN_READS
                    && names.len() * CHAIN_READ_SHARE <= h.chains.len().max(CHAIN_READ_SHARE) =>
            {
                match reread_chains(f, &mut h.chains, names) {
                    Ok(()) => {
                        h.table = h.chains.table();
                        let table = h.table.clone();
                        put_held(h);
                        return Ok(table);
                    }
                    // The held chains may be half patched: dropped, and the table read whole.
                    Err(e) => {
                        tracing::debug!(error = %e, "re-reading chains; reading the whole nat table")
                    }
                }
            }
            _ => {
                // Read whole below; the held digest still saves a parse of the same dump.
                let text = run(f.save, &["-t", "nat"])?;
                let d = dump_digest(&text);
                if d != h.dump_digest {
                    h.chains = NatChains::parse(&text);
                    h.table = h.chains.table();
                    h.dump_digest = d;
                }
                let table = h.table.clone();
                put_held(h);
                return Ok(table);
            }
        }
    }
    let text = run(f.save, &["-t", "nat"])?;
    let chains = NatChains::parse(&text);
    let table = chains.table();
    if reuse {
        put_held(Held {
            save: f.save,
            netns,
            chains,
            dump_digest: dump_digest(&text),
            table: table.clone(),
        });
    }
    Ok(table)
}

fn dump_digest(text: &str) -> u64 {
    let mut h = DefaultHasher::new();
    digest(text, &mut h);
    h.finish()
}

/// Re-reads each named chain (`-S CHAIN`); a chain that no longer exists is removed.
fn reread_chains(
    f: &NftFamily,
    chains: &mut NatChains,
    names: &std::collections::BTreeSet<String>,
) -> Result<(), IptablesError> {
    for chain in names {
        match run(f.list, &["-w", "-t", "nat", "-S", chain]) {
            Ok(listing) => chains.replace(chain, &listing),
            Err(IptablesError::Failed { stderr, .. }) if is_no_such_chain(&stderr) => {
                chains.remove(chain)
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// iptables' words for a chain that does not exist (`iptables: No chain/target/match by that
/// name.`; iptables-nft 1.8.10+: `chain `X' in table `nat' is incompatible` is not this).
fn is_no_such_chain(stderr: &str) -> bool {
    stderr.contains("No chain/target/match by that name")
}

/// Reads [`ACCESS_FILTER_CHAIN`] (one chain, not the whole filter table), again only when a
/// commit touched the filter table (nf_tables backend). A missing chain or a failing command
/// is no filter.
fn read_access_filter(default_is_nft: bool, touched: &Touched) -> Vec<String> {
    static LAST: Mutex<Option<Vec<String>>> = Mutex::new(None);
    let untouched = default_is_nft
        && crate::state::reuse_parses()
        && touched.table(FAMILY_IP, "filter") == TableChange::Untouched;
    if untouched
        && let Ok(last) = LAST.lock()
        && let Some(filter) = last.as_ref()
    {
        return filter.clone();
    }
    let filter = read_access_filter_now();
    if let Ok(mut last) = LAST.lock() {
        *last = Some(filter.clone());
    }
    filter
}

fn read_access_filter_now() -> Vec<String> {
    match run(
        "iptables",
        &["-w", "-t", "filter", "-S", ACCESS_FILTER_CHAIN],
    ) {
        Ok(text) => parse_access_filter(&text),
        Err(e) => {
            tracing::trace!(error = %e, "no {ACCESS_FILTER_CHAIN}");
            Vec::new()
        }
    }
}

fn command_exists(cmd: &str) -> bool {
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    std::env::split_paths(&path).any(|dir| Path::new(&dir).join(cmd).is_file())
}

fn run(cmd: &str, args: &[&str]) -> Result<String, IptablesError> {
    let command = format!("{cmd} {}", args.join(" "));
    let out = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|source| IptablesError::Spawn {
            command: command.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(IptablesError::Failed {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    // A whole dump is ~10 MB at 10,000 Services: taken as it is, not copied.
    Ok(String::from_utf8(out.stdout)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
}

#[cfg(test)]
mod tests;
