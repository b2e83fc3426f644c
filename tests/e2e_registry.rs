//! Snapshot transfer through a real registry (distribution v3 on loopback) and the cocoon
//! simulator: push of a saved VM's snapshot, the tag's manifest, annotations and config as
//! the registry serves them, pull into a new local name, clone, tag delete; a tampered blob
//! refused without a completed import; v1 and v2 pushes of one export pulling identically; a
//! cloud image's disk parts streamed into `image import` in title order.

use anyhow::{ensure, Context, Result};
use e2e::testbed::{Testbed, TestbedOptions};
use serde_json::Value;
use vk_cocoon::cocoon::CocoonCli;
use vk_cocoon::registry::cocoon_pipe::{pull_into_cocoon, push_from_cocoon};
use vk_cocoon::registry::{ArtifactKind, Deleted, Format, PushKnobs, Registry, RegistryError};

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";

fn cli(tb: &Testbed) -> CocoonCli {
    let sim = tb.sim.as_ref().expect("simulator");
    let mut env = sim.env();
    env.push((
        e2e::procs::MARKER.to_string(),
        tb.run_dir().display().to_string(),
    ));
    CocoonCli {
        env,
        ..CocoonCli::new(sim.bin.display().to_string())
    }
}

fn registry(tb: &Testbed) -> Result<Registry> {
    let addr = &tb.registry.as_ref().expect("registry").addr;
    let spool = tb.run_dir().join("spool");
    std::fs::create_dir_all(&spool)?;
    Ok(Registry::from_config(&format!("{addr}/snaps"))
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .with_spool_dir(spool))
}

async fn get_json(url: &str, accept: &str) -> Result<(Value, Vec<u8>)> {
    let r = reqwest::Client::new()
        .get(url)
        .header("Accept", accept)
        .send()
        .await?;
    ensure!(r.status().is_success(), "GET {url}: {}", r.status());
    let bytes = r.bytes().await?.to_vec();
    Ok((serde_json::from_slice(&bytes)?, bytes))
}

/// The data files of a local snapshot, as `snapshot export` streams them.
fn export_files(tb: &Testbed, name: &str) -> Result<Vec<(String, Vec<u8>)>> {
    let sim = tb.sim.as_ref().unwrap();
    let out = sim
        .command()
        .args(["snapshot", "export", "-o", "-", name])
        .output()?;
    ensure!(out.status.success(), "export {name} failed");
    let mut ar = tar::Archive::new(&out.stdout[..]);
    let mut files = Vec::new();
    for e in ar.entries()? {
        let mut e = e?;
        let n = e.path()?.display().to_string();
        if n == "snapshot.json" {
            continue;
        }
        let mut body = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut body)?;
        files.push((n, body));
    }
    files.sort();
    Ok(files)
}

