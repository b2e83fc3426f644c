//! `make bench-snapshot`: push and pull of a 1 GiB snapshot through the loopback registry,
//! against a plain `cp` of the same bytes on this machine, with the RSS growth of this process
//! (which does the transfer). First with a stand-in cocoon script: its export streams a
//! prepared archive (`snapshot.json` and one random-data `memory-ranges` file) through a pipe,
//! its import writes its pipe to a file, so those figures are the registry path's and the
//! glue's only; then from and into the cocoon simulator, whose VM disk holds as many bytes of
//! random data. `BENCH_SNAPSHOT_BYTES` overrides the size.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use e2e::testbed::{Testbed, TestbedOptions};
use vk_cocoon::cocoon::CocoonCli;
use vk_cocoon::registry::cocoon_pipe::{pull_into_cocoon, push_from_cocoon};
use vk_cocoon::registry::{PushKnobs, Registry};

fn status_kib(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Resets the peak RSS so the next reading is the peak of what follows.
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Appends `size` bytes of xorshift noise (incompressible, like a memory image).
fn write_random(f: &mut impl std::io::Write, size: u64) -> Result<()> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        for w in buf.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    Ok(())
}

fn header(name: &str, size: u64, mode: u32) -> Vec<u8> {
    let mut h = tar::Header::new_ustar();
    h.set_size(size);
    h.set_mode(mode);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_path(name).unwrap();
    h.set_cksum();
    h.as_bytes().to_vec()
}

fn pad(size: u64) -> Vec<u8> {
    vec![0u8; ((512 - size % 512) % 512) as usize]
}

/// What `cocoon snapshot export` would stream for a snapshot holding one `memory-ranges` file
/// of `size` random bytes, written to `path`.
fn synthetic_export(path: &Path, size: u64) -> Result<()> {
    use std::io::Write;
    let envelope = br#"{"version":1,"config":{"id":"BENCHSNAPSHOT","name":"bench","hypervisor":"cloud-hypervisor","cpu":2,"memory":1073741824}}"#;
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    f.write_all(&header("snapshot.json", envelope.len() as u64, 0o644))?;
    f.write_all(envelope)?;
    f.write_all(&pad(envelope.len() as u64))?;
    f.write_all(&header("memory-ranges", size, 0o640))?;
    write_random(&mut f, size)?;
    f.write_all(&pad(size))?;
    f.write_all(&[0u8; 1024])?;
    f.flush()?;
    Ok(())
}

/// A stand-in `cocoon`: export streams the prepared archive, import writes what it reads to
/// a file, as cocoon's importer does; both through pipes, like the real thing.
const FAKE_COCOON: &str = r#"#!/bin/sh
case "$1 $2" in
  "snapshot export") exec cat "$BENCH_EXPORT" ;;
  "snapshot rm") exit 0 ;;
  "snapshot import") exec cat > "$BENCH_IMPORT" ;;
esac
echo "Error: unexpected $*" >&2
exit 1
"#;

/// What the registry itself allows: one monolithic PUT of `file` (digest computed beforehand,
/// untimed) and one GET of it into nothing, with plain HTTP.
async fn registry_ceiling(addr: &str, file: &Path) -> Result<(f64, f64)> {
    use futures::StreamExt;
    use sha2::Digest;
    use tokio::io::AsyncReadExt;
    let digest = {
        let mut h = sha2::Sha256::new();
        let mut f = std::fs::File::open(file)?;
        std::io::copy(&mut f, &mut h)?;
        format!("sha256:{:x}", h.finalize())
    };
    let size = std::fs::metadata(file)?.len();
    let http = reqwest::Client::new();
    let t = Instant::now();
    let start = http
        .post(format!("http://{addr}/v2/ceiling/blobs/uploads/"))
        .send()
        .await?;
    let loc = start
        .headers()
        .get("location")
        .context("upload location")?
        .to_str()?
        .to_string();
    let loc = if loc.starts_with('/') {
        format!("http://{addr}{loc}")
    } else {
        loc
    };
    let sep = if loc.contains('?') { '&' } else { '?' };
    let f = tokio::fs::File::open(file).await?;
    let body = futures::stream::unfold(f, |mut f| async move {
        let mut buf = vec![0u8; 1 << 20];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(bytes::Bytes::from(buf)), f))
            }
            Err(e) => Some((Err(e), f)),
        }
    });
    let put = http
        .put(format!("{loc}{sep}digest={digest}"))
        .header("Content-Length", size)
        .header("Content-Type", "application/octet-stream")
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await?;
    anyhow::ensure!(put.status().as_u16() == 201, "PUT: {}", put.status());
    let up = t.elapsed().as_secs_f64();
    settle();
    let t = Instant::now();
    let mut got = 0u64;
    let mut s = http
        .get(format!("http://{addr}/v2/ceiling/blobs/{digest}"))
        .send()
        .await?
        .bytes_stream();
    while let Some(b) = s.next().await {
        got += b?.len() as u64;
    }
    anyhow::ensure!(got == size);
    Ok((up, t.elapsed().as_secs_f64()))
}

