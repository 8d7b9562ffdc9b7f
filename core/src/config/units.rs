//! Values as they are written: sizes, percentages, milliseconds, switches
//! and GPU UUIDs; and how a user's value is shown in a message.

/// Upper bound for `compute_slice_ms`.
pub const MAX_COMPUTE_SLICE_MS: u32 = 1_000;
/// Longest `memory_wait` (one hour).
pub const MAX_MEMORY_WAIT_MS: u64 = 3_600_000;
/// Upper bound for `compute_burst_ms`.
pub const MAX_COMPUTE_BURST_MS: u32 = 10_000;

pub(super) const SIZE_EXPECTED: &str = "a size like 4GiB, 4096MiB, 4g, 512m or a number of bytes";
pub(super) const PERCENT_EXPECTED: &str = "a percentage from 1 to 100 like 30 or \"30%\"";
pub(super) const UUID_EXAMPLE: &str = "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b";

/// Sizes: "4GiB", "4096MiB", "4g", "512m", "1.5GiB", "1073741824" (bytes),
/// case-insensitive units k/m/g/t/p with optional "i"/"ib"/"b". ALL binary:
/// 1k = 1024 and "4GB" = 4 GiB. A fraction is rounded down to a whole byte;
/// without a unit (or with "b") the number must be whole.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || format!("expected {SIZE_EXPECTED}, got {}", shown(s));
    let t = s.trim();
    let num_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(num_end);
    let unit = unit.trim_start_matches(' ').to_ascii_lowercase();
    let (int_part, frac_part) = match num.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (num, None),
    };
    if int_part.is_empty()
        || !int_part.bytes().all(|b| b.is_ascii_digit())
        || frac_part.is_some_and(|f| f.is_empty() || !f.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(bad());
    }
    let shift: u32 = match unit.as_str() {
        "" | "b" => 0,
        "k" | "ki" | "kib" | "kb" => 10,
        "m" | "mi" | "mib" | "mb" => 20,
        "g" | "gi" | "gib" | "gb" => 30,
        "t" | "ti" | "tib" | "tb" => 40,
        "p" | "pi" | "pib" | "pb" => 50,
        _ => return Err(bad()),
    };
    let too_large = || format!("expected a size below 16EiB, got {}", shown(s));
    let mult: u128 = 1u128 << shift;
    let mut total: u128 = 0;
    for b in int_part.bytes() {
        total = total
            .checked_mul(10)
            .and_then(|v| v.checked_add(u128::from(b - b'0')))
            .filter(|v| *v <= u128::from(u64::MAX))
            .ok_or_else(too_large)?;
    }
    total = total.checked_mul(mult).ok_or_else(too_large)?;
    if let Some(f) = frac_part {
        if shift == 0 && f.bytes().any(|b| b != b'0') {
            return Err(format!(
                "expected a whole number of bytes (a fraction needs a unit, like 1.5GiB), got {}",
                shown(s)
            ));
        }
        // Digits past the 18th cannot add a byte at these magnitudes
        // (2^50 / 10^18 < 1); ignoring them keeps the arithmetic in u128.
        let f = &f[..f.len().min(18)];
        let mut frac: u128 = 0;
        for b in f.bytes() {
            frac = frac * 10 + u128::from(b - b'0');
        }
        let denom = 10u128.pow(f.len() as u32);
        total = total
            .checked_add(frac * mult / denom)
            .ok_or_else(too_large)?;
    }
    u64::try_from(total).map_err(|_| too_large())
}

/// A byte count in the largest binary unit that divides it exactly
/// ("4GiB", "1536MiB", "1048577"); parse_size reads it back.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [(u32, &str); 5] = [
        (50, "PiB"),
        (40, "TiB"),
        (30, "GiB"),
        (20, "MiB"),
        (10, "KiB"),
    ];
    if bytes != 0 {
        for (shift, unit) in UNITS {
            if bytes.trailing_zeros() >= shift {
                return format!("{}{unit}", bytes >> shift);
            }
        }
    }
    bytes.to_string()
}

/// Percent: "30", "30%", integer 1..=100 (surrounding spaces allowed).
pub fn parse_percent(s: &str) -> Result<u8, String> {
    let t = s.trim();
    let digits = t.strip_suffix('%').unwrap_or(t).trim_end();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("expected {PERCENT_EXPECTED}, got {}", shown(s)));
    }
    match digits.parse::<u32>() {
        Ok(p @ 1..=100) => u8::try_from(p).map_err(|_| String::new()),
        _ => Err(format!(
            "expected a percentage from 1 to 100, got {}",
            shown(s)
        )),
    }
}

