//! Value parsers for configuration variables. Each returns a message that completes the
//! sentence "VAR=\"value\": …", so the error says what a good value looks like.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::Quantity;

pub fn port(s: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err("must be a port number, 1–65535".into()),
    }
}

pub fn int_in<T>(s: &str, lo: T, hi: T) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy,
{
    match s.parse::<T>() {
        Ok(v) if v >= lo && v <= hi => Ok(v),
        _ => Err(format!("must be a whole number from {lo} to {hi}")),
    }
}

/// A non-negative Kubernetes quantity (`8`, `1500m`, `64Gi`, `1e3`).
pub fn quantity(s: &str) -> Result<Quantity, String> {
    match reconcilers::quantity::parse_milli(s) {
        Some(milli) if milli >= 0 => Ok(Quantity {
            text: s.to_string(),
            milli,
        }),
        Some(_) => Err("must not be negative".into()),
        None => Err("must be a Kubernetes quantity such as 8, 1500m, 64Gi or 500M".into()),
    }
}

/// A duration: a whole number with a unit, `s`, `m`, `h` or `d` (`90s`, `12h`, `7d`).
pub fn duration_ms(s: &str) -> Result<i64, String> {
    const HOW: &str = "must be a whole number with a unit s, m, h or d, such as 12h or 7d";
    let split = s.len().saturating_sub(1);
    let (n, unit) = (s.get(..split).unwrap_or(""), s.get(split..).unwrap_or(""));
    let scale: i64 = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(HOW.into()),
    };
    match n.parse::<i64>() {
        Ok(v) if v > 0 => v.checked_mul(scale).ok_or_else(|| "is too large".into()),
        _ => Err(HOW.into()),
    }
}

/// `HOST:PORT` to listen on. An empty host (`:9091`) means every IPv4 address.
pub fn listen_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let hint = "must be [HOST]:PORT with an IP address or no host, e.g. :9091, 127.0.0.1:9091 or [::1]:9091";
    let (host, port) = s.rsplit_once(':').ok_or_else(|| hint.to_string())?;
    let port: u16 = port.parse().map_err(|_| hint.to_string())?;
    let ip = match host {
        "" => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
        _ => return Err(hint.into()),
    };
    Ok(SocketAddr::new(ip, port))
}

pub fn boolean(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err("must be true or false".into()),
    }
}

pub fn ip(s: &str) -> Result<IpAddr, String> {
    s.parse()
        .map_err(|_| "must be an IP address such as 10.0.0.5".into())
}

/// A Kubernetes label value: at most 63 characters, alphanumerics with `-`, `_`, `.` inside.
pub fn label_value(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let inner_ok = b
        .iter()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    let ends_ok = b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric);
    if b.len() <= 63 && inner_ok && ends_ok {
        Ok(s.to_string())
    } else {
        Err("must be a valid label value: at most 63 characters, letters, digits, '-', '_' and '.', starting and ending with a letter or digit".into())
    }
}