fn saved_vm(tb: &Testbed, vm: &str) -> Result<Value> {
    let sim = tb.sim.as_ref().unwrap();
    sim.run(&["image", "pull", "localhost/reg/base:1"])?;
    sim.run(&["vm", "run", "--name", vm, "localhost/reg/base:1"])?;
    sim.run(&["snapshot", "save", "--name", vm, vm])?;
    Ok(serde_json::from_str(
        &sim.run(&["snapshot", "inspect", vm])?,
    )?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hibernate_snapshot_push_inspect_pull_clone_delete() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::default().with_registry().with_sim()).await?;
    let addr = tb.registry.as_ref().unwrap().addr.clone();
    let reg = registry(&tb)?;
    let cli = cli(&tb);
    let local = saved_vm(&tb, "vm-a")?;

    let pushed = push_from_cocoon(
        &reg,
        &cli,
        "vm-a",
        "vm-a",
        "hibernate",
        Some("localhost/reg/base:1"),
        Some("node-a"),
        &PushKnobs::default(),
    )
    .await
    .map_err(|e| anyhow::anyhow!("push: {e}"))?;
    ensure!(pushed.format == Format::V1);
    ensure!(pushed.from_node_added, "from-node re-PUT happened");
    ensure!(
        pushed.digest != pushed.pushed_digest,
        "the re-PUT changes the digest"
    );

    // What the registry serves, read without the client under test.
    let url = format!("http://{addr}/v2/snaps/vm-a/manifests/hibernate");
    let (m, raw) = get_json(&url, OCI_MANIFEST).await?;
    ensure!(
        m["schemaVersion"] == 2 && m["mediaType"] == OCI_MANIFEST,
        "{m}"
    );
    ensure!(
        m["artifactType"] == "application/vnd.cocoonstack.snapshot.v1+json",
        "{m}"
    );
    let ann = &m["annotations"];
    ensure!(
        ann["cocoonstack.snapshot.baseimage"] == "localhost/reg/base:1",
        "{m}"
    );
    ensure!(ann["cocoonstack.snapshot.from-node"] == "node-a", "{m}");
    let created = ann["org.opencontainers.image.created"]
        .as_str()
        .unwrap_or("");
    ensure!(
        created.len() == 20 && created.ends_with('Z'),
        "created is RFC 3339 seconds UTC: {created:?}"
    );
    {
        use sha2::Digest;
        let d = format!("sha256:{:x}", sha2::Sha256::digest(&raw));
        ensure!(
            d == pushed.digest,
            "tag digest {d} vs reported {}",
            pushed.digest
        );
    }
    let cfg_desc = &m["config"];
    ensure!(cfg_desc["mediaType"] == "application/vnd.cocoonstack.snapshot.config.v1+json");
    ensure!(
        cfg_desc.get("annotations").is_none(),
        "config has no annotations"
    );
    let files = export_files(&tb, "vm-a")?;
    let titles: Vec<String> = m["layers"]
        .as_array()
        .context("layers")?
        .iter()
        .map(|l| {
            l["annotations"]["org.opencontainers.image.title"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let mut sorted = titles.clone();
    sorted.sort();
    let names: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
    ensure!(sorted == names, "layers {titles:?} vs files {names:?}");
    for l in m["layers"].as_array().unwrap() {
        let t = l["annotations"]["org.opencontainers.image.title"]
            .as_str()
            .unwrap();
        let want = match t {
            "config.json" => "application/vnd.cocoonstack.vm.config+json",
            "state.json" => "application/vnd.cocoonstack.vm.state+json",
            "memory-ranges" => "application/vnd.cocoonstack.vm.memory",
            "cow.raw" => "application/vnd.cocoonstack.disk.raw",
            _ => "application/octet-stream",
        };
        ensure!(l["mediaType"] == want, "{t}: {}", l["mediaType"]);
    }
    let cfg_url = format!(
        "http://{addr}/v2/snaps/vm-a/blobs/{}",
        cfg_desc["digest"].as_str().unwrap()
    );
    let (cfg, _) = get_json(&cfg_url, "*/*").await?;
    ensure!(cfg["schemaVersion"] == "v1", "{cfg}");
    ensure!(cfg["snapshotId"] == local["id"], "{cfg} vs {local}");
    ensure!(cfg["hypervisor"] == local["hypervisor"], "{cfg}");
    ensure!(cfg["image"] == local["image"], "{cfg}");
    ensure!(cfg["files"]["cow.raw"]["mode"].as_i64().is_some(), "{cfg}");

    let seen = reg
        .inspect("vm-a", "hibernate")
        .await
        .map_err(|e| anyhow::anyhow!("inspect: {e}"))?
        .context("the tag exists")?;
    ensure!(seen.kind == ArtifactKind::Snapshot && seen.format == Some(Format::V1));
    ensure!(seen.snapshot_id == local["id"].as_str().unwrap());
    ensure!(seen.from_node.as_deref() == Some("node-a"));
    ensure!(seen.base_image.as_deref() == Some("localhost/reg/base:1"));
    ensure!(seen.digest == pushed.digest);

    let pulled = pull_into_cocoon(&reg, &cli, "vm-a", "hibernate", "vm-a-hibernate-import")
        .await
        .map_err(|e| anyhow::anyhow!("pull: {e}"))?;
    ensure!(pulled.snapshot_id == seen.snapshot_id);
    let sim = tb.sim.as_ref().unwrap();
    let imported: Value =
        serde_json::from_str(&sim.run(&["snapshot", "inspect", "vm-a-hibernate-import"])?)?;
    for k in [
        "image",
        "hypervisor",
        "cpu",
        "memory",
        "nics",
        "image_digest",
    ] {
        ensure!(
            imported[k] == local[k],
            "{k}: {} vs {}",
            imported[k],
            local[k]
        );
    }
    ensure!(
        export_files(&tb, "vm-a-hibernate-import")? == files,
        "the imported snapshot holds the same bytes"
    );
    // Pulling again replaces the local copy (remove first, then import).
    pull_into_cocoon(&reg, &cli, "vm-a", "hibernate", "vm-a-hibernate-import")
        .await
        .map_err(|e| anyhow::anyhow!("second pull: {e}"))?;

    let clone: Value = serde_json::from_str(&sim.run(&[
        "vm",
        "clone",
        "--output",
        "json",
        "--name",
        "vm-a-woken",
        "vm-a-hibernate-import",
    ])?)?;
    ensure!(
        clone["id"].as_str().is_some_and(|s| !s.is_empty()),
        "{clone}"
    );

    ensure!(reg.delete_tag("vm-a", "hibernate").await.unwrap() == Deleted::Removed);
    ensure!(reg.delete_tag("vm-a", "hibernate").await.unwrap() == Deleted::WasAbsent);
    ensure!(reg.inspect("vm-a", "hibernate").await.unwrap().is_none());
    match pull_into_cocoon(&reg, &cli, "vm-a", "hibernate", "vm-a-again").await {
        Err(RegistryError::Absent(_)) => {}
        other => anyhow::bail!("pull of a deleted tag: {other:?}"),
    }
    // A push whose export fails leaves the tag alone.
    match push_from_cocoon(
        &reg,
        &cli,
        "no-such-snapshot",
        "vm-a",
        "hibernate",
        None,
        None,
        &PushKnobs::default(),
    )
    .await
    {
        Err(RegistryError::Cocoon(e)) => {
            ensure!(e.message.contains("snapshot not found"), "{e:?}")
        }
        other => anyhow::bail!("push of a missing snapshot: {other:?}"),
    }
    ensure!(reg.inspect("vm-a", "hibernate").await.unwrap().is_none());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_blob_is_refused_and_nothing_is_imported() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::default().with_registry().with_sim()).await?;
    let reg = registry(&tb)?;
    let cli = cli(&tb);
    saved_vm(&tb, "vm-t")?;
    push_from_cocoon(
        &reg,
        &cli,
        "vm-t",
        "vm-t",
        "hibernate",
        None,
        None,
        &PushKnobs::default(),
    )
    .await
    .map_err(|e| anyhow::anyhow!("push: {e}"))?;
    let seen = reg.inspect("vm-t", "hibernate").await.unwrap().unwrap();
    let victim = seen
        .manifest
        .layers
        .iter()
        .max_by_key(|l| l.size)
        .context("a layer")?;
    let hex = victim.digest.trim_start_matches("sha256:");
    let data = tb
        .run_dir()
        .join("registry-storage/docker/registry/v2/blobs/sha256")
        .join(&hex[..2])
        .join(hex)
        .join("data");
    let mut bytes = std::fs::read(&data).with_context(|| format!("{}", data.display()))?;
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    std::fs::write(&data, &bytes)?;

    match pull_into_cocoon(&reg, &cli, "vm-t", "hibernate", "vm-t-import").await {
        Err(RegistryError::Refused(m)) => ensure!(m.contains(&victim.digest), "{m}"),
        other => anyhow::bail!("pull of a tampered blob: {other:?}"),
    }
    let sim = tb.sim.as_ref().unwrap();
    let out = sim
        .command()
        .args(["snapshot", "inspect", "vm-t-import"])
        .output()?;
    ensure!(
        !out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("snapshot not found"),
        "nothing was imported"
    );
    Ok(())
}

/// A synthetic export: snapshot.json, a small file, a sparse 3 MiB file, a 5 MiB disk.
fn synthetic_export() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8], pax: &[(&str, &str)]| {
        if !pax.is_empty() {
            b.append_pax_extensions(pax.iter().map(|(k, v)| (*k, v.as_bytes())))
                .unwrap();
        }
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o600);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, name, data).unwrap();
    };
    add(
        "snapshot.json",
        br#"{"version":1,"config":{"id":"SYNTHETIC","name":"s","hypervisor":"cloud-hypervisor","cpu":1}}"#,
        &[],
    );
    add("config.json", b"{\"cpus\":1}", &[]);
    let mem = mem_body();
    add(
        "memory-ranges",
        &mem,
        &[
            ("COCOON.sparse.map", r#"[{"o":0,"l":3145728}]"#),
            ("COCOON.sparse.size", "8589934592"),
        ],
    );
    add("cow.raw", &disk_body(), &[]);
    b.into_inner().unwrap()
}

