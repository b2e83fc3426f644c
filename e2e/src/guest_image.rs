//! The guest OCI image of the real-cocoon lane: what `cocoon image pull` accepts and `vm run`
//! boots under the cloud-hypervisor stand-in.
//!
//! cocoon's OCI pull scans every layer for `vmlinuz*` and `initrd.img*` at the top or in
//! `boot/` and refuses an image without both; `vm run` boots the kernel with the initrd and the
//! layers (as EROFS disks) directly. The stand-in loads no kernel (the file only has to be
//! non-empty) and reads its guest program from the initrd, so the image is one uncompressed
//! layer with `boot/vmlinuz-standin` and `boot/initrd.img-standin`.

use anyhow::{Context, Result};
use oci_client::client::{Config, ImageLayer};
use oci_client::secrets::RegistryAuth;
use oci_client::Reference;

use crate::registry::Registry;
use crate::step;

/// What the stand-in's guest serves (its README, "The guest program").
#[derive(Clone, Debug)]
pub struct GuestProgram {
    pub tcp_ports: Vec<u16>,
    pub value_port: u16,
    pub banner: String,
}

impl Default for GuestProgram {
    fn default() -> Self {
        GuestProgram {
            tcp_ports: vec![22, 8080],
            value_port: 7777,
            banner: "SSH-2.0-cocoon-standin".into(),
        }
    }
}

impl GuestProgram {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "tcp_ports": self.tcp_ports,
            "value_port": self.value_port,
            "banner": self.banner,
        }))
        .expect("a JSON object serializes")
    }
}

/// The image's single layer: a tar with the placeholder kernel and the program as initrd.
pub fn layer(program: &GuestProgram) -> Vec<u8> {
    let mut tar = Vec::new();
    append_dir(&mut tar, "boot/");
    append_file(
        &mut tar,
        "boot/vmlinuz-standin",
        b"ch-standin placeholder kernel: the stand-in loads no kernel\n",
    );
    append_file(&mut tar, "boot/initrd.img-standin", &program.to_json());
    // Two zero blocks end a tar archive.
    tar.extend_from_slice(&[0u8; 1024]);
    tar
}

/// Pushes the guest image as `<registry>/<repo>:<tag>` and returns that reference.
pub async fn push(
    registry: &Registry,
    repo: &str,
    tag: &str,
    program: &GuestProgram,
) -> Result<String> {
    let reference = registry.reference(repo, tag);
    let image: Reference = reference.parse().context("parsing the image reference")?;
    let layer = ImageLayer::oci_v1(layer(program), None);
    // The rootfs diff_ids are the uncompressed layers' digests, which this layer already is.
    let config = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {},
        "rootfs": { "type": "layers", "diff_ids": [layer.sha256_digest()] },
    });
    let config = Config::oci_v1(serde_json::to_vec(&config)?, None);
    step!("pushing the guest image {reference}");
    registry
        .oci_client()
        .push(&image, &[layer], config, &RegistryAuth::Anonymous, None)
        .await
        .with_context(|| format!("pushing {reference}"))?;
    Ok(reference)
}

fn append_dir(tar: &mut Vec<u8>, name: &str) {
    tar.extend_from_slice(&header(name, 0, 0o755, b'5'));
}

fn append_file(tar: &mut Vec<u8>, name: &str, data: &[u8]) {
    tar.extend_from_slice(&header(name, data.len(), 0o644, b'0'));
    tar.extend_from_slice(data);
    let pad = (512 - data.len() % 512) % 512;
    tar.extend(std::iter::repeat_n(0u8, pad));
}

/// A POSIX ustar header (names here are short, so no prefix or extensions are needed).
fn header(name: &str, size: usize, mode: u32, kind: u8) -> [u8; 512] {
    let mut h = [0u8; 512];
    let put = |h: &mut [u8; 512], at: usize, bytes: &[u8]| {
        h[at..at + bytes.len()].copy_from_slice(bytes);
    };
    assert!(name.len() < 100, "tar name too long for a plain header");
    put(&mut h, 0, name.as_bytes());
    put(&mut h, 100, format!("{mode:07o}\0").as_bytes());
    put(&mut h, 108, b"0000000\0");
    put(&mut h, 116, b"0000000\0");
    put(&mut h, 124, format!("{size:011o}\0").as_bytes());
    put(&mut h, 136, b"00000000000\0");
    h[156] = kind;
    put(&mut h, 257, b"ustar\0");
    put(&mut h, 263, b"00");
    // The checksum is computed with its own field as spaces.
    put(&mut h, 148, b"        ");
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    put(&mut h, 148, format!("{sum:06o}\0 ").as_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layer_is_a_tar_with_the_boot_files() {
        let tar = layer(&GuestProgram::default());
        assert_eq!(tar.len() % 512, 0);
        let out = std::process::Command::new("tar")
            .arg("-tvf")
            .arg("-")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().unwrap().write_all(&tar)?;
                c.wait_with_output()
            })
            .unwrap();
        assert!(out.status.success());
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(listing.contains("boot/vmlinuz-standin"), "{listing}");
        assert!(listing.contains("boot/initrd.img-standin"), "{listing}");
    }
}