/// A node name: an RFC 1123 DNS subdomain (lowercase, at most 253 characters).
pub fn dns_subdomain(s: &str) -> Result<String, String> {
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            && b[0] != b'-'
            && b[b.len() - 1] != b'-'
    };
    if s.len() <= 253 && s.split('.').all(label_ok) {
        Ok(s.to_string())
    } else {
        Err("must be a DNS subdomain: lowercase letters, digits, '-' and '.', at most 253 characters".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_with_and_without_a_host() {
        assert_eq!(listen_addr(":9091").unwrap().to_string(), "0.0.0.0:9091");
        assert_eq!(
            listen_addr("127.0.0.1:1").unwrap().to_string(),
            "127.0.0.1:1"
        );
        assert_eq!(listen_addr("[::1]:80").unwrap().to_string(), "[::1]:80");
        assert_eq!(
            listen_addr("localhost:9").unwrap().to_string(),
            "127.0.0.1:9"
        );
        for bad in ["9091", "example.com:80", ":99999", ":", "1.2.3.4"] {
            assert!(listen_addr(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_values() {
        for good in ["a", "amd-epyc-9004", "A_b.c", &"x".repeat(63)] {
            assert!(label_value(good).is_ok(), "{good}");
        }
        for bad in ["-a", "a-", "a b", "a/b", &"x".repeat(64)] {
            assert!(label_value(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn node_names() {
        assert!(dns_subdomain("cocoon-pool").is_ok());
        assert!(dns_subdomain("node-1.zone-a").is_ok());
        for bad in ["Cocoon", "a..b", "-a", "a_b", ""] {
            assert!(dns_subdomain(bad).is_err(), "{bad}");
        }
    }
}

/// T12: a comma-separated list of hosts, each `host`, `host:port` or `[v6]:port`, or `*`.
pub fn url_hosts(s: &str) -> Result<Vec<String>, String> {
    const HOW: &str = "must be hosts separated by commas, each a host name or address with an \
                       optional :port (no scheme, no path), or * for any host";
    let mut out = Vec::new();
    for h in s.split(',').map(str::trim).filter(|h| !h.is_empty()) {
        let ok = h == "*"
            || (!h.contains("://")
                && !h.contains(['/', '@', '?', '#', ' '])
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b)));
        if !ok {
            return Err(format!("{h:?} {HOW}"));
        }
        out.push(h.to_ascii_lowercase());
    }
    Ok(out)
}

/// T15: a comma-separated list of repository names (cocoon snapshot names without a tag).
pub fn public_bases(s: &str) -> Result<Vec<String>, String> {
    const HOW: &str = "must be repository names separated by commas (letters, digits, . _ / -, \
                       starting with a letter or digit, no :tag), like ubuntu-24.04,bases/win11";
    let mut out = Vec::new();
    for n in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !crate::registry::valid_snapshot_name(n) || n.contains(':') {
            return Err(format!("{n:?} {HOW}"));
        }
        out.push(n.to_string());
    }
    Ok(out)
}

/// T14: `namespace=net[,net…]` entries separated by `;`, namespace `*` for every namespace.
pub fn networks(s: &str) -> Result<std::collections::BTreeMap<String, Vec<String>>, String> {
    const HOW: &str = "must be entries namespace=network[,network…] separated by ;, \
                       with * for every namespace (like team-a=isolated-a;*=shared)";
    let mut out = std::collections::BTreeMap::new();
    for entry in s.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((ns, nets)) = entry.split_once('=') else {
            return Err(format!("{entry:?} {HOW}"));
        };
        let ns = ns.trim();
        if ns != "*" && dns_subdomain(ns).is_err() {
            return Err(format!("{ns:?} is not a namespace; the value {HOW}"));
        }
        let nets: Vec<String> = nets
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect();
        if let Some(bad) = nets.iter().find(|n| !reconcilers::names::valid_network(n)) {
            return Err(format!("{bad:?} is not a network name; the value {HOW}"));
        }
        out.insert(ns.to_string(), nets);
    }
    Ok(out)
}

/// The host (and port) of `OCI_REGISTRY`, which images may always be fetched from.
pub fn registry_host(registry: &str) -> Option<String> {
    let rest = registry
        .strip_prefix("https://")
        .or_else(|| registry.strip_prefix("http://"))
        .unwrap_or(registry);
    let host = rest.split('/').next().unwrap_or("");
    (!host.is_empty()).then(|| host.to_ascii_lowercase())
}

/// An absolute directory path, already clean (no `.`, `..`, doubled or trailing `/`): the
/// root `clone-from-dir` paths are compared against component by component.
pub fn absolute_dir(s: &str) -> Result<std::path::PathBuf, String> {
    let p = std::path::Path::new(s);
    if !p.is_absolute() {
        return Err("must be an absolute path".into());
    }
    let clean: std::path::PathBuf = p.components().collect();
    if clean.as_os_str() != p.as_os_str()
        || p.components().any(|c| {
            matches!(
                c,
                std::path::Component::CurDir | std::path::Component::ParentDir
            )
        })
    {
        return Err(format!("must be a clean path (like {})", clean.display()));
    }
    Ok(clean)
}

#[cfg(test)]
mod clone_root_tests {
    use super::{absolute_dir, networks, public_bases, registry_host, url_hosts};

    #[test]
    fn public_bases_are_repository_names() {
        assert_eq!(
            public_bases(" ubuntu-24.04, bases/win11 ,").unwrap(),
            ["ubuntu-24.04", "bases/win11"]
        );
        assert!(public_bases("").unwrap().is_empty());
        for bad in ["ubuntu:24.04", "-x", "a b", "x@y", "é"] {
            assert!(public_bases(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn networks_are_listed_by_namespace() {
        let n = networks("team-a=isolated-a, extra ; *=shared").unwrap();
        assert_eq!(n["team-a"], ["isolated-a", "extra"]);
        assert_eq!(n["*"], ["shared"]);
        assert!(networks("").unwrap().is_empty());
        for bad in ["team-a", "Team=x", "a=-x", "a=x y"] {
            assert!(networks(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn image_url_hosts_are_hosts_and_the_registry_gives_its_own() {
        assert_eq!(
            url_hosts("images.example, Mirror.Example:8443,[::1]:5000").unwrap(),
            ["images.example", "mirror.example:8443", "[::1]:5000"]
        );
        assert_eq!(url_hosts("*").unwrap(), ["*"]);
        assert_eq!(url_hosts("").unwrap(), Vec::<String>::new());
        for bad in ["https://x", "x/y", "u@x", "x y"] {
            assert!(url_hosts(bad).is_err(), "{bad}");
        }
        assert_eq!(
            registry_host("127.0.0.1:5000/cocoon").as_deref(),
            Some("127.0.0.1:5000")
        );
        assert_eq!(
            registry_host("https://Registry.Example/ns").as_deref(),
            Some("registry.example")
        );
    }

    #[test]
    fn the_clone_from_dir_root_is_absolute_and_clean() {
        assert_eq!(
            absolute_dir("/var/lib/cocoon/import").unwrap(),
            std::path::PathBuf::from("/var/lib/cocoon/import")
        );
        for bad in [
            "import",
            "/var/../etc",
            "/var/./lib",
            "/var//lib",
            "/var/lib/",
        ] {
            assert!(absolute_dir(bad).is_err(), "{bad} was accepted");
        }
    }
}
