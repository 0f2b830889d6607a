//! apt for the VM tier: a private configuration per Debian suite ([`SuiteApt`]), apt's
//! answers parsed (`apt-cache policy`, `apt-cache depends`, `dpkg-query`), and the closure of
//! packages a guest needs beyond what this machine has installed.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::Context as _;

pub(super) fn say(msg: &str) {
    eprintln!("vm: {msg}");
}

pub(super) use crate::setup::output;

/// `Candidate:` of `apt-cache policy <pkg>`; None when apt knows no candidate.
pub fn parse_policy_candidate(policy: &str) -> Option<String> {
    policy
        .lines()
        .find_map(|l| l.trim().strip_prefix("Candidate:"))
        .map(str::trim)
        .filter(|v| !v.is_empty() && *v != "(none)")
        .map(str::to_string)
}

/// All versions of the package apt can download (`apt-cache policy`'s version table).
pub fn parse_policy_versions(policy: &str) -> Vec<String> {
    let mut in_table = false;
    let mut versions = Vec::new();
    for line in policy.lines() {
        if line.trim() == "Version table:" {
            in_table = true;
            continue;
        }
        if !in_table {
            continue;
        }
        // "     6.1.192-2 500" or " *** 6.1.192-2 500"; source lines have 8+ spaces and a URL.
        let t = line.trim_start().trim_start_matches("*** ");
        let mut it = t.split_whitespace();
        if let (Some(v), Some(prio)) = (it.next(), it.next())
            && it.next().is_none()
            && prio.parse::<i32>().is_ok()
        {
            versions.push(v.to_string());
        }
    }
    versions
}

pub(super) fn apt_update() -> anyhow::Result<()> {
    say("apt-get update (the package lists do not know the packages the VM needs)");
    output(Command::new("apt-get").args(["update", "-qq"]))
        .map(drop)
        .context("apt-get update failed: check the machine's package sources")
}

/// A private apt configuration for one Debian suite on this machine's mirror: its own sources
/// list, lists and archive folders under the VM cache; the system's apt state stays as it is.
pub struct SuiteApt {
    dir: PathBuf,
    pub(super) suite: String,
    /// A foreign architecture (`arm64`): apt then lists and downloads only that architecture's
    /// packages, with its own lists folder and an empty dpkg status (the host's installed
    /// packages are another architecture's and satisfy nothing).
    arch: Option<&'static str>,
}

/// The private apt folder of `suite` (and foreign `arch`) under the VM cache: separate lists
/// per architecture, so an arm64 update never replaces the amd64 kernels' lists.
pub fn suite_dir(cache: &Path, suite: &str, arch: Option<&str>) -> PathBuf {
    match arch {
        None => cache.join("apt").join(suite),
        Some(a) => cache.join("apt").join(format!("{suite}-{a}")),
    }
}

