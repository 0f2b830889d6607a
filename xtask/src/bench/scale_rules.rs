//! The bench's kube-proxy workloads for part 9: `n` Services as kube-proxy writes them, in
//! iptables (full restore and >= 1.28 partial sync) and nftables modes. Pure text builders.

/// Services with a NodePort: the first 2,000.
pub const NODEPORTS: usize = 2_000;

pub(super) fn cluster_ip(i: usize) -> String {
    format!("10.{}.{}.{}", 96 + i / 62_500, i / 250 % 250, i % 250 + 1)
}

pub(super) fn backend(i: usize, changed: bool) -> String {
    format!(
        "10.{}.{}.{}",
        if changed { 245 } else { 244 },
        i / 250 % 250,
        i % 250 + 1
    )
}

/// kube-proxy's nat chains for `n` Services as one `iptables-restore --noflush` input: every
/// chain is declared, so applying it again replaces the chains with the same content (a
/// kube-proxy full re-sync). `changed`: that Service's endpoint moved.
pub fn iptables_rules(n: usize, changed: Option<usize>) -> String {
    let mut s = String::with_capacity(n * 700);
    s.push_str(
        "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n",
    );
    for i in 0..n {
        s.push_str(&service_chain_decls(i));
    }
    s.push_str(
        "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n",
    );
    for i in 0..n {
        s.push_str(&service_rules(i));
        s.push_str(&service_chain_rules(i, changed == Some(i)));
    }
    s.push_str(NODEPORTS_JUMP);
    s.push_str("COMMIT\n");
    s
}

/// A kube-proxy >= 1.28 partial sync of `n` Services as one `iptables-restore --noflush`
/// input: `KUBE-SERVICES` and `KUBE-NODEPORTS` rewritten whole (kube-proxy writes them on
/// every sync), the chains of Service `write` (re)written (its endpoint moved when `moved`),
/// the chains of Service `delete` deleted; every other chain untouched.
pub fn iptables_partial(
    n: usize,
    write: Option<usize>,
    moved: bool,
    delete: Option<usize>,
) -> String {
    let mut s = String::with_capacity(n * 200);
    s.push_str("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n");
    for i in write.into_iter().chain(delete) {
        s.push_str(&service_chain_decls(i));
    }
    for i in 0..n {
        s.push_str(&service_rules(i));
    }
    s.push_str(NODEPORTS_JUMP);
    if let Some(i) = write {
        s.push_str(&service_chain_rules(i, moved));
    }
    if let Some(i) = delete {
        s.push_str(&format!(
            "-X KUBE-SVC-CLBSCALE{i:07}\n-X KUBE-SEP-CLBSCALE{i:07}\n"
        ));
        if i < NODEPORTS {
            s.push_str(&format!("-X KUBE-EXT-CLBSCALE{i:07}\n"));
        }
    }
    s.push_str("COMMIT\n");
    s
}

const NODEPORTS_JUMP: &str = "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS\n";

/// Service `i`'s own chains, declared (a declaration flushes an existing chain).
fn service_chain_decls(i: usize) -> String {
    let mut s = format!(":KUBE-SVC-CLBSCALE{i:07} - [0:0]\n:KUBE-SEP-CLBSCALE{i:07} - [0:0]\n");
    if i < NODEPORTS {
        s.push_str(&format!(":KUBE-EXT-CLBSCALE{i:07} - [0:0]\n"));
    }
    s
}

/// Service `i`'s rules in `KUBE-SERVICES` and `KUBE-NODEPORTS`.
fn service_rules(i: usize) -> String {
    let (ip, name) = (cluster_ip(i), format!("scale/svc-{i}:http"));
    let mut s = format!(
        "-A KUBE-SERVICES -d {ip}/32 -p tcp -m comment --comment \"{name} cluster IP\" -m tcp --dport 80 -j KUBE-SVC-CLBSCALE{i:07}\n"
    );
    if i < NODEPORTS {
        s.push_str(&format!(
            "-A KUBE-NODEPORTS -p tcp -m comment --comment \"{name}\" -m tcp --dport {} -j KUBE-EXT-CLBSCALE{i:07}\n",
            30_000 + i
        ));
    }
    s
}

