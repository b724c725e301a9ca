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

/// The value for `device` in a per-device setting as `MPS_PINNED_DEVICE_MEM_LIMIT` writes it:
/// comma-separated `device=value` entries ("0=1G,1=512M"), or a plain value for every device
/// ("1G"); an entry for the device wins over a plain value. `None` if nothing applies.
pub fn per_device(spec: &str, device: u32) -> Result<Option<&str>> {
    let (mut plain, mut own) = (None, None);
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((dev, value)) = entry.split_once('=') else {
            plain = Some(entry);
            continue;
        };
        let dev: u32 = dev.trim().parse().map_err(|_| {
            Error::invalid_value(format!(
                "{dev:?} in {entry:?} is not a device number (example: 0=1G,1=512M)"
            ))
        })?;
        if dev == device {
            own = Some(value.trim());
        }
    }
    Ok(own.or(plain))
}

/// Reads a per-device memory limit as `MPS_PINNED_DEVICE_MEM_LIMIT` writes it (see
/// [`per_device`]); returns the limit for `device`, if one applies. Every entry must be a size.
pub fn parse_device_limit(spec: &str, device: u32) -> Result<Option<u64>> {
    // Every entry is checked, not only the one that applies, so that a typo for another
    // device is found on the first run.
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let size = entry.split_once('=').map_or(entry, |(_, size)| size);
        parse_size(size.trim())?;
    }
    per_device(spec, device)?.map(parse_size).transpose()
}

/// Reads a whole percentage from `min` to 100 (a share, a reservation, a ceiling); None if `s`
/// is anything else.
pub fn parse_percent(s: &str, min: u32) -> Option<u32> {
    s.parse().ok().filter(|p| (min..=100).contains(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_parse() {
        assert_eq!(parse_percent("25", 1), Some(25));
        assert_eq!(parse_percent("0", 0), Some(0));
        for bad in ["0", "101", "", "25%", "2.5", "-1"] {
            assert_eq!(parse_percent(bad, 1), None, "{bad}");
        }
    }

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

    #[test]
    fn device_limits_parse() {
        assert_eq!(parse_device_limit("0=1G", 0).unwrap(), Some(1 << 30));
        assert_eq!(
            parse_device_limit("1=2G, 0=512M", 0).unwrap(),
            Some(512 << 20)
        );
        assert_eq!(parse_device_limit("1=2G", 0).unwrap(), None);
        assert_eq!(parse_device_limit("", 0).unwrap(), None);
        // A plain value is every device's, unless the device has its own.
        assert_eq!(parse_device_limit("1G", 3).unwrap(), Some(1 << 30));
        assert_eq!(parse_device_limit("1G,1=2G", 1).unwrap(), Some(2 << 30));
        assert_eq!(parse_device_limit("1G,1=2G", 0).unwrap(), Some(1 << 30));
        assert_eq!(per_device("0=25,1=50", 1).unwrap(), Some("50"));
        for bad in ["x=1G", "0=lots", "0=1G,=2", "1=lots,0=1G"] {
            assert!(parse_device_limit(bad, 0).is_err(), "{bad}");
        }
    }
}
