//! Kubernetes resource quantities (`40Gi`, `16G`, `1.5Gi`, `50`, `500m`,
//! `1e3`) as exact whole numbers: what a claim's consumed capacity says.
//! Binary suffixes (`Ki` .. `Ei`) are powers of 1024, decimal ones (`k`,
//! `M`, `G`, `T`, `P`, `E`) powers of 1000 (unlike cuslice's own sizes,
//! where `G` means GiB), `m`, `u`, `n` are fractions. A quantity that is not
//! a whole number (`500m`, `0.5`) is an error, never rounded.

/// The whole number `s` is, or why not.
pub fn parse_whole(s: &str) -> Result<u128, String> {
    let bad =
        |why: &str| format!("expected a whole quantity such as 40Gi, 16G or 50, got {s:?}: {why}");
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let num = num.strip_prefix('+').unwrap_or(num);
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty()
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad("not a number"));
    }
    let digits = format!("{int}{frac}");
    if digits.len() > 30 {
        return Err(bad("too many digits"));
    }
    let mantissa: u128 = digits.parse().map_err(|_| bad("not a number"))?;
    // value = mantissa * mul / 10^frac.len() * 10^exp10
    let (mul, exp10): (u128, i32) = match suffix {
        "" => (1, 0),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        e if e.starts_with(['e', 'E']) => {
            let x: i32 = e[1..].parse().map_err(|_| bad("unknown suffix"))?;
            if !(-30..=30).contains(&x) {
                return Err(bad("exponent out of range"));
            }
            (1, x)
        }
        _ => return Err(bad("unknown suffix")),
    };
    let scale = exp10 - i32::try_from(frac.len()).map_err(|_| bad("too many digits"))?;
    let v = mantissa.checked_mul(mul).ok_or_else(|| bad("too large"))?;
    if scale >= 0 {
        10u128
            .checked_pow(scale.unsigned_abs())
            .and_then(|p| v.checked_mul(p))
            .ok_or_else(|| bad("too large"))
    } else {
        let p = 10u128
            .checked_pow(scale.unsigned_abs())
            .ok_or_else(|| bad("not a whole number"))?;
        if v % p != 0 {
            return Err(bad("not a whole number"));
        }
        Ok(v / p)
    }
}

#[cfg(test)]
mod tests {
    use super::parse_whole;

    #[test]
    fn quantities_are_exact_whole_numbers() {
        for (s, v) in [
            ("40Gi", 40u128 << 30),
            ("16G", 16_000_000_000),
            ("1.5Gi", 3 << 29),
            ("50", 50),
            ("+7", 7),
            ("1e3", 1000),
            ("2E2", 200),
            ("1000m", 1),
            ("0", 0),
            ("141Gi", 141 << 30),
            ("0.5Ki", 512),
        ] {
            assert_eq!(parse_whole(s), Ok(v), "{s}");
        }
        for (s, why) in [
            ("500m", "not a whole number"),
            ("0.5", "not a whole number"),
            ("4 potatoes", "unknown suffix"),
            ("-1", "not a number"),
            ("", "not a number"),
            ("Gi", "not a number"),
            ("1.2.3", "not a number"),
            ("99999999999999999999999999999999Ei", "too many digits"),
            ("1e99", "exponent out of range"),
        ] {
            let e = parse_whole(s).expect_err(s);
            assert!(e.ends_with(why), "{s}: {e}");
        }
    }
}