/// The Debian mirrors this machine's apt uses: (main archive, security archive), from
/// `apt-get indextargets --format '$(ORIGIN) $(REPO_URI) $(CODENAME)'` (`Debian
/// http://deb.debian.org/debian/ bookworm`, `Debian http://deb.debian.org/debian-security/
/// bookworm-security`, ...); other origins (third-party repositories) are skipped.
pub fn parse_mirrors(indextargets: &str) -> (Option<String>, Option<String>) {
    let mut main = None;
    let mut security = None;
    for line in indextargets.lines() {
        let mut it = line.split_whitespace();
        let (Some("Debian"), Some(uri), Some(codename)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        let uri = uri.trim_end_matches('/').to_string();
        if codename.ends_with("-security") {
            security.get_or_insert(uri);
        } else if !codename.contains('-') {
            main.get_or_insert(uri);
        }
    }
    (main, security)
}

/// The sources list of `suite` on those mirrors.
pub fn suite_sources(suite: &str, main: &str, security: Option<&str>) -> String {
    let mut s = format!("deb {main} {suite} main\n");
    if let Some(sec) = security {
        s.push_str(&format!("deb {sec} {suite}-security main\n"));
    }
    s
}

impl SuiteApt {
    pub(super) fn new(cache: &Path, suite: &str) -> anyhow::Result<Self> {
        Self::for_arch(cache, suite, None)
    }

    /// [`SuiteApt::new`] for a foreign architecture (None: the host's).
    pub(super) fn for_arch(
        cache: &Path,
        suite: &str,
        arch: Option<&'static str>,
    ) -> anyhow::Result<Self> {
        let dir = suite_dir(cache, suite, arch);
        let targets = output(Command::new("apt-get").args([
            "indextargets",
            "--format",
            "$(ORIGIN) $(REPO_URI) $(CODENAME)",
        ]))
        .unwrap_or_default();
        let (main, security) = parse_mirrors(&targets);
        let main = main.context(
            "this machine's apt names no Debian archive (apt-get indextargets): the VM tier \
             downloads its kernels from the mirror apt uses",
        )?;
        for d in ["lists/partial", "archives/partial"] {
            std::fs::create_dir_all(dir.join(d))?;
        }
        std::fs::write(
            dir.join("sources.list"),
            suite_sources(suite, &main, security.as_deref()),
        )?;
        if arch.is_some() && !dir.join("status").exists() {
            std::fs::write(dir.join("status"), "")?;
        }
        Ok(Self {
            dir,
            suite: suite.to_string(),
            arch,
        })
    }

    /// `apt-get`/`apt-cache` with this suite's configuration.
    pub(super) fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        let d = |sub: &str| self.dir.join(sub).display().to_string();
        for (k, v) in [
            ("Dir::Etc::SourceList", d("sources.list")),
            ("Dir::Etc::SourceParts", "/dev/null".to_string()),
            ("Dir::State::Lists", d("lists")),
            ("Dir::Cache", self.dir.display().to_string()),
            ("Dir::Cache::archives", d("archives")),
            ("Dir::Cache::pkgcache", String::new()),
            ("Dir::Cache::srcpkgcache", String::new()),
        ] {
            cmd.arg("-o").arg(format!("{k}={v}"));
        }
        if let Some(a) = self.arch {
            for (k, v) in [
                ("APT::Architecture", a.to_string()),
                ("APT::Architectures", a.to_string()),
                ("Dir::State::status", d("status")),
            ] {
                cmd.arg("-o").arg(format!("{k}={v}"));
            }
        }
        if crate_is_root() {
            // apt's _apt sandbox user cannot write into root's cache folder.
            cmd.args(["-o", "APT::Sandbox::User=root"]);
        }
        cmd
    }

    pub(super) fn update(&self) -> anyhow::Result<()> {
        say(&format!("apt-get update ({} lists, private)", self.suite));
        output(self.command("apt-get").args(["update", "-qq"]))
            .map(drop)
            .with_context(|| format!("apt-get update of the {} lists failed", self.suite))
    }

    pub(super) fn policy(&self, package: &str) -> String {
        output(self.command("apt-cache").args(["policy", package])).unwrap_or_default()
    }

    /// [`apt_depends`] with this suite's configuration.
    pub(super) fn depends(
        &self,
        pkgs: &[String],
    ) -> anyhow::Result<HashMap<String, Vec<Vec<Dep>>>> {
        let out = output(self.command("apt-cache").args(DEPENDS_ONLY).args(pkgs))?;
        Ok(parse_depends(&out))
    }
}

/// `apt-cache depends` restricted to Depends/PreDepends.
const DEPENDS_ONLY: &[&str] = &[
    "depends",
    "--no-recommends",
    "--no-suggests",
    "--no-conflicts",
    "--no-breaks",
    "--no-replaces",
    "--no-enhances",
];

/// One alternative of a dependency: a package, or a virtual package and its providers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dep {
    pub name: String,
    pub virtual_: bool,
    pub providers: Vec<String>,
}

