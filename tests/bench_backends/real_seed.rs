//! The real lane's clone source, made by hand as an operator would (pull, run, save, remove)
//! before the daemon starts, each step timed: the only figures that separate an image pull's
//! layer conversion and cocoon's CNI setup from the rest of a call.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use e2e::real_cocoon::RealCocoon;
use e2e::testbed::Testbed;

/// Made from an image of its own, so that the run pods' pull of `tb.guest_image` is a cold one.
pub const SNAPSHOT: &str = "bench-agent";

/// What the real lane needs that a host may lack; `None` when all is there.
pub fn missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("root (cocoon creates network namespaces and TAPs)".into());
    }
    for b in ["cocoon-real", "mkfs.erofs", "registry"] {
        if let Err(e) = e2e::bins::built(b) {
            return Some(e.to_string());
        }
    }
    ["bridge", "host-local"].iter().find_map(|p| {
        let path = Path::new(e2e::cni::DEBIAN_PLUGIN_DIR).join(p);
        (!path.exists()).then(|| format!("{} (containernetworking-plugins)", path.display()))
    })
}

/// Milliseconds of one blocking step.
fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    let t = Instant::now();
    let v = f()?;
    Ok((v, t.elapsed().as_secs_f64() * 1000.0))
}

/// Makes [`SNAPSHOT`]; returns (step, ms) rows.
pub async fn seed(tb: &Testbed, real: &RealCocoon) -> Result<Vec<(String, f64)>> {
    let registry = tb.registry.as_ref().context("registry")?;
    let program = e2e::guest_image::GuestProgram {
        banner: "SSH-2.0-bench-snapshot-source".into(),
        ..Default::default()
    };
    let image = e2e::guest_image::push(registry, "vk/guest", "bench-snap", &program).await?;
    let mut rows = Vec::new();
    let (_, ms) = timed(|| real.run(&["image", "pull", &image]))?;
    rows.push((
        "image pull (cold: fetch + mkfs.erofs of 1 layer)".into(),
        ms,
    ));

    // The same conversion the pull ran, alone, on the same layer.
    let dir = tempfile::tempdir()?;
    let tar = dir.path().join("layer.tar");
    std::fs::write(&tar, e2e::guest_image::layer(&program))?;
    let erofs = e2e::bins::built("mkfs.erofs")?;
    let (out, ms) = timed(|| {
        Ok(std::process::Command::new(&erofs)
            .arg("--tar=f")
            .arg("-zlz4hc")
            .arg(dir.path().join("layer.erofs"))
            .arg(&tar)
            .output()?)
    })?;
    if out.status.success() {
        rows.push(("mkfs.erofs --tar=f -zlz4hc of that layer".into(), ms));
    } else {
        println!(
            "  mkfs.erofs by hand failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }

    // With and without a NIC: the difference is cocoon's CNI ADD (netns, veth, TAP, tc
    // redirect, host-local), which the daemon's journal only sees inside `vm run`.
    for (nics, label) in [("1", "vm run, 1 NIC"), ("0", "vm run, no NIC")] {
        for i in 0..3 {
            let name = format!("bench-seed-{nics}-{i}");
            let args = [
                "vm", "run", "--output", "json", "--name", &name, "--nics", nics,
            ];
            let args: Vec<&str> = args.iter().copied().chain([image.as_str()]).collect();
            match timed(|| real.run(&args)) {
                Ok((_, ms)) => rows.push((label.into(), ms)),
                Err(e) => println!("  {label} by hand failed: {e:#}"),
            }
        }
    }
    let (_, ms) = timed(|| real.run(&["snapshot", "save", "--name", SNAPSHOT, "bench-seed-1-0"]))?;
    rows.push(("snapshot save".into(), ms));
    for id in real.vm_ids()? {
        let (_, ms) = timed(|| real.run(&["vm", "rm", "--force", &id]))?;
        rows.push(("vm rm --force".into(), ms));
    }
    Ok(rows)
}
