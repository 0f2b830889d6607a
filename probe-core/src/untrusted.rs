//! Strings the agent does not write itself (a Service's annotation values, a process's
//! command name), made safe once, where they enter: bounded in size and with terminal
//! controls written visibly ([`crate::term::escape`]). Every output then carries the safe
//! form: the events' JSON, the Node condition, the Event note, the LoopbackReport, the live
//! view.
//!
//! Why at the entry and not only at each output: an entered string is copied into every
//! event of its loop (evidence, remedy, facts) and from there into the report, the condition
//! and the Event; bounding it once bounds every copy, and escaping it once leaves no output
//! that forgot. The outputs a tenant or the API reads (the Node condition, the Event note)
//! also pass their whole text through [`text`], as a second fence.
//!
//! A cut value ends in [`CUT_MARK`] and the original size, so the cut is visible and a value
//! that was cut is never mistaken for the real one ([`is_cut`]: the fixes build no patch from
//! it).

use crate::term;

/// Where a cut value's kept head ends: `…[cut from 250000 bytes]` follows it.
pub const CUT_MARK: &str = "…[cut from ";

/// A Service annotation value the agent keeps (the provider LB settings the fixes and the
/// remedies read). The settings are flags (`"true"`), modes (`"ip"`), hostnames (at most 253
/// bytes) and short attribute lists, so 256 bytes keeps every real one whole; a tenant's
/// 250 KB value would otherwise be copied into every event of its LB IP.
pub const ANNOTATION_VALUE_MAX: usize = 256;

/// A process's command name: the kernel keeps 15 bytes, each at most four once escaped
/// (`\x1b`); 64 leaves room and bounds a longer name from elsewhere.
pub const PROCESS_NAME_MAX: usize = 64;

/// `s` with its terminal controls escaped, then cut to at most `max` bytes (marker included)
/// on a char boundary. `max` below the marker's length (about 30 bytes) keeps the marker
/// alone.
pub fn text(s: &str, max: usize) -> String {
    cut(&term::escape(s), max)
}

/// `s` cut to at most `max` bytes on a char boundary, ending in [`CUT_MARK`] and `s`'s size
/// when cut; `s` itself when it fits.
pub fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mark = format!("{CUT_MARK}{} bytes]", s.len());
    let mut end = max.saturating_sub(mark.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{mark}", &s[..end])
}

/// Whether `s` was cut by [`cut`] (holds its marker).
pub fn is_cut(s: &str) -> bool {
    s.contains(CUT_MARK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_clean_text_is_kept_as_is() {
        assert_eq!(text("true", ANNOTATION_VALUE_MAX), "true");
        assert_eq!(text("kube-apiserver", PROCESS_NAME_MAX), "kube-apiserver");
        assert!(!is_cut("true"));
    }

    /// E2: a tenant's 250 KB value comes out at the cap, its head kept, the cut marked with
    /// the original size.
    #[test]
    fn a_long_value_is_cut_to_the_cap_with_a_visible_marker() {
        let huge = "x".repeat(250_000);
        let kept = text(&huge, ANNOTATION_VALUE_MAX);
        assert!(kept.len() <= ANNOTATION_VALUE_MAX, "{}", kept.len());
        assert!(kept.starts_with("xxxx"));
        assert!(kept.ends_with("…[cut from 250000 bytes]"), "{kept}");
        assert!(is_cut(&kept));
        // On a char boundary: three-byte chars never split.
        let wide = "€".repeat(200);
        let kept = cut(&wide, 100);
        assert!(kept.len() <= 100 && kept.starts_with('€'), "{kept}");
        assert!(
            kept.trim_end_matches(|c| c != '€')
                .chars()
                .all(|c| c == '€')
        );
    }

    /// E8: a command name that clears the screen comes out visible, within the cap.
    #[test]
    fn a_process_name_with_terminal_controls_comes_out_escaped() {
        let name = text("\x1b[2J ALL CLEAR\x07", PROCESS_NAME_MAX);
        assert_eq!(name, "\\x1b[2J ALL CLEAR\\x07");
        // Escaping grows a name up to four times; the cap still holds.
        let all_esc = text(&"\x1b".repeat(60), PROCESS_NAME_MAX);
        assert!(all_esc.len() <= PROCESS_NAME_MAX, "{all_esc}");
        assert!(!all_esc.chars().any(|c| c.is_control()), "{all_esc}");
        // Escaping twice changes nothing (an entered name passes an output's fence again).
        assert_eq!(text(&name, PROCESS_NAME_MAX), name);
        // C1 CSI and a bidi override.
        assert_eq!(
            text("a\u{9b}2J\u{202e}b", PROCESS_NAME_MAX),
            "a\\u{9b}2J\\u{202e}b"
        );
    }
}