/// "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b" (also without the "GPU-"
/// prefix, or with "MIG-", case-insensitive) -> 16 bytes.
pub fn parse_uuid(s: &str) -> Result<[u8; 16], String> {
    let bad = || format!("expected a GPU UUID like {UUID_EXAMPLE}, got {}", shown(s));
    let t = s.trim();
    let body = match t.get(..4) {
        Some(p) if p.eq_ignore_ascii_case("gpu-") || p.eq_ignore_ascii_case("mig-") => &t[4..],
        _ => t,
    };
    let b = body.as_bytes();
    if b.len() != 36 {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    let mut n = 0;
    let mut hi: Option<u8> = None;
    for (pos, &c) in b.iter().enumerate() {
        if matches!(pos, 8 | 13 | 18 | 23) {
            if c != b'-' {
                return Err(bad());
            }
            continue;
        }
        let v = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => return Err(bad()),
        };
        match hi.take() {
            None => hi = Some(v),
            Some(h) => {
                // 32 hex digits between the fixed dashes: n stays below 16.
                if let Some(slot) = out.get_mut(n) {
                    *slot = (h << 4) | v;
                }
                n += 1;
            }
        }
    }
    Ok(out)
}

/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lowercase.
pub fn format_uuid(u: &[u8; 16]) -> String {
    let mut s = String::with_capacity(40);
    s.push_str("GPU-");
    for (i, b) in u.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// "200", "200ms", " 200 ms " -> 200 (whole milliseconds, 1..=10000).
pub fn parse_burst(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let digits = t.strip_suffix("ms").unwrap_or(t).trim_end();
    if digits.is_empty() || digits.len() > 12 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "expected whole milliseconds from 1 to {MAX_COMPUTE_BURST_MS} (like 200 or \"200ms\"), got {}",
            shown(s)
        ));
    }
    check_burst(digits.parse::<i128>().unwrap_or(i128::MAX), &shown(s))
}

pub(super) fn check_burst(ms: i128, shown: &str) -> Result<u32, String> {
    if (1..=MAX_COMPUTE_BURST_MS as i128).contains(&ms) {
        Ok(ms as u32)
    } else {
        Err(format!(
            "expected whole milliseconds from 1 to {MAX_COMPUTE_BURST_MS}, got {shown}"
        ))
    }
}

/// "20", "20ms", " 20 ms " -> 20 (whole milliseconds, 1..=1000).
pub fn parse_slice(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let digits = t.strip_suffix("ms").unwrap_or(t).trim_end();
    if digits.is_empty() || digits.len() > 12 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "expected whole milliseconds from 1 to {MAX_COMPUTE_SLICE_MS} (like 20 or \"20ms\"), got {}",
            shown(s)
        ));
    }
    check_slice(digits.parse::<i128>().unwrap_or(i128::MAX), &shown(s))
}

pub(super) fn check_slice(ms: i128, shown: &str) -> Result<u32, String> {
    if (1..=MAX_COMPUTE_SLICE_MS as i128).contains(&ms) {
        Ok(ms as u32)
    } else {
        Err(format!(
            "expected whole milliseconds from 1 to {MAX_COMPUTE_SLICE_MS}, got {shown}"
        ))
    }
}

/// "30s", "500ms", "2m", "0" -> milliseconds (at most one hour): how
/// long an allocation waits for memory (`memory_wait`).
pub fn parse_wait(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let expected = || {
        format!(
            "expected a duration like \"30s\", \"500ms\" or \"2m\" (whole numbers, at most 1h), got {}",
            shown(s)
        )
    };
    let (digits, scale) = if let Some(d) = t.strip_suffix("ms") {
        (d, 1)
    } else if let Some(d) = t.strip_suffix('s') {
        (d, 1_000)
    } else if let Some(d) = t.strip_suffix('m') {
        (d, 60_000)
    } else if let Some(d) = t.strip_suffix('h') {
        (d, 3_600_000)
    } else if t == "0" {
        ("0", 1)
    } else {
        return Err(expected());
    };
    let digits = digits.trim_end();
    if digits.is_empty() || digits.len() > 12 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(expected());
    }
    let ms = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|&ms| ms <= MAX_MEMORY_WAIT_MS)
        .ok_or_else(expected)?;
    Ok(ms)
}

/// A yes/no setting: 1/true/yes/on, 0/false/no/off (case-insensitive).
pub fn parse_switch(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(format!(
            "expected 1, true, yes, on or 0, false, no, off, got {}",
            shown(s)
        )),
    }
}

/// A user-supplied string for a message: quoted and escaped (so it stays on
/// one line), and cut at 80 characters.
pub(super) fn shown(s: &str) -> String {
    const MAX: usize = 80;
    if s.chars().count() > MAX {
        let cut: String = s.chars().take(MAX).collect();
        format!("{cut:?}...")
    } else {
        format!("{s:?}")
    }
}

