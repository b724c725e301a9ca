//! Byte sizes as operators write them ("4GiB", "512M", "1073741824").

use crate::status::{Error, Result};

/// Parses a byte size: a number with an optional unit K, M, G, T (powers of 1024, with or without
/// a trailing "iB" or "B"), case-insensitive.
pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let bad = || {
        Error::invalid_value(format!(
            "{s:?} is not a byte size (examples: 4GiB, 512M, 1073741824)"
        ))
    };
    let n: u64 = num.parse().map_err(|_| bad())?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_size("4g").unwrap(), 4 << 30);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size(" 1024 ").unwrap(), 1024);
        assert_eq!(parse_size("3 KiB").unwrap(), 3072);
        for bad in ["", "G", "4X", "-1G", "1.5G", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
