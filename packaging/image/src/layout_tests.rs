use super::*;
use std::collections::BTreeMap;
use std::io::Read;

const BINARY: &[u8] = b"\x7fELF a static binary";
const BUNDLE: &[u8] = b"-----BEGIN CERTIFICATE-----\n";

fn inputs() -> Inputs<'static> {
    Inputs {
        binary: BINARY,
        ca_bundle: Some(BUNDLE),
        version: "0.1.0",
        reference: "localhost/vk-cocoon:0.1.0",
    }
}

/// Path → (mode, bytes) of every entry of a tar archive, in archive order.
fn entries(tar_bytes: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
    let mut archive = tar::Archive::new(tar_bytes);
    archive
        .entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().into_owned();
            let mode = e.header().mode().unwrap();
            let mut bytes = Vec::new();
            e.read_to_end(&mut bytes).unwrap();
            (path, mode, bytes)
        })
        .collect()
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .unwrap();
    out
}

#[test]
fn the_layer_holds_the_binary_executable_and_the_ca_bundle() {
    let image = Image::build(&inputs()).unwrap();
    let tar = gunzip(&image.layer.bytes);
    let config: Value = serde_json::from_slice(&image.config.bytes).unwrap();
    assert_eq!(config["rootfs"]["diff_ids"], json!([sha256(&tar)]));
    let files: BTreeMap<_, _> = entries(&tar)
        .into_iter()
        .map(|(p, m, b)| (p, (m, b)))
        .collect();
    assert_eq!(files["usr/bin/vk-cocoon"], (0o755, BINARY.to_vec()));
    assert_eq!(
        files["etc/ssl/certs/ca-certificates.crt"],
        (0o644, BUNDLE.to_vec())
    );
    assert_eq!(files["tmp/"].0, 0o1777);
}

#[test]
fn the_config_runs_the_daemon_and_names_the_layer() {
    let image = Image::build(&inputs()).unwrap();
    let config: Value = serde_json::from_slice(&image.config.bytes).unwrap();
    assert_eq!(
        config["config"]["Entrypoint"],
        json!(["/usr/bin/vk-cocoon"])
    );
    assert_eq!(config["config"]["Cmd"], json!(["run"]));
    assert_eq!(
        config["config"]["Labels"]["org.opencontainers.image.version"],
        "0.1.0"
    );
    let manifest: Value = serde_json::from_slice(&image.manifest.bytes).unwrap();
    assert_eq!(manifest["config"]["digest"], json!(image.config.digest));
    assert_eq!(manifest["config"]["size"], json!(image.config.bytes.len()));
    assert_eq!(manifest["layers"][0]["digest"], json!(image.layer.digest));
    assert_eq!(manifest["layers"][0]["mediaType"], LAYER_TYPE);
}

#[test]
fn the_layout_archive_indexes_the_manifest_under_its_reference() {
    let image = Image::build(&inputs()).unwrap();
    let archive = entries(&image.layout_archive().unwrap());
    let files: BTreeMap<_, _> = archive.into_iter().map(|(p, _, b)| (p, b)).collect();
    let index: Value = serde_json::from_slice(&files["index.json"]).unwrap();
    let m = &index["manifests"][0];
    assert_eq!(m["digest"], json!(image.manifest.digest));
    assert_eq!(
        m["annotations"]["org.opencontainers.image.ref.name"],
        "0.1.0"
    );
    assert_eq!(
        m["annotations"]["io.containerd.image.name"],
        "localhost/vk-cocoon:0.1.0"
    );
    // Every blob is stored under its own digest.
    for (path, bytes) in &files {
        if let Some(hex) = path.strip_prefix("blobs/sha256/").filter(|h| !h.is_empty()) {
            assert_eq!(sha256(bytes), format!("sha256:{hex}"), "{path}");
        }
    }
    assert_eq!(
        files
            .keys()
            .filter(|p| p.starts_with("blobs/sha256/"))
            .count(),
        4
    );
}

#[test]
fn the_same_inputs_give_the_same_bytes() {
    let a = Image::build(&inputs()).unwrap();
    let b = Image::build(&inputs()).unwrap();
    assert_eq!(a.manifest.digest, b.manifest.digest);
    assert_eq!(a.layout_archive().unwrap(), b.layout_archive().unwrap());
    let other = Image::build(&Inputs {
        binary: b"another binary",
        ..inputs()
    })
    .unwrap();
    assert_ne!(a.manifest.digest, other.manifest.digest);
}

#[test]
fn a_reference_without_a_tag_is_refused() {
    let image = Image::build(&Inputs {
        reference: "localhost:5000/vk-cocoon",
        ..inputs()
    })
    .unwrap();
    let err = image.layout_archive().unwrap_err().to_string();
    assert!(err.contains("no tag"), "{err}");
}

/// The DaemonSet runs the image `make image` builds, at this version.
#[test]
fn the_daemonset_names_the_image_make_image_builds() {
    let manifest = include_str!("../../daemonset.yaml");
    let images: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image: "))
        .collect();
    assert_eq!(images, [crate::default_reference()]);
}
