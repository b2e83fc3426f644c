//! The image itself: one layer holding the static binary (and the CA bundle its registry
//! client trusts), its config and manifest, as an OCI image layout.
//!
//! Everything is reproducible: fixed timestamps, owners and modes, entries in a fixed order,
//! a gzip header without a time. The same binary always gives the same manifest digest, so a
//! rebuild that changed nothing pushes nothing new.

use anyhow::{Context, Result};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::io::Write;

pub const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const CONFIG_TYPE: &str = "application/vnd.oci.image.config.v1+json";
pub const LAYER_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
const INDEX_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// Where the binary lands in the image, and so the entrypoint.
pub const BINARY_PATH: &str = "usr/bin/vk-cocoon";
/// Where Debian and most distributions keep the bundle; rustls-platform-verifier reads it.
pub const CA_BUNDLE_PATH: &str = "etc/ssl/certs/ca-certificates.crt";
/// The image's own time: the epoch, so the bytes depend on the inputs only.
const CREATED: &str = "1970-01-01T00:00:00Z";

/// What goes into the image.
pub struct Inputs<'a> {
    /// The daemon, statically linked: the image has no libc.
    pub binary: &'a [u8],
    /// PEM bundle of the CAs a registry over HTTPS is checked against.
    pub ca_bundle: Option<&'a [u8]>,
    pub version: &'a str,
    /// The full reference a runtime files the image under on import (`localhost/vk-cocoon:0.1.0`).
    pub reference: &'a str,
}

/// A built image: its blobs by digest, and the manifest that ties them.
pub struct Image {
    pub config: Blob,
    pub layer: Blob,
    pub manifest: Blob,
    reference: String,
}

pub struct Blob {
    pub digest: String,
    pub bytes: Vec<u8>,
}

impl Blob {
    fn new(bytes: Vec<u8>) -> Self {
        Blob {
            digest: sha256(&bytes),
            bytes,
        }
    }

    fn descriptor(&self, media_type: &str) -> Value {
        json!({"mediaType": media_type, "digest": self.digest, "size": self.bytes.len()})
    }

    fn hex(&self) -> &str {
        self.digest.trim_start_matches("sha256:")
    }
}

pub fn sha256(bytes: &[u8]) -> String {
    let hex: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

impl Image {
    pub fn build(inputs: &Inputs<'_>) -> Result<Self> {
        let tar = layer_tar(inputs)?;
        let diff_id = sha256(&tar);
        let layer = Blob::new(gzip(&tar)?);
        let config = Blob::new(serde_json::to_vec(&json!({
            "created": CREATED,
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Entrypoint": [format!("/{BINARY_PATH}")],
                "Cmd": ["run"],
                // The DaemonSet mounts the host's cocoon CLI into /usr/local/bin.
                "Env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
                "Labels": labels(inputs.version),
            },
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": CREATED, "created_by": "make image (packaging/image)"}],
        }))?);
        let manifest = Blob::new(serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": config.descriptor(CONFIG_TYPE),
            "layers": [layer.descriptor(LAYER_TYPE)],
            "annotations": labels(inputs.version),
        }))?);
        Ok(Image {
            config,
            layer,
            manifest,
            reference: inputs.reference.to_string(),
        })
    }

    /// The image as an OCI image layout in one tar archive: what `ctr images import`,
    /// `skopeo copy oci-archive:` and `podman load` read.
    pub fn layout_archive(&self) -> Result<Vec<u8>> {
        let tag = self
            .reference
            .rsplit_once(':')
            .filter(|(_, t)| !t.contains('/'))
            .map(|(_, t)| t)
            .context("the image reference has no tag")?;
        let mut descriptor = self.manifest.descriptor(MANIFEST_TYPE);
        descriptor["annotations"] = json!({
            "org.opencontainers.image.ref.name": tag,
            "io.containerd.image.name": self.reference,
        });
        descriptor["platform"] = json!({"architecture": "amd64", "os": "linux"});
        let index = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": INDEX_TYPE,
            "manifests": [descriptor],
        }))?;
        let mut out = tar::Builder::new(Vec::new());
        file(
            &mut out,
            "oci-layout",
            br#"{"imageLayoutVersion":"1.0.0"}"#,
            0o644,
        )?;
        file(&mut out, "index.json", &index, 0o644)?;
        dir(&mut out, "blobs/")?;
        dir(&mut out, "blobs/sha256/")?;
        for blob in [&self.config, &self.layer, &self.manifest] {
            file(
                &mut out,
                &format!("blobs/sha256/{}", blob.hex()),
                &blob.bytes,
                0o644,
            )?;
        }
        Ok(out.into_inner()?)
    }
}

fn labels(version: &str) -> Value {
    json!({
        "org.opencontainers.image.title": "vk-cocoon",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.licenses": "Apache-2.0",
    })
}

fn layer_tar(inputs: &Inputs<'_>) -> Result<Vec<u8>> {
    let mut out = tar::Builder::new(Vec::new());
    if let Some(bundle) = inputs.ca_bundle {
        for d in ["etc/", "etc/ssl/", "etc/ssl/certs/"] {
            dir(&mut out, d)?;
        }
        file(&mut out, CA_BUNDLE_PATH, bundle, 0o644)?;
    }
    // Scratch space for tempfile (snapshot transfers stage through it when no volume is given).
    let mut tmp = header(tar::EntryType::Directory, 0o1777, 0);
    out.append_data(&mut tmp, "tmp/", std::io::empty())?;
    dir(&mut out, "usr/")?;
    dir(&mut out, "usr/bin/")?;
    file(&mut out, BINARY_PATH, inputs.binary, 0o755)?;
    Ok(out.into_inner()?)
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h
}

fn dir(out: &mut tar::Builder<Vec<u8>>, path: &str) -> Result<()> {
    let mut h = header(tar::EntryType::Directory, 0o755, 0);
    out.append_data(&mut h, path, std::io::empty())?;
    Ok(())
}

fn file(out: &mut tar::Builder<Vec<u8>>, path: &str, bytes: &[u8], mode: u32) -> Result<()> {
    let mut h = header(tar::EntryType::Regular, mode, bytes.len() as u64);
    out.append_data(&mut h, path, bytes)?;
    Ok(())
}

fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::best());
    gz.write_all(bytes)?;
    Ok(gz.finish()?)
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
