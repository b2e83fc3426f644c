//! Kubernetes resource quantities (`500m`, `2`, `4Gi`, `1.5e3`), parsed exactly into
//! thousandths so `1500m` and `1.5` compare equal and no float rounding leaks into argv.

/// The value × 1000, or `None` when the text is not a quantity.
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
    let mut scale = 3 + exp10 - frac_part.len() as i32; // ×1000 for milli
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
    // Round up: a quantity is never allowed to shrink below what was asked.
    let r = (v + den - 1) / den;
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

    #[test]
    fn rejects_non_quantities() {
        for bad in ["", "abc", "1x", "Gi", "1.2.3", "--1"] {
            assert_eq!(parse_milli(bad), None, "{bad}");
        }
    }
}