/// Forces a message onto one line: control characters become escapes.
pub(super) fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const U1: &str = "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b";
    const U1_BYTES: [u8; 16] = [
        0x8f, 0x3c, 0x2a, 0x1e, 0x5b, 0x7d, 0x4c, 0x2e, 0x9a, 0x1b, 0x0c, 0x3d, 0x4e, 0x5f, 0x6a,
        0x7b,
    ];
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    #[test]
    fn size_forms() {
        let cases: &[(&str, u64)] = &[
            ("4GiB", 4 * GIB),
            ("4096MiB", 4 * GIB),
            ("4g", 4 * GIB),
            ("4G", 4 * GIB),
            ("4Gi", 4 * GIB),
            ("4GB", 4 * GIB),
            ("4gb", 4 * GIB),
            ("512m", 512 * MIB),
            ("512 MiB", 512 * MIB),
            (" 512M ", 512 * MIB),
            ("1.5GiB", 3 * GIB / 2),
            ("0.5g", GIB / 2),
            ("0.1GiB", 107_374_182),
            ("1073741824", GIB),
            ("1073741824b", GIB),
            ("1024k", MIB),
            ("1KiB", 1024),
            ("1kb", 1024),
            ("2t", 2 << 40),
            ("1TiB", 1 << 40),
            ("1PiB", 1 << 50),
            ("1p", 1 << 50),
            ("0", 0),
            ("1.0", 1),
            ("1.00000000000000000000000001GiB", GIB),
            ("1.99999999999999999999999999k", 2047),
        ];
        for (s, want) in cases {
            assert_eq!(parse_size(s), Ok(*want), "{s}");
        }
        // Units above P are not known.
        assert!(parse_size("1EiB").is_err());
        assert_eq!(parse_size("16383PiB"), Ok(16383u64 << 50));
        assert!(parse_size("16384PiB").unwrap_err().contains("below 16EiB"));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert!(parse_size("18446744073709551616").is_err());
        for bad in [
            "",
            " ",
            "g",
            "4.g",
            ".5g",
            "-1",
            "+1",
            "4 potatoes",
            "4GX",
            "4gib2",
            "1e9",
            "0x10",
            "4,5g",
            "4..5g",
        ] {
            let e = parse_size(bad).unwrap_err();
            assert!(
                e.starts_with(
                    "expected a size like 4GiB, 4096MiB, 4g, 512m or a number of bytes, got "
                ),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn format_size_round_trips() {
        for b in [
            0,
            1,
            1023,
            1024,
            MIB,
            1536 * MIB,
            4 * GIB,
            1 << 40,
            1 << 50,
            3 << 50,
            1_048_577,
            u64::MAX,
        ] {
            assert_eq!(parse_size(&format_size(b)), Ok(b), "{b}");
        }
        assert_eq!(format_size(4 * GIB), "4GiB");
        assert_eq!(format_size(1536 * MIB), "1536MiB");
        assert_eq!(format_size(1_048_577), "1048577");
    }

    #[test]
    fn percent_forms() {
        assert_eq!(parse_percent("30"), Ok(30));
        assert_eq!(parse_percent("30%"), Ok(30));
        assert_eq!(parse_percent(" 30 % "), Ok(30));
        assert_eq!(parse_percent("1"), Ok(1));
        assert_eq!(parse_percent("100%"), Ok(100));
        assert_eq!(parse_percent("007"), Ok(7));
        for bad in ["0", "101", "", "%", "-5", "30.5", "abc", "99999999999999"] {
            assert!(parse_percent(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn uuid_forms() {
        assert_eq!(parse_uuid(U1), Ok(U1_BYTES));
        assert_eq!(parse_uuid(&U1.to_uppercase()), Ok(U1_BYTES));
        assert_eq!(parse_uuid(&U1[4..]), Ok(U1_BYTES));
        assert_eq!(
            parse_uuid("gpu-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b"),
            Ok(U1_BYTES)
        );
        assert_eq!(
            parse_uuid("MIG-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b"),
            Ok(U1_BYTES)
        );
        assert_eq!(format_uuid(&U1_BYTES), U1);
        assert_eq!(parse_uuid(&format_uuid(&[0xab; 16])), Ok([0xab; 16]));
        for bad in [
            "",
            "GPU-",
            "GPU-8f3c2a1e5b7d4c2e9a1b0c3d4e5f6a7b",
            "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b0",
            "GPU-8f3c2a1e-5b7d-4c2e-9a1b_0c3d4e5f6a7b",
            "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7g",
            "XPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b",
            "GPU-é3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b",
        ] {
            let e = parse_uuid(bad).unwrap_err();
            assert!(e.starts_with("expected a GPU UUID like GPU-"), "{bad}: {e}");
        }
    }
}
