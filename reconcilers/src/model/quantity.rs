//! Kubernetes resource quantities (`500m`, `2`, `4Gi`, `1.5e3`), parsed exactly into
//! thousandths so `1500m` and `1.5` compare equal and no float rounding leaks into argv.

/// The largest magnitude a quantity may have, in thousandths. Kubernetes caps a quantity at
/// 2^63 − 1 whole units, and the journal reads sizes back through i64 (`output::cocoon`);
/// within this bound every product the core takes of a quantity (`cpu_policy`: ×1024,
/// ×100) stays far inside i128.
pub const MAX_MILLI: i128 = i64::MAX as i128 * 1000;

/// The value × 1000, or `None` when the text is not a quantity or its magnitude exceeds
/// [`MAX_MILLI`]: a pod annotation is arbitrary text, and a value that does not fit must be
/// refused, never wrapped.
pub fn parse_milli(q: &str) -> Option<i128> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let (mult_num, mult_den, exp10): (i128, i128, i32) = match suffix {
        "" => (1, 1, 0),
        "m" => (1, 1000, 0),
        "k" => (1, 1, 3),
        "M" => (1, 1, 6),
        "G" => (1, 1, 9),
        "T" => (1, 1, 12),
        "P" => (1, 1, 15),
        "E" => (1, 1, 18),
        "Ki" => (1 << 10, 1, 0),
        "Mi" => (1 << 20, 1, 0),
        "Gi" => (1 << 30, 1, 0),
        "Ti" => (1 << 40, 1, 0),
        "Pi" => (1 << 50, 1, 0),
        "Ei" => (1 << 60, 1, 0),
        s if s.starts_with(['e', 'E']) => (1, 1, s[1..].parse::<i32>().ok()?),
        _ => return None,
    };
    let (neg, digits) = match num.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, num.strip_prefix('+').unwrap_or(num)),
    };
    let (int_part, frac_part) = digits.split_once('.').unwrap_or((digits, ""));
    if int_part.is_empty() && frac_part.is_empty() {
        return None;
    }
    if !int_part
        .bytes()
        .chain(frac_part.bytes())
        .all(|c| c.is_ascii_digit())
        || frac_part.len() > 18
    {
        return None;
    }
    // mantissa = int.frac as an integer over 10^frac_len
    let mantissa: i128 = format!("{int_part}{frac_part}").parse().ok()?;
    if mantissa == 0 {
        // Zero at any exponent; the loops below would otherwise run `exp10` times.
        return Some(0);
    }
    // i64: `exp10` may be any i32 (`1e2147483647`). Each loop ends within 39 steps, when
    // the nonzero value or the denominator overflows.
    let mut scale = 3 + i64::from(exp10) - frac_part.len() as i64; // ×1000 for milli
    let mut v = mantissa.checked_mul(mult_num)?;
    let mut den = mult_den;
    while scale > 0 {
        v = v.checked_mul(10)?;
        scale -= 1;
    }
    while scale < 0 {
        den = den.checked_mul(10)?;
        scale += 1;
    }
    // Round up: a quantity is never allowed to shrink below what was asked. `v + den - 1`
    // could overflow; the quotient and a remainder test cannot.
    let r = v / den + i128::from(v % den != 0);
    if r > MAX_MILLI {
        return None;
    }
    Some(if neg { -r } else { r })
}

/// Whole units, rounded up (`1500m` → 2, `4Gi` → 4294967296).
pub fn parse_ceil_units(q: &str) -> Option<i128> {
    parse_milli(q).map(|m| (m + 999).div_euclid(1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_common_forms() {
        assert_eq!(parse_milli("500m"), Some(500));
        assert_eq!(parse_milli("2"), Some(2000));
        assert_eq!(parse_milli("1.5"), Some(1500));
        assert_eq!(parse_milli("0.1"), Some(100));
        assert_eq!(parse_ceil_units("4Gi"), Some(4 << 30));
        assert_eq!(parse_ceil_units("1500m"), Some(2));
        assert_eq!(parse_ceil_units("1e3"), Some(1000));
        assert_eq!(parse_ceil_units("1k"), Some(1000));
        assert_eq!(parse_ceil_units("512Mi"), Some(512 << 20));
    }

    /// A value past 2^63 − 1 units is an error, not a panic (debug) or a wrap (release).
    #[test]
    fn a_quantity_too_large_for_i64_units_is_refused() {
        let max = i64::MAX.to_string();
        assert_eq!(parse_ceil_units(&max), Some(i64::MAX as i128));
        assert_eq!(parse_milli(&format!("-{max}")), Some(-MAX_MILLI));
        for big in [
            "9223372036854775808",
            "170141183460469231731687303715884105",
            "123456789012345678901234567890123456",
            "8Ei",
            "100E",
            "1e19",
            "1e2147483647",
            "-1e2147483647",
            "170141183460469231731687303715884105.727m",
        ] {
            assert_eq!(parse_milli(big), None, "{big}");
            assert_eq!(parse_ceil_units(big), None, "{big}");
        }
    }

    /// Zero with a huge exponent is zero at once, not 2^31 multiplications; a huge negative
    /// exponent is refused like any value finer than the scale can hold.
    #[test]
    fn extreme_exponents_end_at_once() {
        assert_eq!(parse_milli("0e2147483647"), Some(0));
        assert_eq!(parse_milli("0.000e2147483647"), Some(0));
        assert_eq!(parse_milli("1e-2147483648"), None);
    }

    #[test]
    fn rejects_non_quantities() {
        for bad in ["", "abc", "1x", "Gi", "1.2.3", "--1"] {
            assert_eq!(parse_milli(bad), None, "{bad}");
        }
    }
}
