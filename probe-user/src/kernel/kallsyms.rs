//! Drop sites: kernel text addresses to `symbol+0xoffset`, from /proc/kallsyms.

use std::{collections::HashMap, sync::Mutex};

/// Names resolved and kept; beyond this a name is looked up again each time (drop sites are a
/// few dozen call sites of `kfree_skb`, so this is never reached in practice).
const NAMES_KEPT: usize = 4096;

/// Where the names are read from when an address is first resolved.
#[derive(Debug, Default)]
enum Names {
    /// /proc/kallsyms, read again for a symbol not seen before.
    #[default]
    Proc,
    /// Text given to [`Kallsyms::parse`] (tests).
    Text(String),
}

/// The kernel's text symbol addresses, sorted; names are looked up when an address is first
/// resolved, and kept. Empty when kallsyms hides addresses (kptr_restrict, no root).
///
/// Addresses only, because this lives as long as the agent: ~120,000 text symbols take
/// ~1 MiB as addresses, ~4.9 MiB with every name held (one string of names, heaptrack of
/// the agent, BENCHMARKS.md 9f), ~8 MiB as a `String` per symbol. A drop is resolved on the
/// reader's task; the first drop at a new site pays one read of /proc/kallsyms (~30 ms on
/// 6.18 here), every later one a map look-up.
#[derive(Debug, Default)]
pub struct Kallsyms {
    /// Text symbols' addresses, sorted.
    addrs: Vec<u64>,
    names: Names,
    /// Address of a symbol -> its name (None: not found when read again).
    resolved: Mutex<HashMap<u64, Option<Box<str>>>>,
}

impl Kallsyms {
    /// Reads /proc/kallsyms line by line (no copy of the whole text is held).
    pub fn load() -> Self {
        let mut addrs = Vec::new();
        for_each_text_symbol(&Names::Proc, |addr, _| {
            addrs.push(addr);
            true
        });
        Self::of(addrs, Names::Proc)
    }

    /// Parses kallsyms text; keeps text symbols (t/T) only, since drop sites are code.
    pub fn parse(text: &str) -> Self {
        let names = Names::Text(text.to_string());
        let mut addrs = Vec::new();
        for_each_text_symbol(&names, |addr, _| {
            addrs.push(addr);
            true
        });
        Self::of(addrs, names)
    }

    fn of(mut addrs: Vec<u64>, names: Names) -> Self {
        addrs.sort_unstable();
        addrs.dedup();
        addrs.shrink_to_fit();
        Kallsyms {
            addrs,
            names,
            resolved: Mutex::default(),
        }
    }

    /// `symbol+0xoff` for an address, or None when unknown.
    pub fn resolve(&self, addr: u64) -> Option<String> {
        if addr == 0 {
            return None;
        }
        let idx = self.addrs.partition_point(|a| *a <= addr).checked_sub(1)?;
        let base = self.addrs[idx];
        let name = self.name_at(base)?;
        Some(format!("{name}+{:#x}", addr - base))
    }

    /// The name of the text symbol at `base`: kept, or read again (the first of several at
    /// one address, in kallsyms' order).
    fn name_at(&self, base: u64) -> Option<Box<str>> {
        let mut resolved = self.resolved.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(name) = resolved.get(&base) {
            return name.clone();
        }
        let mut found = None;
        for_each_text_symbol(&self.names, |addr, name| {
            if addr == base {
                found = Some(Box::from(name));
                return false;
            }
            true
        });
        if resolved.len() < NAMES_KEPT {
            resolved.insert(base, found.clone());
        }
        found
    }

    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }
}

/// Calls `f(address, name)` for each text symbol (t/T) with an address, in order, until it
/// returns false.
fn for_each_text_symbol(names: &Names, mut f: impl FnMut(u64, &str) -> bool) {
    let mut line_of = |line: &str| -> bool {
        let mut parts = line.split_whitespace();
        let (Some(addr), Some(kind), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            return true;
        };
        match u64::from_str_radix(addr, 16) {
            Ok(addr) if addr != 0 && matches!(kind, "t" | "T") => f(addr, name),
            _ => true,
        }
    };
    match names {
        Names::Text(text) => {
            for line in text.lines() {
                if !line_of(line) {
                    return;
                }
            }
        }
        Names::Proc => {
            use std::io::BufRead as _;
            let Ok(file) = std::fs::File::open("/proc/kallsyms") else {
                return;
            };
            let mut reader = std::io::BufReader::with_capacity(64 * 1024, file);
            let mut line = String::new();
            while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
                if !line_of(&line) {
                    return;
                }
                line.clear();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_to_nearest_preceding_text_symbol() {
        let k = Kallsyms::parse(
            "ffffffff81000000 T _text\n\
             ffffffff81a00000 t ip_rcv_finish_core.constprop.0\n\
             ffffffff81a00400 T ip_rcv\n\
             ffffffff82000000 D some_data\n",
        );
        assert_eq!(
            k.resolve(0xffffffff81a001ab).as_deref(),
            Some("ip_rcv_finish_core.constprop.0+0x1ab")
        );
        assert_eq!(k.resolve(0xffffffff81a00400).as_deref(), Some("ip_rcv+0x0"));
        assert_eq!(k.resolve(0x10), None);
        assert_eq!(k.resolve(0), None);
    }

    #[test]
    fn unsorted_input_resolves_like_sorted() {
        let k = Kallsyms::parse(
            "ffffffff81a00400 T ip_rcv\n\
             ffffffff81000000 T _text\n\
             ffffffff81a00000 t ip_rcv_finish_core.constprop.0\n",
        );
        assert_eq!(k.resolve(0xffffffff81000010).as_deref(), Some("_text+0x10"));
        assert_eq!(
            k.resolve(0xffffffff81a00001).as_deref(),
            Some("ip_rcv_finish_core.constprop.0+0x1")
        );
        assert_eq!(
            k.resolve(0xffffffff81a00500).as_deref(),
            Some("ip_rcv+0x100")
        );
    }

    /// A name is read once and kept: the text it came from can change without changing it.
    #[test]
    fn a_resolved_name_is_kept() {
        let mut k = Kallsyms::parse("ffffffff81a00400 T ip_rcv\n");
        assert_eq!(k.resolve(0xffffffff81a00401).as_deref(), Some("ip_rcv+0x1"));
        k.names = Names::Text(String::new());
        assert_eq!(k.resolve(0xffffffff81a00402).as_deref(), Some("ip_rcv+0x2"));
    }

    #[test]
    fn hidden_addresses_give_an_empty_table() {
        let k = Kallsyms::parse("0000000000000000 T ip_rcv\n");
        assert!(k.is_empty());
    }
}
