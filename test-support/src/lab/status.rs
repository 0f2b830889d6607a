//! What of the lab exists: `status` and the leftovers after `down`.

use super::{Context, KubeProxyMode, NAMESPACES, Result, Variants, cmd, fmt, net, servers};

/// What `status` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Every lab namespace and whether it exists.
    pub namespaces: Vec<(String, bool)>,
    /// `(namespace, "iface state addr...")` for the namespaces that exist.
    pub addresses: Vec<(String, Vec<String>)>,
    /// The variants, when the node exists.
    pub variants: Option<Variants>,
    /// The kube-proxy mode, when the node exists.
    pub mode: Option<KubeProxyMode>,
    /// Whether VIP:80 is served locally (goes with vip-bound): the KUBE-SERVICES rule in
    /// iptables mode, the IPVS virtual service in IPVS mode.
    pub vip_rule: Option<bool>,
    /// `(namespace, port, listening)` for every lab server.
    pub servers: Vec<(String, u16, bool)>,
}

impl Status {
    /// Every namespace exists.
    pub fn is_up(&self) -> bool {
        self.namespaces.iter().all(|(_, p)| *p)
    }

    /// No namespace exists.
    pub fn is_down(&self) -> bool {
        self.namespaces.iter().all(|(_, p)| !*p)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = if self.is_up() {
            "up"
        } else if self.is_down() {
            "down"
        } else {
            "partial (run `cargo xtask lab down`)"
        };
        writeln!(f, "lab: {state}")?;
        for (ns, present) in &self.namespaces {
            writeln!(f, "  {ns}: {}", if *present { "present" } else { "absent" })?;
            if let Some((_, addrs)) = self.addresses.iter().find(|(n, _)| n == ns) {
                for a in addrs {
                    writeln!(f, "      {a}")?;
                }
            }
        }
        if let Some(m) = &self.mode {
            writeln!(f, "kube-proxy mode: {m}")?;
        }
        if let Some(v) = &self.variants {
            write!(f, "variants: {v}")?;
            let what = match self.mode {
                Some(KubeProxyMode::Ipvs) => "IPVS virtual service VIP:80",
                Some(KubeProxyMode::Nftables) => "service-ips element VIP:80",
                _ => "KUBE-SERVICES VIP:80 rule",
            };
            match self.vip_rule {
                Some(r) if r != v.vip_bound => writeln!(f, " (INCONSISTENT: {what} present={r})")?,
                _ => writeln!(f)?,
            }
        }
        for (ns, port, up) in &self.servers {
            writeln!(
                f,
                "server {ns}:{port}: {}",
                if *up { "listening" } else { "not running" }
            )?;
        }
        Ok(())
    }
}

/// What of a lab is left on this machine: lab namespaces, lab servers (by their command line) and
/// lab interfaces in the host's namespace (there should never be any). Empty after `down`.
pub fn leftovers() -> Result<Vec<String>> {
    let mut left: Vec<String> = net::existing_namespaces()?
        .into_iter()
        .filter(|n| NAMESPACES.contains(&n.as_str()))
        .map(|n| format!("namespace {n}"))
        .collect();
    for entry in std::fs::read_dir("/proc")
        .context("reading /proc")?
        .flatten()
    {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if cmdline
            .split(|b| *b == 0)
            .any(|arg| arg == servers::SERVER_TAG.as_bytes())
        {
            left.push(format!("process {}", entry.file_name().to_string_lossy()));
        }
    }
    let host_links = cmd::run(&["ip", "-o", "link", "show"])?;
    for line in host_links.lines() {
        let name = line.split(':').nth(1).unwrap_or("").trim();
        let name = name.split('@').next().unwrap_or("");
        if net::LAB_LINKS.contains(&name) {
            left.push(format!("host interface {name}"));
        }
    }
    Ok(left)
}
