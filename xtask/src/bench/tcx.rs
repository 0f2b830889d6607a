//! tcx links made by the bench itself, with raw bpf(2) (the build host's headers predate tcx):
//! the agent's own programs taken over and switched on and off between windows (parts 1b and
//! 6), and the empty classifier part 6 measures as its baseline. Every link and program is a
//! descriptor of the bench: closing it detaches/unloads, also when the bench dies, and nothing
//! is pinned.

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

use anyhow::{Context as _, Result, bail};

use super::net;

// bpf(2) commands and tcx attach types (linux/bpf.h).
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
const BPF_LINK_DETACH: libc::c_long = 34;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;

/// bpf(2) with a 64-byte `bpf_attr`: its non-negative return value.
fn bpf_call(cmd: libc::c_long, attr: &mut [u32; 16]) -> std::io::Result<i64> {
    // SAFETY: a zero-initialised bpf_attr of 64 bytes; the kernel reads only what `cmd` uses.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            std::mem::size_of_val(attr) as u32,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(rc)
}

/// A bpf(2) command that returns a new descriptor.
fn bpf(cmd: libc::c_long, attr: &mut [u32; 16]) -> std::io::Result<OwnedFd> {
    let fd = bpf_call(cmd, attr)?;
    // SAFETY: every command used through here returns a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// bpf(2) commands that return 0 on success must not be wrapped as a descriptor.
fn bpf_plain(cmd: libc::c_long, attr: &mut [u32; 16]) -> std::io::Result<()> {
    bpf_call(cmd, attr).map(drop)
}

/// The two instructions of the empty classifier: `r0 = -1` (TC_ACT_UNSPEC: tcx goes on as if
/// nothing were attached), `exit`. It reads neither the packet nor a map.
const EMPTY_INSNS: [u64; 2] = [
    // BPF_ALU64 | BPF_MOV | BPF_K, dst r0, imm -1.
    0xffff_ffff_0000_00b7,
    // BPF_JMP | BPF_EXIT.
    0x0000_0000_0000_0095,
];

/// The name bpftool shows for the empty classifier (not `clb_*`: it is not the agent's).
pub(crate) const EMPTY_NAME: &str = "bench_empty";

/// Loads the empty classifier (SCHED_CLS, GPL): the measurement floor of part 6. Not part of
/// the product's eBPF object; unloaded when the returned descriptor (and any link of it) closes.
pub(crate) fn load_empty_classifier() -> Result<OwnedFd> {
    let license = c"GPL";
    let mut attr = [0u32; 16];
    let insns = EMPTY_INSNS.as_ptr() as u64;
    let lic = license.as_ptr() as u64;
    attr[0] = BPF_PROG_TYPE_SCHED_CLS;
    attr[1] = EMPTY_INSNS.len() as u32;
    (attr[2], attr[3]) = (insns as u32, (insns >> 32) as u32);
    (attr[4], attr[5]) = (lic as u32, (lic >> 32) as u32);
    // prog_name: bytes 48..64.
    let mut name = [0u8; 16];
    name[..EMPTY_NAME.len()].copy_from_slice(EMPTY_NAME.as_bytes());
    for (i, c) in name.chunks(4).enumerate() {
        attr[12 + i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
    }
    bpf(BPF_PROG_LOAD, &mut attr).context("loading the empty tc classifier (BPF_PROG_LOAD)")
}

/// The kernel's id of the program behind `fd` (its fdinfo).
pub(crate) fn prog_id(fd: &OwnedFd) -> Result<u32> {
    let path = format!("/proc/self/fdinfo/{}", fd.as_raw_fd());
    std::fs::read_to_string(&path)
        .with_context(|| format!("reading {path}"))?
        .lines()
        .find_map(|l| l.strip_prefix("prog_id:"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no prog_id in {path}"))
}

/// A tcx link of the agent, as its fdinfo describes it.
#[derive(Debug, Clone, Copy)]
struct TcxLink {
    link_id: u32,
    prog_id: u32,
    ifindex: u32,
    attach_type: u32,
}

/// The tcx links the agent process `pid` holds (from /proc/<pid>/fdinfo: exactly this agent's,
/// whatever other agents run on the machine).
fn agent_tcx_links(pid: i32) -> Result<Vec<TcxLink>> {
    let mut links = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        let Ok(text) = std::fs::read_to_string(entry?.path()) else {
            continue;
        };
        let field = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u32>().ok())
        };
        let is_tcx = text
            .lines()
            .any(|l| l.starts_with("link_type:") && l.contains("tcx"));
        if let (true, Some(link_id), Some(prog_id), Some(ifindex), Some(attach_type)) = (
            is_tcx,
            field("link_id:"),
            field("prog_id:"),
            field("ifindex:"),
            field("attach_type:"),
        ) {
            links.push(TcxLink {
                link_id,
                prog_id,
                ifindex,
                attach_type,
            });
        }
    }
    Ok(links)
}

/// One program on one hook: (program fd, its id, ifindex, attach type).
struct Hooked {
    prog: OwnedFd,
    prog_id: u32,
    ifindex: u32,
    attach_type: u32,
}

/// The agent's programs on the NIC, switched on and off by the bench: created as tcx links
/// of the bench (closing the descriptor detaches, also when the bench dies).
pub(crate) struct Toggle {
    progs: Vec<Hooked>,
    links: Vec<OwnedFd>,
    /// What `links` are, when there are any.
    attached: Attached,
}

/// What the bench's links run on the agent's hooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attached {
    /// The agent's own programs.
    Agent,
    /// The agent's programs, except program id N: the empty classifier on its hook.
    Swapped(u32),
    /// The empty classifier on every hook: the floor a tc-attached probe cannot go below.
    AllEmpty,
}

