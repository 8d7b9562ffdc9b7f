//! The one place where text from tenants is made safe for a terminal or a
//! log line (docs/threat-model.md, "Text from tenants on the host's
//! terminals and logs"). Tenants control container commands and
//! annotations (names, pods, images, via `container.json`), the tenant
//! names in the shared per-GPU segment, their processes' command lines in
//! `/proc`, and the paths in their environments. If these reach a
//! terminal raw, `ESC ] 0 ; … BEL` sets the terminal's title, `ESC [ 2 J`
//! clears the screen, and a newline or carriage return forges a whole row of
//! `cuslice status` or a whole line of `cuslice watch`'s log.
//!
//! [`clean`] (and [`clean_to`], with another bound) replaces each character
//! that is not shown as itself with a visible escape, so that nothing is
//! lost silently and one string stays on one line:
//!
//! - control characters (C0, including `\n`, `\r`, `\t`, NUL and ESC; DEL;
//!   C1, U+0080 to U+009F, which some terminals take as CSI and OSC):
//!   `\n`, `\r`, `\t`, `\0`, `\x1b`, `\x7f`, `\u{9b}`;
//! - the characters that reorder or hide text: bidirectional embeddings,
//!   overrides and isolates (U+202A to U+202E, U+2066 to U+2069, the
//!   "Trojan Source" characters), the line and paragraph separators
//!   (U+2028, U+2029), and the other format characters and default
//!   ignorable code points (zero-width space and joiners, word joiner,
//!   soft hyphen, BOM, variation selectors, tag characters, ...):
//!   `\u{202e}`, `\u{200b}`.
//!
//! Everything else, ordinary printable Unicode included (`é`, `日本`), is
//! kept as it is. A backslash is kept too: a tenant can write the text
//! `\n`, which reads like an escaped newline but still stays on its line
//! and forges nothing; keeping it makes the escaping idempotent
//! (`clean(clean(s)) == clean(s)`), so that a string cleaned where it
//! entered one model (the watch's findings) and again where it enters the
//! next (`cuslice status` reading the watch's state) is escaped once.
//!
//! The result is also bounded, [`FIELD_MAX`] characters for one value (a
//! name, an image, a command) and [`LINE_MAX`] for a whole log line, cut at
//! an escape's boundary and ended with `…`: a tenant's command or
//! annotation can be hundreds of kilobytes, and journald splits a log line
//! longer than its `LineMax` (48 KiB by default) into several entries, the
//! second starting with the tenant's text: a forged line again.

/// At most this many characters for one value from a tenant, escapes
/// included: room for any Kubernetes name (a pod's is at most 253), an
/// image reference with its digest, and a long command line; a table cuts
/// it further to the terminal's width.
pub const FIELD_MAX: usize = 512;

/// At most this many characters for one log line: several values and
/// paths, and still at most 16 KiB of UTF-8, a third of journald's
/// default `LineMax`.
pub const LINE_MAX: usize = 4096;

/// `s` made safe for a terminal or a one-line log, at most [`FIELD_MAX`]
/// characters (see the module documentation).
pub fn clean(s: &str) -> String {
    clean_to(s, FIELD_MAX)
}

/// `s` made safe for a terminal or a one-line log, at most `max`
/// characters: escapes as [`clean`]'s; a longer result is cut at the end
/// of a character or an escape and ends with `…` (itself counted).
pub fn clean_to(s: &str, max: usize) -> String {
    if max == 0 {
        return String::new();
    }
    let mut out = String::with_capacity(s.len().min(max.saturating_mul(4)));
    // Characters in `out`, and its length (bytes) at the last boundary
    // that leaves room for the `…`.
    let (mut n, mut keep) = (0usize, 0usize);
    for c in s.chars() {
        n += push(&mut out, c);
        if n > max {
            out.truncate(keep);
            out.push('…');
            return out;
        }
        if n < max {
            keep = out.len();
        }
    }
    out
}

/// Appends `c`, or its escape, to `out`; returns how many characters that
/// is.
fn push(out: &mut String, c: char) -> usize {
    let escape = match c {
        '\n' => "\\n",
        '\r' => "\\r",
        '\t' => "\\t",
        '\0' => "\\0",
        c if c.is_ascii_control() => {
            out.push_str(&format!("\\x{:02x}", u32::from(c)));
            return 4;
        }
        c if c.is_control() || hidden(c) => {
            let e = format!("\\u{{{:x}}}", u32::from(c));
            let n = e.len();
            out.push_str(&e);
            return n;
        }
        c => {
            out.push(c);
            return 1;
        }
    };
    out.push_str(escape);
    2
}

/// Characters a terminal does not show as themselves, beyond the control
/// characters: format characters (Unicode category Cf), the line and
/// paragraph separators (Zl, Zp) and the default ignorable code points.
const HIDDEN: [(u32, u32); 25] = [
    (0x00AD, 0x00AD), // soft hyphen
    (0x034F, 0x034F), // combining grapheme joiner
    (0x0600, 0x0605), // Arabic number signs
    (0x061C, 0x061C), // Arabic letter mark
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x115F, 0x1160), // Hangul fillers
    (0x17B4, 0x17B5),
    (0x180B, 0x180F), // Mongolian variation selectors, vowel separator
    (0x200B, 0x200F), // zero-width space, non-joiner, joiner; LRM, RLM
    (0x2028, 0x202E), // line and paragraph separators; LRE RLE PDF LRO RLO
    (0x2060, 0x206F), // word joiner, invisible operators; LRI RLI FSI PDI; ...
    (0x3164, 0x3164), // Hangul filler
    (0xFE00, 0xFE0F), // variation selectors
    (0xFEFF, 0xFEFF), // zero-width no-break space (BOM)
    (0xFFA0, 0xFFA0), // halfwidth Hangul filler
    (0xFFF0, 0xFFFB), // unassigned ignorables; interlinear annotation
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F), // Egyptian hieroglyph format controls
    (0x1BCA0, 0x1BCA3), // shorthand format controls
    (0x1D173, 0x1D17A), // musical symbol format controls
    (0xE0000, 0xE0FFF), // tags, variation selectors supplement
];

