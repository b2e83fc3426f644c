//! Names that reach cocoon's argv. Every one is validated here, so a crafted annotation can
//! never become a flag (`--force`) or smuggle a separator.

use sha2::{Digest, Sha256};

/// cocoon's VM-name rule: `^[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}$`.
pub fn valid_vm_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// A VM id as cocoon prints it, or as an unmanaged pod names one: the VM-name alphabet,
/// so an annotation can never reach argv as a flag or a path.
pub fn valid_vm_id(s: &str) -> bool {
    valid_vm_name(s)
}

/// An image or registry reference: printable, no blanks, and not a flag.
pub fn valid_image_ref(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('-')
        && s.len() <= 1024
        && s.bytes().all(|c| c.is_ascii_graphic())
}

/// A CNI network name: same alphabet as a VM name, up to 253 bytes.
pub fn valid_network(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 253
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// Local snapshot name of a clone image (ANN-2.3): `repo` for `latest`, else
/// `repo:tag`; over 63 chars, the first 50 + `-` + 12 hex chars of sha256(full name).
pub fn image_snapshot_name(image: &str) -> (String, String, String) {
    let (repo, tag) = match image.split_once(':') {
        Some((r, t)) if !t.is_empty() => (r.to_string(), t.to_string()),
        Some((r, _)) => (r.to_string(), "latest".to_string()),
        None => (image.to_string(), "latest".to_string()),
    };
    let full = if tag == "latest" {
        repo.clone()
    } else {
        format!("{repo}:{tag}")
    };
    (shorten(&full), repo, tag)
}

fn shorten(full: &str) -> String {
    if full.len() <= 63 {
        return full.to_string();
    }
    let digest = Sha256::digest(full.as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    let mut cut = 50;
    while !full.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}-{hex}", &full[..cut])
}

/// What every fork snapshot's name starts with (T5: no managed VM takes it).
pub const FORK_PREFIX: &str = "fork-";

/// `fork-<vm>`, the shared fork snapshot of a source VM.
pub fn fork_snapshot(vm: &str) -> String {
    format!("{FORK_PREFIX}{vm}")
}

/// What the name of every snapshot the daemon keeps for a deleted VM starts with (D9: no
/// managed VM takes it).
pub const KEPT_PREFIX: &str = "kept-";

/// D9: `kept-<vm>-<first 8 of the pod UID>`, shortened as image snapshot names are: the local
/// copy of a deleted VM whose delete-time push was refused. The UID keeps one incarnation's
/// copy from replacing another's.
pub fn kept_snapshot(vm: &str, uid: &str) -> String {
    let tag: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(8)
        .collect();
    shorten(&format!("{KEPT_PREFIX}{vm}-{tag}"))
}

/// The staging directory (a plain name under `VK_STAGING_DIR`) a peer's copy of `vm`'s
/// snapshot is fetched into. One per VM name: a retry replaces the previous attempt's.
pub fn peer_staging(vm: &str) -> String {
    format!("peer-{vm}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_names() {
        assert!(valid_vm_name("vk-default-demo-0"));
        assert!(!valid_vm_name("-rf"));
        assert!(!valid_vm_name("a b"));
        assert!(!valid_vm_name(&"a".repeat(64)));
    }

    #[test]
    fn snapshot_names() {
        assert_eq!(image_snapshot_name("acme/agent").0, "acme/agent");
        assert_eq!(image_snapshot_name("acme/agent:latest").0, "acme/agent");
        assert_eq!(image_snapshot_name("acme/agent:v2").0, "acme/agent:v2");
        let long = format!("{}:v1", "r".repeat(70));
        let n = image_snapshot_name(&long).0;
        assert_eq!(n.len(), 63);
        assert!(n.starts_with(&"r".repeat(50)));
    }
}
