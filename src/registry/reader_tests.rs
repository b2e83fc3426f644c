//! The pull path against a stand-in registry: a good v1 artifact streams as cocoon's archive;
//! every contract violation is refused before a byte reaches the sink; a blob whose bytes do
//! not match its digest ends the pull with the entry still short and no end-of-archive. Also
//! the answers a tag delete accepts, and its fallback to a delete by digest.

use std::collections::BTreeMap;

use super::fake_registry::{digest_of, FakeRegistry};
use super::manifest::{ConfigBlob, Descriptor, FileMeta, Manifest};
use super::{media, ArtifactKind, Registry, RegistryError};

const REPO: &str = "snaps/vm-a";

struct Artifact {
    manifest: Manifest,
    config: ConfigBlob,
    blobs: Vec<(String, Vec<u8>)>,
}

fn layer(media_type: &str, title: &str, body: &[u8]) -> Descriptor {
    let mut annotations = BTreeMap::new();
    annotations.insert(media::ANN_TITLE.to_string(), title.to_string());
    Descriptor {
        media_type: media_type.into(),
        digest: digest_of(body),
        size: body.len() as i64,
        annotations,
        platform: None,
    }
}

fn artifact() -> Artifact {
    let files: [(&str, &[u8]); 2] = [
        ("config.json", b"{\"cpus\":2}"),
        ("memory-ranges", &[7u8; 3000]),
    ];
    let mut config = ConfigBlob {
        schema_version: "v1".into(),
        snapshot_id: "SNAPID".into(),
        hypervisor: "cloud-hypervisor".into(),
        ..Default::default()
    };
    config.files.insert(
        "memory-ranges".into(),
        FileMeta {
            mode: 0o600,
            sparse_map: r#"[{"o":0,"l":3000}]"#.into(),
            sparse_size: 1 << 20,
            ..Default::default()
        },
    );
    let mut blobs = Vec::new();
    let mut layers = Vec::new();
    for (name, body) in files {
        layers.push(layer(media::layer_type(name), name, body));
        blobs.push((digest_of(body), body.to_vec()));
    }
    let manifest = Manifest {
        schema_version: 2,
        media_type: media::OCI_MANIFEST.into(),
        artifact_type: media::SNAPSHOT_V1.into(),
        config: None,
        layers,
        manifests: Vec::new(),
        annotations: BTreeMap::new(),
    };
    Artifact {
        manifest,
        config,
        blobs,
    }
}

/// Publishes the artifact as `vm-a:<tag>`, config descriptor computed from the config.
fn publish(reg: &FakeRegistry, a: &Artifact, tag: &str) {
    let cfg = a.config.to_bytes();
    let mut m = a.manifest.clone();
    if m.config.is_none() {
        m.config = Some(Descriptor {
            media_type: media::SNAPSHOT_CONFIG.into(),
            digest: digest_of(&cfg),
            size: cfg.len() as i64,
            ..Default::default()
        });
    }
    reg.blob(REPO, &m.config.as_ref().unwrap().digest, cfg);
    for (d, b) in &a.blobs {
        reg.blob(REPO, d, b.clone());
    }
    reg.manifest(REPO, tag, m.to_bytes());
}

async fn client(reg: &FakeRegistry) -> Registry {
    Registry::from_config(&format!("{}/snaps", reg.addr)).unwrap()
}

#[tokio::test]
async fn a_v1_artifact_streams_as_cocoons_archive() {
    let reg = FakeRegistry::start().await;
    publish(&reg, &artifact(), "hibernate");
    let r = client(&reg).await;
    let mut sink = Vec::new();
    let out = r
        .pull_snapshot("vm-a", "hibernate", &mut sink, "vm-a-hibernate-import")
        .await
        .unwrap();
    assert_eq!(out.snapshot_id, "SNAPID");
    assert!(sink.ends_with(&[0u8; 1024]));
    let mut ar = tar::Archive::new(&sink[..]);
    let mut names = Vec::new();
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().display().to_string();
        let mut body = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut body).unwrap();
        match name.as_str() {
            "snapshot.json" => {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(v["config"]["name"], "vm-a-hibernate-import");
                assert_eq!(v["config"]["id"], "SNAPID");
                assert_eq!(e.header().mode().unwrap(), 0o644);
            }
            "config.json" => assert_eq!(e.header().mode().unwrap(), 0o640),
            "memory-ranges" => {
                assert_eq!(body, vec![7u8; 3000]);
                assert_eq!(e.header().mode().unwrap(), 0o600);
            }
            other => panic!("unexpected entry {other}"),
        }
        names.push(name);
    }
    assert_eq!(names, ["snapshot.json", "config.json", "memory-ranges"]);
    let seen = r.inspect("vm-a", "hibernate").await.unwrap().unwrap();
    assert_eq!(seen.kind, ArtifactKind::Snapshot);
    assert_eq!(seen.snapshot_id, "SNAPID");
}