impl Toggle {
    /// Takes over the agent's tcx links: the same programs on the same hooks, from now on
    /// attached by us.
    pub(crate) fn take_over(agent_pid: i32) -> Result<Toggle> {
        let found = agent_tcx_links(agent_pid)?;
        // Every interface it attached to (the NIC, and the VIP interface): "nothing" means
        // none of its classifiers anywhere.
        if found.is_empty() {
            bail!("the agent holds no tcx link: the bench needs tcx (kernel >= 6.6)");
        }
        let mut progs = Vec::new();
        for l in found {
            let mut attr = [0u32; 16];
            attr[0] = l.prog_id;
            let prog = bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)
                .with_context(|| format!("program id {}", l.prog_id))?;
            let mut attr = [0u32; 16];
            attr[0] = l.link_id;
            let link = bpf(BPF_LINK_GET_FD_BY_ID, &mut attr)
                .with_context(|| format!("link id {}", l.link_id))?;
            let mut attr = [0u32; 16];
            attr[0] = link.as_raw_fd() as u32;
            bpf_plain(BPF_LINK_DETACH, &mut attr)
                .with_context(|| format!("detaching the agent's link {}", l.link_id))?;
            progs.push(Hooked {
                prog,
                prog_id: l.prog_id,
                ifindex: l.ifindex,
                attach_type: l.attach_type,
            });
        }
        Ok(Toggle {
            progs,
            links: Vec::new(),
            attached: Attached::Agent,
        })
    }

    /// Every program of the agent on its hook.
    pub(crate) fn on(&mut self) -> Result<()> {
        self.attach(Attached::Agent, None)
    }

    /// The empty classifier `empty` on every hook the agent's programs held: the same hooks,
    /// the same number of programs, none of their work.
    pub(crate) fn all_empty(&mut self, empty: &OwnedFd) -> Result<()> {
        self.attach(Attached::AllEmpty, Some(empty))
    }

    /// Every program of the agent on its hook, except program `prog_id`: `instead` takes its
    /// place (its hook alone runs one program either way).
    pub(crate) fn swap(&mut self, prog_id: u32, instead: &OwnedFd) -> Result<()> {
        if !self.progs.iter().any(|h| h.prog_id == prog_id) {
            bail!("the agent has no tcx link of program id {prog_id}");
        }
        self.attach(Attached::Swapped(prog_id), Some(instead))
    }

    fn attach(&mut self, what: Attached, empty: Option<&OwnedFd>) -> Result<()> {
        if !self.links.is_empty() && self.attached == what {
            return Ok(());
        }
        self.off();
        self.attached = what;
        let specs: Vec<(i32, u32, u32)> = self
            .progs
            .iter()
            .map(|h| {
                let fd = match (what, empty) {
                    (Attached::AllEmpty, Some(e)) => e.as_raw_fd(),
                    (Attached::Swapped(id), Some(e)) if id == h.prog_id => e.as_raw_fd(),
                    _ => h.prog.as_raw_fd(),
                };
                (fd, h.ifindex, h.attach_type)
            })
            .collect();
        // The ifindex is the node namespace's: create the links from a thread inside it.
        self.links = test_support::lab::in_netns(net::NS_NODE, move || {
            specs
                .iter()
                .map(|&(prog, ifindex, attach_type)| {
                    let mut attr = [0u32; 16];
                    (attr[0], attr[1], attr[2]) = (prog as u32, ifindex, attach_type);
                    bpf(BPF_LINK_CREATE, &mut attr).context("tcx link create")
                })
                .collect::<Result<Vec<_>>>()
        })?;
        Ok(())
    }

    /// None of the agent's programs anywhere.
    pub(crate) fn off(&mut self) {
        self.links.clear();
    }
}
