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

/// kube-proxy's `ip kube-proxy` table for `n` Services as one `nft -f` transaction that
/// replaces the table (created first when missing).
pub fn nft_rules(n: usize, changed: Option<usize>) -> String {
    let mut s = String::with_capacity(n * 600);
    // `flush table` keeps set and map elements: the table is deleted and written again, in
    // the same transaction (one commit, content unchanged when `changed` is None).
    s.push_str("add table ip kube-proxy\ndelete table ip kube-proxy\ntable ip kube-proxy {\n");
    s.push_str("\tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n");
    if n > 0 {
        s.push_str("\t\telements = { ");
        for i in 0..n {
            if i > 0 {
                s.push_str(", ");
            }
            s.push_str(&format!(
                "{} . tcp . 80 : goto service-S{i:07}-scale/svc-{i}/tcp/http",
                cluster_ip(i)
            ));
        }
        s.push_str(" }\n");
    }
    s.push_str("\t}\n\tmap service-nodeports {\n\t\ttype inet_proto . inet_service : verdict\n");
    if n > 0 {
        s.push_str("\t\telements = { ");
        for i in 0..n.min(NODEPORTS) {
            if i > 0 {
                s.push_str(", ");
            }
            s.push_str(&format!(
                "tcp . {} : goto external-S{i:07}-scale/svc-{i}/tcp/http",
                30_000 + i
            ));
        }
        s.push_str(" }\n");
    }
    s.push_str(
        "\t}\n\tchain mark-for-masquerade {\n\t\tmeta mark set meta mark | 0x00004000\n\t}\n\
         \tchain masquerading {\n\t\tmeta mark & 0x00004000 == 0x00000000 return\n\t\tmeta mark set meta mark ^ 0x00004000\n\t\tmasquerade fully-random\n\t}\n\
         \tchain services {\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t\tmeta l4proto . th dport vmap @service-nodeports\n\t}\n",
    );
    for i in 0..n {
        let b = backend(i, changed == Some(i));
        let ep = format!("endpoint-E{i:07}-scale/svc-{i}/tcp/http__{b}/8080");
        s.push_str(&format!(
            "\tchain service-S{i:07}-scale/svc-{i}/tcp/http {{\n\t\tip daddr {} tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade\n\t\tnumgen random mod 1 vmap {{ 0 : goto {ep} }}\n\t}}\n\
             \tchain {ep} {{\n\t\tip saddr {b} jump mark-for-masquerade\n\t\tmeta l4proto tcp dnat to {b}:8080\n\t}}\n",
            cluster_ip(i)
        ));
        if i < NODEPORTS {
            s.push_str(&format!(
                "\tchain external-S{i:07}-scale/svc-{i}/tcp/http {{\n\t\tjump mark-for-masquerade\n\t\tgoto service-S{i:07}-scale/svc-{i}/tcp/http\n\t}}\n"
            ));
        }
    }
    s.push_str("}\n");
    s
}