/// `apt-cache depends` output: package -> its Depends/PreDepends groups (alternatives OR'ed).
/// Other relations (Recommends, Suggests, Breaks, ...) are skipped.
pub fn parse_depends(text: &str) -> HashMap<String, Vec<Vec<Dep>>> {
    let mut map: HashMap<String, Vec<Vec<Dep>>> = HashMap::new();
    let mut current: Option<String> = None;
    // The group being built, and whether its last alternative was followed by `|`.
    let mut group: Vec<Dep> = Vec::new();
    let mut open = false;
    // Whether the last relation line was a dependency (providers lines attach to it).
    let mut last_was_dep = false;
    let flush = |map: &mut HashMap<String, Vec<Vec<Dep>>>,
                 current: &Option<String>,
                 group: &mut Vec<Dep>| {
        if let Some(p) = current
            && !group.is_empty()
        {
            map.entry(p.clone())
                .or_default()
                .push(std::mem::take(group));
        }
        group.clear();
    };
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if !line.starts_with(' ') {
            flush(&mut map, &current, &mut group);
            open = false;
            last_was_dep = false;
            let name = strip_arch(line.trim()).to_string();
            map.entry(name.clone()).or_default();
            current = Some(name);
            continue;
        }
        if line.starts_with("    ") {
            // A provider of the virtual package on the previous line.
            if last_was_dep && let Some(d) = group.last_mut() {
                d.providers.push(strip_arch(line.trim()).to_string());
            }
            continue;
        }
        let alt = line.starts_with(" |");
        let rel = line.trim_start_matches([' ', '|']);
        let Some((kind, name)) = rel.split_once(':') else {
            continue;
        };
        if kind != "Depends" && kind != "PreDepends" {
            if !open {
                flush(&mut map, &current, &mut group);
            }
            open = false;
            last_was_dep = false;
            continue;
        }
        if !open {
            flush(&mut map, &current, &mut group);
        }
        let name = name.trim();
        let virtual_ = name.starts_with('<') && name.ends_with('>');
        let name = strip_arch(name.trim_start_matches('<').trim_end_matches('>'));
        group.push(Dep {
            name: name.to_string(),
            virtual_,
            providers: Vec::new(),
        });
        open = alt;
        last_was_dep = true;
    }
    flush(&mut map, &current, &mut group);
    map
}

pub(super) fn strip_arch(name: &str) -> &str {
    name.split(':').next().unwrap_or(name)
}

/// Packages (and what they provide) installed on the host.
pub(super) fn host_installed() -> anyhow::Result<HashSet<String>> {
    let out = output(Command::new("dpkg-query").args([
        "-W",
        "-f",
        "${Package}\t${Status}\t${Provides}\n",
    ]))?;
    Ok(parse_installed(&out))
}

/// `dpkg-query -W -f '${Package}\t${Status}\t${Provides}\n'` -> installed names and provides.
pub fn parse_installed(text: &str) -> HashSet<String> {
    let mut set = HashSet::new();
    for line in text.lines() {
        let mut f = line.split('\t');
        let (Some(pkg), Some(status)) = (f.next(), f.next()) else {
            continue;
        };
        if !status.ends_with(" installed") || status.contains("not-installed") {
            continue;
        }
        set.insert(strip_arch(pkg).to_string());
        for p in f.next().unwrap_or_default().split(',') {
            let p = p.split_whitespace().next().unwrap_or_default();
            if !p.is_empty() {
                set.insert(strip_arch(p).to_string());
            }
        }
    }
    set
}

/// The packages to download: `wanted` plus every dependency neither in the set nor
/// satisfied by `installed` (first alternative, first provider of a virtual one).
pub fn closure(
    wanted: &[&str],
    installed: &HashSet<String>,
    mut depends: impl FnMut(&[String]) -> anyhow::Result<HashMap<String, Vec<Vec<Dep>>>>,
) -> anyhow::Result<BTreeSet<String>> {
    let mut chosen: BTreeSet<String> = wanted.iter().map(|s| s.to_string()).collect();
    let mut todo: Vec<String> = chosen.iter().cloned().collect();
    while !todo.is_empty() {
        let deps = depends(&todo)?;
        let mut next = Vec::new();
        for pkg in &todo {
            for group in deps.get(pkg).map(Vec::as_slice).unwrap_or_default() {
                let have = |n: &str| chosen.contains(n) || installed.contains(n);
                let satisfied = group
                    .iter()
                    .any(|d| have(&d.name) || d.providers.iter().any(|p| have(p)));
                if satisfied {
                    continue;
                }
                let pick = group.iter().find_map(|d| {
                    if d.virtual_ {
                        d.providers.first().cloned()
                    } else {
                        Some(d.name.clone())
                    }
                });
                if let Some(p) = pick
                    && chosen.insert(p.clone())
                {
                    next.push(p);
                }
            }
        }
        todo = next;
    }
    Ok(chosen)
}

pub(super) fn apt_depends(pkgs: &[String]) -> anyhow::Result<HashMap<String, Vec<Vec<Dep>>>> {
    let out = output(Command::new("apt-cache").args(DEPENDS_ONLY).args(pkgs))?;
    Ok(parse_depends(&out))
}

pub(super) fn crate_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEPENDS: &str = "\
ipvsadm
  Depends: lsb-base
    sysvinit-utils
  Depends: libc6
  Depends: libnl-3-200
  Depends: libnl-genl-3-200
  Depends: libpopt0
  Recommends: kmod
linux-image-amd64
  Depends: linux-image-6.1.0-56-amd64