fn mem_body() -> Vec<u8> {
    (0..3u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect()
}

fn disk_body() -> Vec<u8> {
    (0..5u32 << 20).map(|i| (i % 7) as u8).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_and_v2_pushes_of_one_export_pull_identically() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::default().with_registry()).await?;
    let reg = registry(&tb)?;
    let export = synthetic_export();
    let v1 = reg
        .push_snapshot(
            "synth",
            "v1",
            &export[..],
            None,
            None,
            &PushKnobs::default(),
        )
        .await
        .map_err(|e| anyhow::anyhow!("v1 push: {e}"))?;
    ensure!(v1.format == Format::V1);
    let knobs = PushKnobs {
        zstd_level: 3,
        chunk_size_mib: 1,
        concurrency: 2,
        memory_budget_mib: 64,
    };
    let v2 = reg
        .push_snapshot("synth", "v2", &export[..], None, None, &knobs)
        .await
        .map_err(|e| anyhow::anyhow!("v2 push: {e}"))?;
    ensure!(v2.format == Format::V2);
    let z_only = PushKnobs {
        chunk_size_mib: 0,
        ..knobs.clone()
    };
    let v2z = reg
        .push_snapshot("synth", "v2z", &export[..], None, None, &z_only)
        .await
        .map_err(|e| anyhow::anyhow!("v2 zstd-only push: {e}"))?;
    ensure!(v2z.format == Format::V2);

    let seen = reg.inspect("synth", "v2").await.unwrap().unwrap();
    let mem = &seen.config.as_ref().unwrap().files["memory-ranges"];
    ensure!(mem.chunks.len() == 3 && mem.size == 3 << 20, "{mem:?}");
    ensure!(mem.sparse_size == 8589934592);
    let chunk_layers: Vec<_> = seen
        .manifest
        .layers
        .iter()
        .filter(|l| l.title() == Some("memory-ranges"))
        .collect();
    ensure!(chunk_layers.len() == 3);
    ensure!(chunk_layers
        .iter()
        .all(|l| l.media_type == "application/vnd.cocoonstack.vm.memory+zstd"));
    ensure!(chunk_layers[2].annotations["cocoonstack.chunk.index"] == "2");
    ensure!(chunk_layers[2].annotations["cocoonstack.chunk.count"] == "3");

    // K7.3: however it was encoded, each file records the sha256 of its export body, which
    // is what a peer's copy is checked against.
    let mut records = Vec::new();
    for tag in ["v1", "v2", "v2z"] {
        let remote = reg.inspect("synth", tag).await.unwrap().unwrap();
        let files = vk_cocoon::peer::HibernateSource::from_remote(&remote, "s")
            .map_err(|e| anyhow::anyhow!("{tag}: {e}"))?
            .files;
        records.push(files);
    }
    ensure!(
        records[0] == records[1] && records[1] == records[2],
        "{records:?}"
    );
    let sha = |b: &[u8]| {
        use sha2::Digest;
        format!("sha256:{:x}", sha2::Sha256::digest(b))
    };
    let m = &records[0]["memory-ranges"];
    ensure!(
        m.sha256 == sha(&mem_body()) && m.size == 8589934592,
        "{m:?}"
    );
    ensure!(records[0]["cow.raw"].sha256 == sha(&disk_body()));

    let mut streams = Vec::new();
    for tag in ["v1", "v2", "v2z"] {
        let mut sink = Vec::new();
        reg.pull_snapshot("synth", tag, &mut sink, "synth-import")
            .await
            .map_err(|e| anyhow::anyhow!("pull {tag}: {e}"))?;
        streams.push(sink);
    }
    ensure!(
        streams[0] == streams[1],
        "v1 and chunked v2 import streams differ"
    );
    ensure!(
        streams[0] == streams[2],
        "v1 and zstd-only v2 import streams differ"
    );

    // The import stream is a tar cocoon reads: envelope first, renamed, sparse records kept.
    let mut ar = tar::Archive::new(&streams[0][..]);
    let mut entries = ar.entries()?;
    let mut first = entries.next().unwrap()?;
    ensure!(first.path()?.to_str() == Some("snapshot.json"));
    let mut env = String::new();
    std::io::Read::read_to_string(&mut first, &mut env)?;
    let env: Value = serde_json::from_str(&env)?;
    ensure!(
        env["version"] == 1 && env["config"]["name"] == "synth-import",
        "{env}"
    );
    let mut names = Vec::new();
    for e in entries {
        let mut e = e?;
        let name = e.path()?.display().to_string();
        if name == "memory-ranges" {
            let pax: Vec<(String, String)> = e
                .pax_extensions()?
                .context("pax")?
                .map(|x| {
                    let x = x.unwrap();
                    (x.key().unwrap().to_string(), x.value().unwrap().to_string())
                })
                .collect();
            ensure!(
                pax.contains(&("COCOON.sparse.size".into(), "8589934592".into())),
                "{pax:?}"
            );
            ensure!(e.header().mode()? == 0o600);
        }
        names.push(name);
    }
    ensure!(
        names == ["config.json", "memory-ranges", "cow.raw"],
        "{names:?}"
    );

    // A truncated export never reaches the manifest PUT.
    let cut = &export[..export.len() / 2];
    ensure!(reg
        .push_snapshot("synth", "cut", cut, None, None, &PushKnobs::default())
        .await
        .is_err());
    ensure!(reg.inspect("synth", "cut").await.unwrap().is_none());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_image_parts_stream_into_image_import_in_title_order() -> Result<()> {
    use oci_client::client::{ClientConfig, ClientProtocol};
    use vk_cocoon::registry::cocoon_pipe::pull_cloud_image_into_cocoon;
    use vk_cocoon::registry::{Descriptor, Manifest};

    let tb = Testbed::start(TestbedOptions::default().with_registry().with_sim()).await?;
    let addr = tb.registry.as_ref().unwrap().addr.clone();
    let reg = registry(&tb)?;
    let cli = cli(&tb);
    let client = oci_client::Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..Default::default()
    });
    let r: oci_client::Reference = format!("{addr}/snaps/ubuntu:24.04").parse()?;
    let part0 = [&b"QFI\xfb"[..], &[1u8; 4000]].concat();
    let part1 = vec![2u8; 3000];
    let sums = b"checksums, not disk".to_vec();
    let empty = b"{}".to_vec();
    let mut layers = Vec::new();
    // Pushed out of order: the reader sorts disk layers by title.
    for (mt, title, body) in [
        (
            "application/vnd.cocoonstack.disk.qcow2.part",
            "disk.qcow2.part.1",
            &part1,
        ),
        ("text/plain", "SHA256SUMS", &sums),
        (
            "application/vnd.cocoonstack.disk.qcow2.part",
            "disk.qcow2.part.0",
            &part0,
        ),
    ] {
        let digest = {
            use sha2::Digest;
            format!("sha256:{:x}", sha2::Sha256::digest(body))
        };
        client
            .push_blob(&r, body.clone(), &digest)
            .await
            .context("push part")?;
        let mut d = Descriptor {
            media_type: mt.into(),
            digest,
            size: body.len() as i64,
            ..Default::default()
        };
        d.annotations
            .insert("org.opencontainers.image.title".into(), title.into());
        layers.push(d);
    }
    let empty_digest = {
        use sha2::Digest;
        format!("sha256:{:x}", sha2::Sha256::digest(&empty))
    };
    client.push_blob(&r, empty.clone(), &empty_digest).await?;
    let m = Manifest {
        schema_version: 2,
        media_type: OCI_MANIFEST.into(),
        artifact_type: "application/vnd.cocoonstack.os-image.v1+json".into(),
        config: Some(Descriptor {
            media_type: "application/vnd.oci.empty.v1+json".into(),
            digest: empty_digest,
            size: 2,
            ..Default::default()
        }),
        layers,
        ..Default::default()
    };
    client
        .push_manifest_raw(
            &r,
            m.to_bytes(),
            reqwest::header::HeaderValue::from_static(OCI_MANIFEST),
        )
        .await?;

    let seen = reg.inspect("ubuntu", "24.04").await.unwrap().unwrap();
    ensure!(seen.kind == ArtifactKind::CloudImage && seen.config.is_none());
    let n = pull_cloud_image_into_cocoon(&reg, &cli, "ubuntu", "24.04", "ubuntu:24.04")
        .await
        .map_err(|e| anyhow::anyhow!("cloud image pull: {e}"))?;
    ensure!(n == (part0.len() + part1.len()) as u64);
    let img: Value = serde_json::from_str(&tb.sim.as_ref().unwrap().run(&[
        "image",
        "inspect",
        "ubuntu:24.04",
    ])?)?;
    ensure!(img["type"] == "cloudimg", "{img}");
    ensure!(img["size"] == n, "{img}");
    // A tag that does not exist is absent, not a transport error.
    match reg.pull_cloud_image("ubuntu", "missing", Vec::new()).await {
        Err(RegistryError::Absent(_)) => {}
        other => anyhow::bail!("{other:?}"),
    }
    Ok(())
}
