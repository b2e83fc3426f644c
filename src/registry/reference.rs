//! Registry base, repository names and registry-relative references (`repo[:tag]`).

use std::net::IpAddr;

/// Where a tag or a digest points inside one repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Tag(String),
    Digest(String),
}

impl Target {
    /// `tag` is a tag, or a `sha256:` digest (a reference's second part may be either).
    pub fn parse(tag: &str) -> Result<Target, String> {
        if tag.starts_with("sha256:") {
            if !valid_digest(tag) {
                return Err(format!("{tag:?} is not a sha256 digest"));
            }
            return Ok(Target::Digest(tag.to_string()));
        }
        if !valid_tag(tag) {
            return Err(format!(
                "tag {tag:?} does not match [A-Za-z0-9_][A-Za-z0-9._-]{{0,127}}"
            ));
        }
        Ok(Target::Tag(tag.to_string()))
    }

    pub fn as_str(&self) -> &str {
        match self {
            Target::Tag(s) | Target::Digest(s) => s,
        }
    }
}

/// A registry-relative reference: `repo[:tag]`, split at the first `:`, `latest` when the tag
/// is missing, `repo@digest` when the second part is a `sha256:` digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelativeRef {
    pub repo: String,
    pub target: Target,
}

impl RelativeRef {
    pub fn parse(s: &str) -> Result<RelativeRef, String> {
        let (repo, tag) = match s.split_once(':') {
            Some((r, t)) => (r, t),
            None => (s, "latest"),
        };
        if !valid_repo(repo) {
            return Err(format!(
                "repository {repo:?} is not a lowercase OCI path (a-z0-9 components joined by \
                 '.', '_', '__' or '-', separated by '/')"
            ));
        }
        Ok(RelativeRef {
            repo: repo.to_string(),
            target: Target::parse(tag)?,
        })
    }
}

/// `OCI_REGISTRY` split into the registry host and the repository path prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Base {
    /// `host[:port]`, as it appears in URLs.
    pub host: String,
    /// Path prefix without leading or trailing `/`; empty when there is none.
    pub prefix: String,
}

impl Base {
    pub fn parse(base: &str) -> Result<Base, String> {
        let base = base.trim().trim_end_matches('/');
        if base.contains("://") {
            return Err(format!(
                "OCI_REGISTRY {base:?} must be host[:port][/prefix], without a scheme"
            ));
        }
        let (host, prefix) = base.split_once('/').unwrap_or((base, ""));
        if host.is_empty() || host.contains(char::is_whitespace) || host.contains('@') {
            return Err(format!("OCI_REGISTRY {base:?} has no usable host"));
        }
        if !prefix.is_empty() && !valid_repo(prefix) {
            return Err(format!(
                "OCI_REGISTRY path prefix {prefix:?} is not a lowercase OCI path"
            ));
        }
        Ok(Base {
            host: host.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// `<prefix>/<name>`, or `<name>` without a prefix.
    pub fn repository(&self, name: &str) -> Result<String, String> {
        if !valid_repo(name) {
            return Err(format!(
                "repository name {name:?} is not a lowercase OCI path"
            ));
        }
        Ok(if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}/{name}", self.prefix)
        })
    }

    /// Plain HTTP only where nothing leaves the host or the private network: localhost,
    /// loopback, RFC 1918 addresses and `*.local`; everything else is HTTPS.
    pub fn plain_http(&self) -> bool {
        let host = host_without_port(&self.host);
        if host.eq_ignore_ascii_case("localhost") || host.to_ascii_lowercase().ends_with(".local") {
            return true;
        }
        match host.parse::<IpAddr>() {
            Ok(IpAddr::V4(ip)) => ip.is_loopback() || ip.is_private(),
            Ok(IpAddr::V6(ip)) => ip.is_loopback(),
            Err(_) => false,
        }
    }
}

fn host_without_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    }
}

/// `a-z0-9` components joined by `.`, `_`, `__` or runs of `-`, separated by `/`.
pub fn valid_repo(repo: &str) -> bool {
    !repo.is_empty() && repo.len() <= 255 && repo.split('/').all(valid_component)
}

fn valid_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

pub fn valid_tag(tag: &str) -> bool {
    let b = tag.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b[1..]
            .iter()
            .all(|&x| x.is_ascii_alphanumeric() || x == b'_' || x == b'.' || x == b'-')
}

pub fn valid_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|x| x.is_ascii_digit() || (b'a'..=b'f').contains(&x))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_refs_split_at_the_first_colon() {
        let r = RelativeRef::parse("acme/agent").unwrap();
        assert_eq!(r.repo, "acme/agent");
        assert_eq!(r.target, Target::Tag("latest".into()));
        let r = RelativeRef::parse("agent:v2").unwrap();
        assert_eq!(r.target, Target::Tag("v2".into()));
        let d = format!("sha256:{}", "a".repeat(64));
        let r = RelativeRef::parse(&format!("agent:{d}")).unwrap();
        assert_eq!(r.target, Target::Digest(d));
        // The first colon splits: "v1:x" is then an invalid tag, never a port.
        assert!(RelativeRef::parse("agent:v1:x").is_err());
        assert!(RelativeRef::parse("agent:sha256:abc").is_err());
    }

    #[test]
    fn repository_grammar() {
        for ok in [
            "a", "a/b", "a.b", "a_b", "a__b", "a---b", "vm-0", "x9/y.z_w",
        ] {
            assert!(valid_repo(ok), "{ok}");
        }
        for bad in [
            "", "A", "a/", "/a", "a//b", "-a", "a-", "a___b", "a._b", "a b", "a:b",
        ] {
            assert!(!valid_repo(bad), "{bad}");
        }
    }

    #[test]
    fn tag_grammar() {
        assert!(valid_tag("hibernate"));
        assert!(valid_tag("_x.Y-1"));
        assert!(valid_tag(&"a".repeat(128)));
        assert!(!valid_tag(&"a".repeat(129)));
        assert!(!valid_tag(".x"));
        assert!(!valid_tag("-x"));
        assert!(!valid_tag(""));
        assert!(!valid_tag("a/b"));
    }

    #[test]
    fn base_host_prefix_and_transport() {
        let b = Base::parse("127.0.0.1:5000").unwrap();
        assert_eq!(b.host, "127.0.0.1:5000");
        assert_eq!(b.repository("vm-a").unwrap(), "vm-a");
        assert!(b.plain_http());
        let b = Base::parse("europe-docker.pkg.dev/proj/snaps/").unwrap();
        assert_eq!(b.host, "europe-docker.pkg.dev");
        assert_eq!(b.prefix, "proj/snaps");
        assert_eq!(b.repository("vm-a").unwrap(), "proj/snaps/vm-a");
        assert!(!b.plain_http());
        assert!(b.repository("VM").is_err());
        for plain in [
            "localhost:5000",
            "10.1.2.3",
            "172.16.0.1:80",
            "192.168.1.1:5000",
            "reg.local",
            "[::1]:5000",
        ] {
            assert!(Base::parse(plain).unwrap().plain_http(), "{plain}");
        }
        for tls in ["172.32.0.1", "8.8.8.8:443", "ghcr.io", "local.example.com"] {
            assert!(!Base::parse(tls).unwrap().plain_http(), "{tls}");
        }
        assert!(Base::parse("https://ghcr.io").is_err());
        assert!(Base::parse("").is_err());
    }
}