async fn refused_with_empty_sink(a: &Artifact, want: &str) {
    let reg = FakeRegistry::start().await;
    publish(&reg, a, "bad");
    let r = client(&reg).await;
    let mut sink = Vec::new();
    match r.pull_snapshot("vm-a", "bad", &mut sink, "x").await {
        Err(RegistryError::Refused(m)) => assert!(m.contains(want), "{m} lacks {want:?}"),
        other => panic!("want Refused({want}), got {other:?}"),
    }
    assert!(sink.is_empty(), "bytes reached the sink before the refusal");
}

#[tokio::test]
async fn contract_violations_are_refused_before_any_byte() {
    let mut a = artifact();
    a.manifest.layers[1].media_type = "application/vnd.cocoonstack.disk.raw.part".into();
    refused_with_empty_sink(&a, "media type").await;

    let mut a = artifact();
    a.manifest.layers[0].annotations.clear();
    refused_with_empty_sink(&a, "title").await;

    let mut a = artifact();
    a.manifest.layers[1].media_type = format!("{}+zstd", media::VM_MEMORY);
    refused_with_empty_sink(&a, "zstd").await;

    let mut a = artifact();
    a.manifest.config = Some(Descriptor {
        media_type: media::SNAPSHOT_CONFIG.into(),
        digest: digest_of(b"huge"),
        size: (64 << 20) + 1,
        ..Default::default()
    });
    refused_with_empty_sink(&a, "64 MiB").await;

    let mut a = artifact();
    a.manifest.artifact_type = media::OS_IMAGE.into();
    refused_with_empty_sink(&a, "not a snapshot").await;

    // The config blob served does not hash to its descriptor.
    let a = artifact();
    let reg = FakeRegistry::start().await;
    publish(&reg, &a, "bad");
    let cfg = a.config.to_bytes();
    let mut wrong = cfg.clone();
    wrong[0] = b' ';
    reg.blob(REPO, &digest_of(&cfg), wrong);
    let mut sink = Vec::new();
    let e = client(&reg)
        .await
        .pull_snapshot("vm-a", "bad", &mut sink, "x")
        .await
        .unwrap_err();
    assert!(matches!(e, RegistryError::Refused(_)), "{e:?}");
    assert!(sink.is_empty());
}