foo
 |Depends: bar
  Depends: baz
  Depends: <awk>
    mawk
    gawk
  PreDepends: python3:any
  Suggests: quux
";

    #[test]
    fn parses_apt_cache_depends() {
        let m = parse_depends(DEPENDS);
        let ipvsadm = &m["ipvsadm"];
        assert_eq!(ipvsadm.len(), 5);
        assert_eq!(ipvsadm[0][0].name, "lsb-base");
        assert_eq!(ipvsadm[0][0].providers, ["sysvinit-utils"]);
        assert_eq!(ipvsadm[4][0].name, "libpopt0");
        assert_eq!(
            m["linux-image-amd64"][0][0].name,
            "linux-image-6.1.0-56-amd64"
        );
        let foo = &m["foo"];
        assert_eq!(foo.len(), 3, "{foo:?}");
        let names: Vec<_> = foo[0].iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["bar", "baz"]);
        assert!(foo[1][0].virtual_);
        assert_eq!(foo[1][0].name, "awk");
        assert_eq!(foo[1][0].providers, ["mawk", "gawk"]);
        assert_eq!(foo[2][0].name, "python3");
    }

    #[test]
    fn closure_adds_only_missing_dependencies() {
        let installed: HashSet<String> = ["libc6", "libnl-3-200", "sysvinit-utils"]
            .into_iter()
            .map(String::from)
            .collect();
        let got = closure(&["ipvsadm"], &installed, |pkgs| {
            let mut m = parse_depends(DEPENDS);
            m.retain(|k, _| pkgs.contains(k));
            Ok(m)
        })
        .unwrap();
        let got: Vec<_> = got.into_iter().collect();
        assert_eq!(got, ["ipvsadm", "libnl-genl-3-200", "libpopt0"]);
    }

    #[test]
    fn closure_picks_first_alternative_and_first_provider() {
        let got = closure(&["foo"], &HashSet::new(), |pkgs| {
            let mut m = parse_depends(DEPENDS);
            m.retain(|k, _| pkgs.contains(k));
            Ok(m)
        })
        .unwrap();
        let got: Vec<_> = got.into_iter().collect();
        assert_eq!(got, ["bar", "foo", "mawk", "python3"]);
    }

    #[test]
    fn parses_apt_cache_policy() {
        let p = "\
linux-image-6.1.0-56-amd64:
  Installed: (none)
  Candidate: 6.1.192-2
  Version table:
 *** 6.1.192-2 500
        500 http://deb.debian.org/debian-security bookworm-security/main amd64 Packages
     6.1.176-1 500
        500 http://deb.debian.org/debian bookworm/main amd64 Packages
";
        assert_eq!(parse_policy_candidate(p).as_deref(), Some("6.1.192-2"));
        assert_eq!(parse_policy_versions(p), ["6.1.192-2", "6.1.176-1"]);
        assert_eq!(parse_policy_candidate("x:\n  Candidate: (none)\n"), None);
        assert!(parse_policy_versions("").is_empty());
    }

    #[test]
    fn parses_dpkg_query() {
        let s = parse_installed(
            "libc6\tinstall ok installed\t\n\
             mawk\tinstall ok installed\tawk\n\
             kmod\tunknown ok not-installed\t\n\
             libssl3:amd64\tinstall ok installed\tlibssl (= 3), foo\n",
        );
        for n in ["libc6", "mawk", "awk", "libssl3", "libssl", "foo"] {
            assert!(s.contains(n), "{n}");
        }
        assert!(!s.contains("kmod"));
    }

    #[test]
    fn private_sources_on_this_machines_mirror() {
        let targets = "Google https://packages.example/apt cloud-sdk\n\
                       Debian http://deb.debian.org/debian-security/ bookworm-security\n\
                       Debian http://deb.debian.org/debian/ bookworm\n\
                       Debian http://deb.debian.org/debian/ bookworm-updates\n";
        let (main, sec) = parse_mirrors(targets);
        assert_eq!(main.as_deref(), Some("http://deb.debian.org/debian"));
        assert_eq!(
            sec.as_deref(),
            Some("http://deb.debian.org/debian-security")
        );
        assert_eq!(
            suite_sources("trixie", main.as_deref().unwrap(), sec.as_deref()),
            "deb http://deb.debian.org/debian trixie main\n\
             deb http://deb.debian.org/debian-security trixie-security main\n"
        );
        assert_eq!(parse_mirrors(""), (None, None));
    }
}
