//! Drop sites: kernel text addresses to `symbol+0xoffset`, from /proc/kallsyms.

/// A sorted symbol table. Empty when kallsyms hides addresses (kptr_restrict, no root).
///
/// Compact, because it lives as long as the agent: ~120,000 text symbols as one string of
/// names with (address, offset) pairs take ~4 MiB, where a `String` per symbol took ~8.
#[derive(Debug, Default)]
pub struct Kallsyms {
    /// (address, end of its name in `names`), sorted by address.
    symbols: Vec<(u64, u32)>,
    names: String,
}

impl Kallsyms {
    /// Reads /proc/kallsyms line by line (no copy of the whole text is held).
    pub fn load() -> Self {
        use std::io::BufRead as _;
        let Ok(file) = std::fs::File::open("/proc/kallsyms") else {
            return Self::default();
        };
        let mut k = Self::default();
        let mut reader = std::io::BufReader::with_capacity(64 * 1024, file);
        let mut line = String::new();
        while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
            k.push_line(&line);
            line.clear();
        }
        k.finish()
    }

    /// Parses kallsyms text; keeps text symbols (t/T) only, since drop sites are code.
    pub fn parse(text: &str) -> Self {
        let mut k = Self::default();
        for line in text.lines() {
            k.push_line(line);
        }
        k.finish()
    }

    fn push_line(&mut self, line: &str) {
        let mut parts = line.split_whitespace();
        let (Some(addr), Some(kind), Some(name)) = (parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        let Ok(addr) = u64::from_str_radix(addr, 16) else {
            return;
        };
        if addr != 0 && matches!(kind, "t" | "T") {
            self.names.push_str(name);
            self.symbols.push((addr, self.names.len() as u32));
        }
    }

    fn finish(mut self) -> Self {
        // Names are referenced by their end offset; the start is the previous entry's end in
        // file order, so remember both before sorting by address.
        let mut start = 0u32;
        let mut spans: Vec<(u64, u32, u32)> = self
            .symbols
            .iter()
            .map(|&(addr, end)| {
                let span = (addr, start, end);
                start = end;
                span
            })
            .collect();
        spans.sort_unstable_by_key(|s| s.0);
        let mut names = String::with_capacity(self.names.len());
        self.symbols = spans
            .into_iter()
            .map(|(addr, s, e)| {
                names.push_str(&self.names[s as usize..e as usize]);
                (addr, names.len() as u32)
            })
            .collect();
        self.symbols.shrink_to_fit();
        self.names = names;
        self
    }

    /// `symbol+0xoff` for an address, or None when unknown.
    pub fn resolve(&self, addr: u64) -> Option<String> {
        if addr == 0 {
            return None;
        }
        let idx = self
            .symbols
            .partition_point(|(a, _)| *a <= addr)
            .checked_sub(1)?;
        let (base, end) = self.symbols[idx];
        let start = idx.checked_sub(1).map_or(0, |i| self.symbols[i].1);
        let name = &self.names[start as usize..end as usize];
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

    #[test]
    fn hidden_addresses_give_an_empty_table() {
        let k = Kallsyms::parse("0000000000000000 T ip_rcv\n");
        assert!(k.is_empty());
    }
}