/// The rules of Service `i`'s own chains (`moved`: its endpoint is the other one).
fn service_chain_rules(i: usize, moved: bool) -> String {
    let name = format!("scale/svc-{i}:http");
    let b = backend(i, moved);
    let mut s = format!(
        "-A KUBE-SVC-CLBSCALE{i:07} -m comment --comment \"{name} -> {b}:8080\" -j KUBE-SEP-CLBSCALE{i:07}\n\
         -A KUBE-SEP-CLBSCALE{i:07} -s {b}/32 -m comment --comment \"{name}\" -j KUBE-MARK-MASQ\n\
         -A KUBE-SEP-CLBSCALE{i:07} -p tcp -m comment --comment \"{name}\" -m tcp -j DNAT --to-destination {b}:8080\n"
    );
    if i < NODEPORTS {
        s.push_str(&format!(
            "-A KUBE-EXT-CLBSCALE{i:07} -m comment --comment \"masquerade traffic for {name} external destinations\" -j KUBE-MARK-MASQ\n\
             -A KUBE-EXT-CLBSCALE{i:07} -j KUBE-SVC-CLBSCALE{i:07}\n"
        ));
    }
    s
}

/// Services per `nft -f` transaction when the bench writes the whole `ip kube-proxy` table:
/// one transaction of 30,000 Services (about 200,000 commands) did not finish in nft 1.0.6
/// (its userspace resolves every chain reference against the whole cache), so the table is
/// written in chunks, each a consistent state for a reader (a Service's chains and its map
/// elements always commit together).
pub const NFT_BATCH: usize = 2_000;

/// kube-proxy's `ip kube-proxy` table for `n` Services as `nft -f` transactions, applied in
/// order: the table recreated empty with its maps and base chains, then the Services in chunks
/// of [`NFT_BATCH`], each chunk as a kube-proxy full sync writes them
/// (kubernetes/kubernetes pkg/proxy/nftables/proxier.go `syncProxyRules` with
/// `tryPartialSync` false: `setupNFTables`, then `ensureChain` = add + flush and the rules of
/// every Service chain, `ensureElem` of every map element; kube-proxy commits one
/// transaction, see [`NFT_BATCH`]).
pub fn nft_load(n: usize) -> Vec<String> {
    // `flush table` keeps set and map elements: the table is deleted and declared again.
    let mut skeleton = String::from(
        "add table ip kube-proxy\ndelete table ip kube-proxy\ntable ip kube-proxy {\n",
    );
    skeleton.push_str(
        "\tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t}\n\
         \tmap service-nodeports {\n\t\ttype inet_proto . inet_service : verdict\n\t}\n\
         \tchain mark-for-masquerade {\n\t}\n\tchain masquerading {\n\t}\n\tchain services {\n\t}\n}\n",
    );
    skeleton.push_str(NFT_BASE_CHAINS);
    let mut txs = vec![skeleton];
    let mut start = 0;
    while start < n {
        let end = (start + NFT_BATCH).min(n);
        let mut s = String::with_capacity((end - start) * 900);
        let writes: Vec<(usize, bool)> = (start..end).map(|i| (i, false)).collect();
        nft_services(&mut s, &writes);
        txs.push(s);
        start = end;
    }
    txs
}

