//! Observing the kernel independently of the agent (bpftool, `ip netns`): which of the tests'
//! programs are loaded or attached, per-CPU map sums, whether the kernel has tcx. A leak
//! check that asked the agent would trust what it checks.

use std::process::Command;

use serde_json::Value;

/// Runs bpftool with `-j` and parses its JSON (Null when it printed nothing).
fn bpftool_json(args: &[&str]) -> Value {
    let out = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .expect("bpftool");
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// The BPF maps process `pid` holds, found through its own descriptors (/proc/<pid>/fdinfo),
/// so another agent's maps of the same name do not count: each map's id and its
/// `bpftool map show` JSON.
pub fn maps_held_by(pid: u32) -> Vec<(String, Value)> {
    let mut maps = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo")).expect("fdinfo") {
        let Ok(fdinfo) = std::fs::read_to_string(entry.unwrap().path()) else {
            continue;
        };
        let Some(id) = fdinfo
            .lines()
            .find_map(|l| l.strip_prefix("map_id:"))
            .map(|v| v.trim().to_string())
        else {
            continue;
        };
        let info: Value = serde_json::from_str(&crate::agent::sh(&[
            "bpftool", "-j", "map", "show", "id", &id,
        ]))
        .unwrap();
        maps.push((id, info));
    }
    maps
}

/// The inodes of the lab's network namespaces: the only ones the tests' agents run in.
fn lab_netns_inodes() -> Vec<u64> {
    use std::os::unix::fs::MetadataExt as _;
    test_support::lab::NAMESPACES
        .iter()
        .filter_map(|ns| std::fs::metadata(format!("/run/netns/{ns}")).ok())
        .map(|m| m.ino())
        .collect()
}

/// The namespace inode a loaded program's agent ran in: `ProbeConfig::netns_ino`, found in the
/// program's `.rodata` after the defaults' leading fields (the agent sets nothing else
/// before it). None when it cannot be told.
fn program_netns(rodata: &[u8]) -> Option<u64> {
    let c = probe_common::ProbeConfig::default();
    let prefix: Vec<u8> = [
        c.dedup_ns,
        c.events_per_sec,
        c.wakeup_bytes,
        c.wakeups_per_sec,
    ]
    .iter()
    .flat_map(|v| v.to_le_bytes())
    .collect();
    let at = rodata.windows(prefix.len()).position(|w| w == prefix)? + prefix.len();
    let ino = rodata.get(at..at + 4)?;
    Some(u64::from(u32::from_le_bytes(ino.try_into().ok()?)))
}

/// A loaded `clb_*` program of the tests' agents: its id, name and the maps it uses.
struct OurProgram {
    id: u64,
    name: String,
    map_ids: Vec<u64>,
}

/// Loaded `clb_*` programs of the tests' agents: those whose agent ran in one of
/// the lab's namespaces, or whose namespace cannot be told (counted: a leak is never
/// missed). Another agent on the machine (a developer's, in its own namespace) is not ours.
fn our_programs() -> Vec<OurProgram> {
    let lab = lab_netns_inodes();
    let map_names: std::collections::HashMap<u64, String> = bpftool_json(&["map", "show"])
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| Some((m.get("id")?.as_u64()?, m.get("name")?.as_str()?.to_string())))
        .collect();
    let mut netns_of_map: std::collections::HashMap<u64, Option<u64>> = Default::default();
    let mut ours = Vec::new();
    for p in bpftool_json(&["prog", "show"])
        .as_array()
        .into_iter()
        .flatten()
    {
        let (Some(id), Some(name)) = (
            p.get("id").and_then(Value::as_u64),
            p.get("name").and_then(Value::as_str),
        ) else {
            continue;
        };
        if !name.starts_with("clb_") {
            continue;
        }
        let map_ids: Vec<u64> = p
            .get("map_ids")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .collect();
        let rodata = map_ids
            .iter()
            .copied()
            .find(|m| map_names.get(m).is_some_and(|n| n.ends_with(".rodata")));
        let netns = rodata.and_then(|m| {
            *netns_of_map.entry(m).or_insert_with(|| {
                let dump = bpftool_json(&["map", "dump", "id", &m.to_string()]);
                program_netns(&hex_bytes(dump.get(0).and_then(|e| e.get("value"))))
            })
        });
        if netns.is_none_or(|ino| lab.contains(&ino)) {
            ours.push(OurProgram {
                id,
                name: name.to_string(),
                map_ids,
            });
        }
    }
    ours
}

