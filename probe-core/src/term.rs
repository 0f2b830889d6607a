//! Text from outside the agent (interface names, Kubernetes Event fields, pod and Service
//! names, evidence built from them) made safe to print on a terminal.
//!
//! A NIC is allowed almost any byte in its name, and a tenant writes whatever it likes into
//! an Event: printed raw, `ESC [ 2 J` clears the operator's screen and an OSC sequence retitles
//! it or rewrites what it shows. [`escape`] writes such characters as visible escapes, the way
//! the agent's own log lines do (tracing-subscriber's escaping): `ESC` -> `\x1b`, BEL -> `\x07`,
//! every other C0 control and DEL as `\xNN`, C1 controls (U+0080..U+009F, the 8-bit CSI and
//! OSC) and the bidirectional overrides and isolates (U+202A..U+202E, U+2066..U+2069, which
//! reorder what the eye reads) as `\u{NNNN}`. A backslash itself is kept: the escapes are for
//! the eye, not for parsing back. Machine outputs (JSON) need none of this: JSON escapes
//! control characters itself, and they stay byte-exact there.

use std::borrow::Cow;

/// Whether `c` is written escaped.
fn hostile(c: char) -> bool {
    matches!(c, '\0'..='\x1f' | '\x7f' | '\u{80}'..='\u{9f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with control characters written visibly (see the module docs); borrowed when clean.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(hostile) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            c if (c as u32) < 0x80 && hostile(c) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if hostile(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// [`escape`] for text of several lines: each line escaped, the line breaks kept. For the
/// plugin's human output and its error lines, which hold API text (annotation values, an
/// error Status's `message`) among their own lines.
pub fn escape_lines(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| c != '\n' && hostile(c)) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(s.split('\n').map(escape).collect::<Vec<_>>().join("\n"))
}

#[cfg(test)]
mod tests {
    use super::{escape, escape_lines};

    #[test]
    fn lines_keep_their_breaks_and_lose_their_controls() {
        assert_eq!(escape_lines("a\nb\n"), "a\nb\n");
        assert_eq!(
            escape_lines("value: \u{9b}2J\nforbidden: \x1b]0;x\x07\n"),
            "value: \\u{9b}2J\nforbidden: \\x1b]0;x\\x07\n"
        );
        assert_eq!(escape_lines("cr\r\n"), "cr\\x0d\n");
    }

    #[test]
    fn terminal_controls_come_out_visible() {
        assert_eq!(escape("eth0"), "eth0");
        assert_eq!(escape("ünïcode ✓"), "ünïcode ✓");
        // CSI clear screen, OSC retitle ended by BEL, a C1 CSI, a bidi override, a newline.
        assert_eq!(escape("\x1b[2J"), "\\x1b[2J");
        assert_eq!(escape("\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");
        assert_eq!(escape("a\u{9b}31m"), "a\\u{9b}31m");
        assert_eq!(escape("\u{202e}gnp.exe"), "\\u{202e}gnp.exe");
        assert_eq!(escape("two\nlines\r"), "two\\x0alines\\x0d");
        assert_eq!(escape("\x7f\t"), "\\x7f\\x09");
        for s in ["\x1b[2J", "\x07", "\u{9b}", "\u{9d}"] {
            assert!(!escape(s).chars().any(|c| c.is_control()), "{s:?}");
        }
    }
}
