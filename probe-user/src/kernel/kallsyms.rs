//! Drop sites: kernel text addresses to `symbol+0xoffset`, from /proc/kallsyms.

/// A sorted symbol table. Empty when kallsyms hides addresses (kptr_restrict, no root).
#[derive(Debug, Default)]
pub struct Kallsyms {
    symbols: Vec<(u64, String)>,
}

impl Kallsyms {
    pub fn load() -> Self {
        std::fs::read_to_string("/proc/kallsyms")
            .map(|text| Self::parse(&text))
            .unwrap_or_default()
    }

    /// Parses kallsyms text; keeps text symbols (t/T) only, since drop sites are code.
    pub fn parse(text: &str) -> Self {
        let mut symbols: Vec<(u64, String)> = text
            .lines()
            .filter_map(|line| {
                let mut parts = line.split_whitespace();
                let addr = u64::from_str_radix(parts.next()?, 16).ok()?;
                let kind = parts.next()?;
                let name = parts.next()?;
                (addr != 0 && matches!(kind, "t" | "T")).then(|| (addr, name.to_string()))
            })
            .collect();
        symbols.sort_unstable_by_key(|(a, _)| *a);
        Self { symbols }
    }

    /// `symbol+0xoff` for an address, or None when unknown.
    pub fn resolve(&self, addr: u64) -> Option<String> {
        if addr == 0 {
            return None;
        }
        let idx = self.symbols.partition_point(|(a, _)| *a <= addr);
        let (base, name) = self.symbols.get(idx.checked_sub(1)?)?;
        Some(format!("{name}+{:#x}", addr - base))
    }

    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
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
    fn hidden_addresses_give_an_empty_table() {
        let k = Kallsyms::parse("0000000000000000 T ip_rcv\n");
        assert!(k.is_empty());
    }
}