#[tokio::test]
async fn a_blob_with_the_wrong_bytes_never_completes_its_entry() {
    let mut a = artifact();
    // Same length, one byte off: only the digest can tell.
    a.blobs[1].1[2999] = 8;
    let reg = FakeRegistry::start().await;
    publish(&reg, &a, "hibernate");
    let mut sink = Vec::new();
    let e = client(&reg)
        .await
        .pull_snapshot("vm-a", "hibernate", &mut sink, "x")
        .await
        .unwrap_err();
    match e {
        RegistryError::Refused(m) => assert!(m.contains(&a.blobs[1].0), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(!sink.ends_with(&[0u8; 1024]), "no end-of-archive");
    // The tampered entry is cut short: a tar reader cannot complete it.
    let mut ar = tar::Archive::new(&sink[..]);
    let complete = ar.entries().unwrap().all(|e| {
        e.and_then(|mut e| {
            let mut b = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut b)?;
            Ok(())
        })
        .is_ok()
    });
    assert!(!complete, "the archive reads complete");

    // A blob longer than its descriptor is refused too.
    let mut a = artifact();
    a.blobs[1].1.push(0);
    let reg = FakeRegistry::start().await;
    publish(&reg, &a, "hibernate");
    let mut sink = Vec::new();
    assert!(client(&reg)
        .await
        .pull_snapshot("vm-a", "hibernate", &mut sink, "x")
        .await
        .is_err());
    assert!(!sink.ends_with(&[0u8; 1024]));
}

#[tokio::test]
async fn absent_only_for_not_found() {
    let reg = FakeRegistry::start().await;
    let r = client(&reg).await;
    assert_eq!(r.inspect("vm-a", "hibernate").await.unwrap(), None);
    reg.set(
        &format!("/v2/{REPO}/manifests/hibernate"),
        500,
        "text/plain",
        b"boom".to_vec(),
    );
    match r.inspect("vm-a", "hibernate").await {
        Err(RegistryError::Transport(_)) => {}
        other => panic!("{other:?}"),
    }
    reg.set(
        &format!("/v2/{REPO}/manifests/hibernate"),
        403,
        "application/json",
        br#"{"errors":[{"code":"DENIED","message":"no"}]}"#.to_vec(),
    );
    assert!(matches!(
        r.inspect("vm-a", "hibernate").await,
        Err(RegistryError::Transport(_))
    ));
}

#[tokio::test]
async fn an_index_resolves_to_its_linux_amd64_child() {
    let reg = FakeRegistry::start().await;
    let a = artifact();
    publish(&reg, &a, "child");
    let cfg = a.config.to_bytes();
    let mut child = a.manifest.clone();
    child.config = Some(Descriptor {
        media_type: media::SNAPSHOT_CONFIG.into(),
        digest: digest_of(&cfg),
        size: cfg.len() as i64,
        ..Default::default()
    });
    let child_bytes = child.to_bytes();
    let child_digest = digest_of(&child_bytes);
    reg.manifest(REPO, &child_digest, child_bytes.clone());
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": media::OCI_INDEX,
        "manifests": [
            {"mediaType": media::OCI_MANIFEST, "digest": digest_of(b"other"), "size": 1,
             "platform": {"architecture": "arm64", "os": "linux"}},
            {"mediaType": media::OCI_MANIFEST, "digest": child_digest, "size": child_bytes.len(),
             "platform": {"architecture": "amd64", "os": "linux"}}
        ]
    });
    reg.manifest(REPO, "hibernate", serde_json::to_vec(&index).unwrap());
    let mut sink = Vec::new();
    let out = client(&reg)
        .await
        .pull_snapshot("vm-a", "hibernate", &mut sink, "x")
        .await
        .unwrap();
    assert_eq!(out.snapshot_id, "SNAPID");
    assert!(sink.ends_with(&[0u8; 1024]));
}

#[tokio::test]
async fn tag_delete_answers_and_the_digest_fallback() {
    let reg = FakeRegistry::start().await;
    let r = client(&reg).await;
    let tag = format!("/v2/{REPO}/manifests/hibernate");
    reg.set(&format!("DELETE {tag}"), 202, "text/plain", Vec::new());
    assert_eq!(
        r.delete_tag("vm-a", "hibernate").await.unwrap(),
        super::Deleted::Removed
    );
    reg.set(
        &format!("DELETE {tag}"),
        404,
        "application/json",
        br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"x"}]}"#.to_vec(),
    );
    assert_eq!(
        r.delete_tag("vm-a", "hibernate").await.unwrap(),
        super::Deleted::WasAbsent
    );
    reg.set(
        &format!("DELETE {tag}"),
        500,
        "text/plain",
        b"boom".to_vec(),
    );
    assert!(matches!(
        r.delete_tag("vm-a", "hibernate").await,
        Err(RegistryError::Transport(_))
    ));

    // A registry that deletes only by digest: HEAD the tag, delete what it points at.
    let digest = digest_of(b"the manifest");
    reg.set(
        &format!("DELETE {tag}"),
        400,
        "application/json",
        br#"{"errors":[{"code":"UNSUPPORTED","message":"tag deletes unsupported"}]}"#.to_vec(),
    );
    reg.set_with_headers(
        &format!("HEAD {tag}"),
        200,
        media::OCI_MANIFEST,
        b"the manifest".to_vec(),
        vec![("Docker-Content-Digest".into(), digest.clone())],
    );
    reg.set(
        &format!("DELETE /v2/{REPO}/manifests/{digest}"),
        202,
        "text/plain",
        Vec::new(),
    );
    assert_eq!(
        r.delete_tag("vm-a", "hibernate").await.unwrap(),
        super::Deleted::Removed
    );
    reg.set(&format!("DELETE {tag}"), 405, "text/plain", Vec::new());
    assert_eq!(
        r.delete_tag("vm-a", "hibernate").await.unwrap(),
        super::Deleted::Removed
    );
    // The digest delete refused too: an error, never a silent success.
    reg.set(
        &format!("DELETE /v2/{REPO}/manifests/{digest}"),
        405,
        "text/plain",
        Vec::new(),
    );
    assert!(r.delete_tag("vm-a", "hibernate").await.is_err());
}