/// A kube-proxy partial sync as one transaction (proxier.go `syncProxyRules` with
/// `tryPartialSync`: only the Services whose Service or EndpointSlice changed get their chains
/// flushed and rewritten and their map elements added or deleted; the others are skipped):
/// the Services of `writes` (re)written (`(i, moved)`: with its endpoint the other one, the
/// previous endpoint's chain deleted), Service `delete` removed. kube-proxy's nftables mode
/// re-syncs this way every time something changed (a full sync only every
/// `FullSyncPeriod`, an hour).
pub fn nft_partial(writes: &[(usize, bool)], delete: Option<usize>) -> String {
    let mut s = String::new();
    nft_services(&mut s, writes);
    if let Some(i) = delete {
        s.push_str(&format!(
            "delete element ip kube-proxy service-ips {{ {} . tcp . 80 }}\n",
            cluster_ip(i)
        ));
        if i < NODEPORTS {
            s.push_str(&format!(
                "delete element ip kube-proxy service-nodeports {{ tcp . {} }}\n\
                 delete chain ip kube-proxy {}\n",
                30_000 + i,
                ext_chain(i)
            ));
        }
        s.push_str(&format!("delete chain ip kube-proxy {}\n", svc_chain(i)));
        for moved in [false, true] {
            let ep = ep_chain(i, &backend(i, moved));
            // Whichever of the two exists: `add` then `delete` never fails.
            s.push_str(&format!(
                "add chain ip kube-proxy {ep}\ndelete chain ip kube-proxy {ep}\n"
            ));
        }
    }
    s
}

/// The base chains' rules, flushed and written again (kube-proxy's `setupNFTables` on a full
/// sync).
const NFT_BASE_CHAINS: &str = "flush chain ip kube-proxy mark-for-masquerade\n\
     add rule ip kube-proxy mark-for-masquerade meta mark set meta mark | 0x00004000\n\
     flush chain ip kube-proxy masquerading\n\
     add rule ip kube-proxy masquerading meta mark & 0x00004000 == 0x00000000 return\n\
     add rule ip kube-proxy masquerading meta mark set meta mark ^ 0x00004000\n\
     add rule ip kube-proxy masquerading masquerade fully-random\n\
     flush chain ip kube-proxy services\n\
     add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips\n\
     add rule ip kube-proxy services meta l4proto . th dport vmap @service-nodeports\n";

fn svc_chain(i: usize) -> String {
    format!("service-S{i:07}-scale/svc-{i}/tcp/http")
}

fn ext_chain(i: usize) -> String {
    format!("external-S{i:07}-scale/svc-{i}/tcp/http")
}

fn ep_chain(i: usize, backend: &str) -> String {
    format!("endpoint-E{i:07}-scale/svc-{i}/tcp/http__{backend}/8080")
}

/// The Services of `writes` (`(i, moved)`) written as kube-proxy writes a changed Service: each chain added and
/// flushed then its rules, the chain of the endpoint it no longer has deleted (after the
/// flush of the Service chain that jumped to it, in the same transaction: kernels >= 6.2
/// see it unreferenced at once; proxier.go defers the delete by a second for older ones), and
/// its map elements (an `add` of an element already there with the same verdict is no change).
fn nft_services(s: &mut String, writes: &[(usize, bool)]) {
    let mut ips = Vec::new();
    let mut nodeports = Vec::new();
    for &(i, moved) in writes {
        let b = backend(i, moved);
        let stale = ep_chain(i, &backend(i, !moved));
        let (svc, ep) = (svc_chain(i), ep_chain(i, &b));
        s.push_str(&format!(
            "add chain ip kube-proxy {ep}\nflush chain ip kube-proxy {ep}\n\
             add rule ip kube-proxy {ep} ip saddr {b} jump mark-for-masquerade\n\
             add rule ip kube-proxy {ep} meta l4proto tcp dnat to {b}:8080\n\
             add chain ip kube-proxy {svc}\nflush chain ip kube-proxy {svc}\n\
             add rule ip kube-proxy {svc} ip daddr {ip} tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade\n\
             add rule ip kube-proxy {svc} numgen random mod 1 vmap {{ 0 : goto {ep} }}\n\
             add chain ip kube-proxy {stale}\ndelete chain ip kube-proxy {stale}\n",
            ip = cluster_ip(i)
        ));
        ips.push(format!("{} . tcp . 80 : goto {svc}", cluster_ip(i)));
        if i < NODEPORTS {
            let ext = ext_chain(i);
            s.push_str(&format!(
                "add chain ip kube-proxy {ext}\nflush chain ip kube-proxy {ext}\n\
                 add rule ip kube-proxy {ext} jump mark-for-masquerade\n\
                 add rule ip kube-proxy {ext} goto {svc}\n"
            ));
            nodeports.push(format!("tcp . {} : goto {ext}", 30_000 + i));
        }
    }
    if !ips.is_empty() {
        s.push_str(&format!(
            "add element ip kube-proxy service-ips {{ {} }}\n",
            ips.join(", ")
        ));
    }
    if !nodeports.is_empty() {
        s.push_str(&format!(
            "add element ip kube-proxy service-nodeports {{ {} }}\n",
            nodeports.join(", ")
        ));
    }
}