struct Run {
    secs: f64,
    rss_growth_mib: f64,
}

/// Writes back what earlier steps left dirty, so each timed step starts from the same page
/// cache state instead of paying for its predecessor's writeback.
fn settle() {
    let _ = std::process::Command::new("sync").status();
}

fn mbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / secs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: make bench-snapshot"]
async fn bench_snapshot_push_pull() -> Result<()> {
    let size: u64 = std::env::var("BENCH_SNAPSHOT_BYTES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1 << 30);
    let tb = Testbed::start(TestbedOptions::default().with_registry().with_sim()).await?;
    let addr = tb.registry.as_ref().unwrap().addr.clone();
    let dir = tb.run_dir().join("bench");
    std::fs::create_dir_all(&dir)?;
    let export = dir.join("export.tar");
    synthetic_export(&export, size)?;
    let import = dir.join("import.tar");
    let bin = dir.join("cocoon");
    std::fs::write(&bin, FAKE_COCOON)?;
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let cli = CocoonCli {
        env: vec![
            ("BENCH_EXPORT".into(), export.display().to_string()),
            ("BENCH_IMPORT".into(), import.display().to_string()),
        ],
        ..CocoonCli::new(bin.display().to_string())
    };

    // Baseline: cp of the same bytes, same filesystem, page cache as warm as for the transfer.
    let copy = dir.join("cp-copy");
    settle();
    let t = Instant::now();
    let st = std::process::Command::new("cp")
        .arg(&export)
        .arg(&copy)
        .status()?;
    anyhow::ensure!(st.success(), "cp failed");
    let cp_secs = t.elapsed().as_secs_f64();
    std::fs::remove_file(&copy)?;

    let spool = dir.join("spool");
    std::fs::create_dir_all(&spool)?;
    let reg = Registry::from_config(&addr)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .with_spool_dir(&spool);

    settle();
    let (ceiling_up, ceiling_down) = registry_ceiling(&addr, &export).await?;

    let mut runs: Vec<(String, Run, Run)> = Vec::new();
    let v2 = PushKnobs {
        zstd_level: 1,
        chunk_size_mib: 4,
        concurrency: 2,
        memory_budget_mib: 64,
    };
    for (label, tag, knobs) in [
        ("v1 (knobs 0)", "hibernate", PushKnobs::default()),
        ("v2 (zstd 1, 4 MiB chunks, 2 workers)", "v2", v2),
    ] {
        settle();
        let base = status_kib("VmRSS:");
        reset_peak();
        let t = Instant::now();
        let out = push_from_cocoon(
            &reg,
            &cli,
            "bench",
            "bench",
            tag,
            None,
            Some("bench-node"),
            &knobs,
        )
        .await
        .map_err(|e| anyhow::anyhow!("push {label}: {e}"))?;
        let push = Run {
            secs: t.elapsed().as_secs_f64(),
            rss_growth_mib: status_kib("VmHWM:").saturating_sub(base) as f64 / 1024.0,
        };
        anyhow::ensure!(out.blobs_uploaded >= 1);

        settle();
        let base = status_kib("VmRSS:");
        reset_peak();
        let t = Instant::now();
        let pulled = pull_into_cocoon(&reg, &cli, "bench", tag, "bench-import")
            .await
            .map_err(|e| anyhow::anyhow!("pull {label}: {e}"))?;
        let pull = Run {
            secs: t.elapsed().as_secs_f64(),
            rss_growth_mib: status_kib("VmHWM:").saturating_sub(base) as f64 / 1024.0,
        };
        anyhow::ensure!(pulled.bytes > size, "the import stream holds the file");
        anyhow::ensure!(std::fs::metadata(&import)?.len() == pulled.bytes);
        std::fs::remove_file(&import).context("import.tar")?;
        runs.push((label.to_string(), push, pull));
    }

    // The same v1 transfer from and into the cocoon simulator: a VM whose disk holds `size`
    // bytes of random data, saved, pushed, pulled back under a new name. The simulator's
    // export and import (sparse PAX records, a real disk file) are in these times.
    let sim = tb.sim.as_ref().expect("simulator");
    let mut env = sim.env();
    env.push((
        e2e::procs::MARKER.to_string(),
        tb.run_dir().display().to_string(),
    ));
    env.push(("COCOON_SIM_DISK_BYTES".into(), size.to_string()));
    env.push(("COCOON_SIM_DISK_DATA_BYTES".into(), size.to_string()));
    let sim_cli = CocoonCli {
        env,
        ..CocoonCli::new(sim.bin.display().to_string())
    };
    for argv in [
        &["image", "pull", "localhost/bench/base:1"][..],
        &["vm", "run", "--name", "bench-vm", "localhost/bench/base:1"],
        &["snapshot", "save", "--name", "bench-vm", "bench-vm"],
    ] {
        let argv: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
        sim_cli
            .run(&argv)
            .await
            .map_err(|e| anyhow::anyhow!("cocoon {}: {}", argv.join(" "), e.message))?;
    }
    settle();
    let base = status_kib("VmRSS:");
    reset_peak();
    let t = Instant::now();
    push_from_cocoon(
        &reg,
        &sim_cli,
        "bench-vm",
        "bench-vm",
        "hibernate",
        None,
        Some("bench-node"),
        &PushKnobs::default(),
    )
    .await
    .map_err(|e| anyhow::anyhow!("push from the simulator: {e}"))?;
    let push = Run {
        secs: t.elapsed().as_secs_f64(),
        rss_growth_mib: status_kib("VmHWM:").saturating_sub(base) as f64 / 1024.0,
    };
    settle();
    let base = status_kib("VmRSS:");
    reset_peak();
    let t = Instant::now();
    pull_into_cocoon(&reg, &sim_cli, "bench-vm", "hibernate", "bench-vm-import")
        .await
        .map_err(|e| anyhow::anyhow!("pull into the simulator: {e}"))?;
    let pull = Run {
        secs: t.elapsed().as_secs_f64(),
        rss_growth_mib: status_kib("VmHWM:").saturating_sub(base) as f64 / 1024.0,
    };
    runs.push(("v1 via cocoon-sim (disk of random data)".into(), push, pull));

    let cp = mbps(size, cp_secs);
    println!();
    println!("snapshot size: {} MiB (random data)", size >> 20);
    println!("cp baseline: {cp_secs:.2} s, {cp:.0} MB/s (MiB/s)");
    println!("| writer | step | seconds | MiB/s | % of cp | RSS growth MiB |");
    println!("|---|---|---|---|---|---|");
    for (label, push, pull) in &runs {
        for (step, r) in [("push", push), ("pull", pull)] {
            let m = mbps(size, r.secs);
            println!(
                "| {label} | {step} | {:.2} | {m:.0} | {:.0} % | {:.1} |",
                r.secs,
                100.0 * m / cp,
                r.rss_growth_mib
            );
        }
    }
    println!(
        "registry alone, same bytes (digest known, no client hashing): monolithic PUT {:.2} s \
         ({:.0} MiB/s, {:.0} % of cp), GET to nowhere {:.2} s ({:.0} MiB/s, {:.0} % of cp)",
        ceiling_up,
        mbps(size, ceiling_up),
        100.0 * mbps(size, ceiling_up) / cp,
        ceiling_down,
        mbps(size, ceiling_down),
        100.0 * mbps(size, ceiling_down) / cp,
    );
    let (_, push, pull) = &runs[0];
    let ok = |r: &Run| mbps(size, r.secs) >= cp / 2.0 && r.rss_growth_mib <= 32.0;
    println!(
        "v1 goals (>= 50 % of cp, RSS growth <= 32 MiB): push {}, pull {}",
        if ok(push) { "met" } else { "NOT met" },
        if ok(pull) { "met" } else { "NOT met" }
    );
    Ok(())
}