#[tokio::test]
async fn cloud_image_disks_concatenate_in_title_order() {
    let reg = FakeRegistry::start().await;
    let parts: [(&str, &str, &[u8]); 3] = [
        (
            "application/vnd.cocoonstack.disk.raw.part",
            "disk.raw.part.1",
            b"BBBB",
        ),
        ("text/plain", "SHA256SUMS", b"sums"),
        (
            "application/vnd.cocoonstack.disk.raw.part",
            "disk.raw.part.0",
            b"AAAA",
        ),
    ];
    let mut layers = Vec::new();
    for (mt, title, body) in parts {
        layers.push(layer(mt, title, body));
        reg.blob(REPO, &digest_of(body), body.to_vec());
    }
    let m = Manifest {
        schema_version: 2,
        media_type: media::OCI_MANIFEST.into(),
        artifact_type: media::OS_IMAGE.into(),
        layers,
        ..Default::default()
    };
    reg.manifest(REPO, "24.04", m.to_bytes());
    let r = client(&reg).await;
    let mut sink = Vec::new();
    assert_eq!(
        r.pull_cloud_image("vm-a", "24.04", &mut sink)
            .await
            .unwrap(),
        8
    );
    assert_eq!(sink, b"AAAABBBB");
    // A snapshot is not a cloud image.
    publish(&reg, &artifact(), "snap");
    let mut sink = Vec::new();
    assert!(matches!(
        r.pull_cloud_image("vm-a", "snap", &mut sink).await,
        Err(RegistryError::Refused(_))
    ));
    assert!(sink.is_empty());
}

/// A v2 chunk of a few KiB that inflates to 64 MiB where its file is 1 MiB is refused once
/// its output passes 1 MiB, before the rest is decoded or held, and counted against the
/// `registry_chunk` cap.
#[tokio::test]
async fn a_zstd_bomb_is_refused_at_its_files_size() {
    let bomb = zstd::bulk::compress(&vec![0u8; 64 << 20], 19).unwrap();
    let zmem = "application/vnd.cocoonstack.vm.memory+zstd";
    let cfg_body: &[u8] = b"{\"cpus\":2}";
    let mut config = ConfigBlob {
        schema_version: "v2".into(),
        snapshot_id: "SNAPID".into(),
        hypervisor: "cloud-hypervisor".into(),
        ..Default::default()
    };
    config.files.insert(
        "config.json".into(),
        FileMeta {
            mode: 0o640,
            size: cfg_body.len() as i64,
            ..Default::default()
        },
    );
    config.files.insert(
        "memory-ranges".into(),
        FileMeta {
            mode: 0o600,
            size: 1 << 20,
            chunks: vec![digest_of(&bomb)],
            ..Default::default()
        },
    );
    let a = Artifact {
        manifest: Manifest {
            schema_version: 2,
            media_type: media::OCI_MANIFEST.into(),
            artifact_type: media::SNAPSHOT_V2.into(),
            config: None,
            layers: vec![
                layer(media::VM_CONFIG, "config.json", cfg_body),
                layer(zmem, "memory-ranges", &bomb),
            ],
            manifests: Vec::new(),
            annotations: BTreeMap::new(),
        },
        config,
        blobs: vec![
            (digest_of(cfg_body), cfg_body.to_vec()),
            (digest_of(&bomb), bomb.clone()),
        ],
    };
    let reg = FakeRegistry::start().await;
    publish(&reg, &a, "bomb");
    let metrics = crate::metrics::Metrics::new();
    let r = client(&reg).await.with_caps(metrics.cap_count());
    let mut sink = Vec::new();
    match r.pull_snapshot("vm-a", "bomb", &mut sink, "x").await {
        Err(RegistryError::Refused(m)) => {
            assert!(m.contains("decodes past its files[].size"), "{m}")
        }
        other => panic!("want the bomb refused, got {other:?}"),
    }
    assert!(
        sink.len() < 2 << 20,
        "{} bytes reached the sink",
        sink.len()
    );
    let refused = metrics
        .cap_refusals
        .with_label_values(&[crate::caps::Cap::RegistryChunk.as_str()])
        .get();
    assert_eq!(refused, 1);
}