/// Names of our programs ([`our_programs`]) attached through a BPF link to a tc hook (tcx).
/// Debian 12's bpftool (7.1) predates tcx: `bpftool net` does not list tcx attachments and
/// `bpftool link` shows them as type 11 without the device, so links are matched to our
/// programs by id.
pub fn our_tc_links() -> Vec<String> {
    let ours: std::collections::HashMap<u64, String> = our_programs()
        .into_iter()
        .filter(|p| p.name == "clb_ingress" || p.name == "clb_egress")
        .map(|p| (p.id, p.name))
        .collect();
    bpftool_json(&["link", "show"])
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| ours.get(&l.get("prog_id")?.as_u64()?).cloned())
        .collect()
}

/// Our programs ([`our_programs`]) still loaded.
pub fn our_loaded_programs() -> Vec<String> {
    our_programs().into_iter().map(|p| p.name).collect()
}

/// The entries of the tests' agents' maps named `map` (bpftool's JSON dump of each, joined),
/// found through [`our_programs`]: a map of the same name another agent on the machine holds
/// (a bench's, in its own namespace) is not read.
pub fn our_map_dump(map: &str) -> Vec<Value> {
    let ids: std::collections::BTreeSet<u64> =
        our_programs().into_iter().flat_map(|p| p.map_ids).collect();
    let mut entries = Vec::new();
    for id in ids {
        let info = bpftool_json(&["map", "show", "id", &id.to_string()]);
        if info.get("name").and_then(Value::as_str) != Some(map) {
            continue;
        }
        let dump = bpftool_json(&["map", "dump", "id", &id.to_string()]);
        entries.extend(dump.as_array().into_iter().flatten().cloned());
    }
    entries
}

/// Sum of a per-CPU map's values for keys matching `pred`, read with bpftool
/// (an observer independent of the agent) from the tests' agents' maps ([`our_map_dump`]).
pub fn percpu_map_sum(map: &str, pred: impl Fn(&[u8]) -> bool) -> u64 {
    let mut total = 0;
    for entry in &our_map_dump(map) {
        let key = hex_bytes(entry.get("key"));
        if !pred(&key) {
            continue;
        }
        for cpu in entry
            .get("values")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let bytes = hex_bytes(cpu.get("value"));
            let mut buf = [0u8; 8];
            buf[..bytes.len().min(8)].copy_from_slice(&bytes[..bytes.len().min(8)]);
            total += u64::from_le_bytes(buf);
        }
    }
    total
}

/// bpftool prints bytes as `["0x0a", ...]`.
pub fn hex_bytes(v: Option<&Value>) -> Vec<u8> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|b| u8::from_str_radix(b.as_str()?.trim_start_matches("0x"), 16).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether this kernel has tcx (>= 6.6): the agent attaches through tcx links there, through
/// cls_bpf filters under clsact otherwise (which outlive a SIGKILLed agent).
pub fn kernel_has_tcx() -> bool {
    let release = Command::new("uname")
        .arg("-r")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let mut nums = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|n| n.parse::<u32>().ok());
    let (major, minor) = (nums.next().unwrap_or(0), nums.next().unwrap_or(0));
    (major, minor) >= (6, 6)
}

/// Panics naming what the tests' agents left attached or loaded ([`our_tc_attachments`],
/// [`our_loaded_programs`]).
pub fn assert_nothing_attached() {
    assert!(
        our_tc_attachments().is_empty(),
        "left attached: {:?}",
        our_tc_attachments()
    );
    assert!(
        our_loaded_programs().is_empty(),
        "left loaded: {:?}",
        our_loaded_programs()
    );
}

/// Our programs attached to a tc hook, either way: tcx links ([`our_tc_links`]) plus cls_bpf
/// filters named `clb_*` in the lab's namespaces (`bpftool net` lists the clsact filters of
/// the namespace it runs in; the tests' agents attach nowhere else).
pub fn our_tc_attachments() -> Vec<String> {
    let mut found = our_tc_links();
    for ns in test_support::lab::NAMESPACES {
        let Ok(out) = Command::new("ip")
            .args(["netns", "exec", ns, "bpftool", "-j", "net"])
            .output()
        else {
            continue;
        };
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        for per_ns in v.as_array().into_iter().flatten() {
            for f in per_ns
                .get("tc")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(name) = f.get("name").and_then(Value::as_str)
                    && name.starts_with("clb_")
                {
                    found.push(name.to_string());
                }
            }
        }
    }
    found
}