/// kube-proxy's IPVS mode for `n` Services, as two inputs: `ip -batch` lines binding every
/// ClusterIP to `kube-ipvs0`, and `ipvsadm -R` lines with a virtual server per ClusterIP:80
/// (round robin) and one per NodePort on `node_ip`, each with its endpoint as a masqueraded
/// real server (kubernetes/kubernetes pkg/proxy/ipvs/proxier.go `syncService` /
/// `syncEndpoint`: ClusterIP and NodePort virtual servers, `ipvs.ConnectionFlagMasq`, scheduler
/// `rr` by default; kube-proxy's ipsets and iptables rules of IPVS mode are left out: the
/// table is read from IPVS).
pub fn ipvs_rules(n: usize, node_ip: &str) -> (String, String) {
    let mut addrs = String::with_capacity(n * 48);
    let mut ipvs = String::with_capacity(n * 120);
    for i in 0..n {
        addrs.push_str(&ipvs_addr("add", i));
        ipvs.push_str(&ipvs_service(i, node_ip, false));
    }
    (addrs, ipvs)
}

/// `ip -batch` line binding (`add`) or unbinding (`del`) Service `i`'s ClusterIP.
pub fn ipvs_addr(verb: &str, i: usize) -> String {
    format!("address {verb} {}/32 dev kube-ipvs0\n", cluster_ip(i))
}

/// `ipvsadm -R` lines creating Service `i`'s virtual servers and real servers.
pub fn ipvs_service(i: usize, node_ip: &str, moved: bool) -> String {
    let b = backend(i, moved);
    let mut s = format!(
        "-A -t {ip}:80 -s rr\n-a -t {ip}:80 -r {b}:8080 -m -w 1\n",
        ip = cluster_ip(i)
    );
    if i < NODEPORTS {
        s.push_str(&format!(
            "-A -t {node_ip}:{p} -s rr\n-a -t {node_ip}:{p} -r {b}:8080 -m -w 1\n",
            p = 30_000 + i
        ));
    }
    s
}

/// `ipvsadm -R` lines moving Service `i`'s endpoint (`moved`: to the other address), as
/// kube-proxy's IPVS sync does: the new real server added, the old one deleted (kube-proxy
/// first sets its weight to 0 for graceful termination; the bench deletes at once).
pub fn ipvs_move(i: usize, node_ip: &str, moved: bool) -> String {
    let (new, old) = (backend(i, moved), backend(i, !moved));
    let mut vips = vec![format!("{}:80", cluster_ip(i))];
    if i < NODEPORTS {
        vips.push(format!("{node_ip}:{}", 30_000 + i));
    }
    vips.iter()
        .map(|v| format!("-a -t {v} -r {new}:8080 -m -w 1\n-d -t {v} -r {old}:8080\n"))
        .collect()
}

/// `ipvsadm -R` lines deleting Service `i`'s virtual servers.
pub fn ipvs_delete(i: usize, node_ip: &str) -> String {
    let mut s = format!("-D -t {}:80\n", cluster_ip(i));
    if i < NODEPORTS {
        s.push_str(&format!("-D -t {node_ip}:{}\n", 30_000 + i));
    }
    s
}