fn hidden(c: char) -> bool {
    let c = u32::from(c);
    HIDDEN.iter().any(|(lo, hi)| (*lo..=*hi).contains(&c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_escape_sequences_are_shown_not_sent() {
        // OSC 0 (sets the window title), ended by BEL or by ST (ESC \).
        assert_eq!(clean("\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");
        assert_eq!(clean("\x1b]0;pwned\x1b\\"), "\\x1b]0;pwned\\x1b\\");
        // CSI: clear the screen, move the cursor, colours.
        assert_eq!(
            clean("a\x1b[2J\x1b[H\x1b[31mb"),
            "a\\x1b[2J\\x1b[H\\x1b[31mb"
        );
        // C1 controls: CSI (U+009B) and OSC (U+009D) in one character,
        // NEL (U+0085), a newline to some terminals and log readers.
        assert_eq!(
            clean("\u{9b}2J\u{9d}0;x\u{85}"),
            "\\u{9b}2J\\u{9d}0;x\\u{85}"
        );
        assert_eq!(clean("\u{80}\u{9f}"), "\\u{80}\\u{9f}");
    }

    #[test]
    fn line_breaks_and_other_c0_controls_stay_on_one_line() {
        let forged = "trainer\n  evil  pytorch  80G/80G  100%";
        let c = clean(forged);
        assert_eq!(c, "trainer\\n  evil  pytorch  80G/80G  100%");
        assert!(!c.contains('\n'));
        assert_eq!(
            clean("a\r\nb\tc\0d\x7fe\x08f"),
            "a\\r\\nb\\tc\\0d\\x7fe\\x08f"
        );
        assert_eq!(clean("\x01\x1f"), "\\x01\\x1f");
        for b in (0u8..0x20).chain([0x7f]) {
            let c = clean(&char::from(b).to_string());
            assert!(
                c.starts_with('\\') && c.chars().all(|x| x.is_ascii_graphic()),
                "{c}"
            );
        }
    }

    #[test]
    fn characters_that_reorder_or_hide_text_are_shown() {
        // "Trojan Source": an override makes `evil` read `live`.
        assert_eq!(clean("\u{202e}live\u{202c}"), "\\u{202e}live\\u{202c}");
        for c in [
            '\u{202a}', '\u{202b}', '\u{202d}', '\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}',
        ] {
            assert_eq!(clean(&c.to_string()), format!("\\u{{{:x}}}", u32::from(c)));
        }
        // Zero-width characters, marks, separators, BOM, tags.
        assert_eq!(
            clean("ad\u{200b}min\u{200d}\u{200e}\u{200f}\u{2028}\u{2029}\u{feff}\u{ad}"),
            "ad\\u{200b}min\\u{200d}\\u{200e}\\u{200f}\\u{2028}\\u{2029}\\u{feff}\\u{ad}"
        );
        assert_eq!(clean("\u{e0041}\u{fff9}"), "\\u{e0041}\\u{fff9}");
    }

    #[test]
    fn ordinary_text_is_kept_as_it_is() {
        for s in [
            "",
            "team-a/train-0/trainer pytorch/pytorch:2.3",
            "python3 /workspace/train.py --lr=3e-4 \"quoted\" 'single' \\path",
            "café 日本語 Ünïcödé ёж 🚀 e\u{301}",
            "C:\\dir\\n",
        ] {
            assert_eq!(clean(s), s);
        }
    }

    #[test]
    fn cleaning_twice_is_cleaning_once() {
        for s in [
            "\x1b]0;pwned\x07\n\u{202e}x\ty",
            &"\x1b".repeat(1000),
            &"é".repeat(FIELD_MAX + 3),
            "plain",
        ] {
            let once = clean(s);
            assert_eq!(clean(&once), once);
            assert!(once.chars().count() <= FIELD_MAX);
        }
    }

    #[test]
    fn long_text_is_cut_with_an_ellipsis_at_an_escapes_boundary() {
        assert_eq!(clean_to("abcdef", 6), "abcdef");
        assert_eq!(clean_to("abcdefg", 6), "abcde…");
        assert_eq!(clean_to("abcdefg", 1), "…");
        assert_eq!(clean_to("abc", 0), "");
        // An escape is never cut in the middle.
        assert_eq!(clean_to("ab\x1bcd", 6), "ab…");
        assert_eq!(clean_to("ab\x1b", 6), "ab\\x1b");
        assert_eq!(clean_to("日本語日本語", 4), "日本語…");
        let long = "x".repeat(1 << 20);
        let c = clean(&long);
        assert_eq!(c.chars().count(), FIELD_MAX);
        assert!(c.ends_with('…'));
        // A megabyte of escapes costs at most the bound.
        let c = clean_to(&"\n".repeat(1 << 20), LINE_MAX);
        assert!(c.chars().count() <= LINE_MAX && c.ends_with('…'));
    }
}
