//! `vk-cocoon snapshots own`: the upgrade path of T15. Snapshots and tags made before owner
//! records existed carry none, so no pod may use them until an operator either lists them as
//! public bases (`VK_PUBLIC_SNAPSHOTS`) or records whose they are, which is what this does.
//! A record is written only where there is none: an existing record is what keeps tenants
//! apart, and is never rewritten.
//!
//! The registry form re-PUTs the tag's manifest with the owner annotation (no blob moves).
//! The local form has no verb to change a description, so it moves the snapshot through a
//! file: `snapshot export` into `VK_STAGING_DIR`, `snapshot rm`, then `snapshot import` with
//! the record as its description. A failed import keeps the file and says how to import it
//! by hand, so the snapshot is never lost.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use reconcilers::owner::{Owner, DESCRIPTION_PREFIX};

use crate::config::Config;
use crate::registry::{valid_snapshot_name, Registry};

/// Where the snapshot lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// `OCI_REGISTRY`'s `<name>:<tag>`.
    Registry,
    /// This host's cocoon snapshot `<name>`.
    Local,
}

/// Records `owner` on `target` (`<name>[:<tag>]` in the registry, `<name>` locally); returns
/// what was done, for the operator.
pub async fn own(config: &Config, target: &str, owner: &Owner, place: Place) -> Result<String> {
    match place {
        Place::Registry => own_tag(config, target, owner).await,
        Place::Local => own_local(config, target, owner),
    }
}

async fn own_tag(config: &Config, target: &str, owner: &Owner) -> Result<String> {
    let base = config
        .oci_registry
        .as_deref()
        .context("OCI_REGISTRY is unset, so there is no registry to record an owner in")?;
    let (name, tag) = target.split_once(':').unwrap_or((target, "latest"));
    if !valid_snapshot_name(name) || name.contains(':') || tag.is_empty() {
        bail!("{target:?} is not <repository>[:<tag>]");
    }
    let registry = Registry::from_config(base)?;
    let digest = registry
        .record_owner(name, tag, owner)
        .await
        .with_context(|| format!("recording the owner of {name}:{tag} in {base}"))?;
    Ok(format!(
        "{name}:{tag} now belongs to {} (manifest {digest})",
        owner.record()
    ))
}

fn own_local(config: &Config, name: &str, owner: &Owner) -> Result<String> {
    if !valid_snapshot_name(name) {
        bail!("{name:?} is not a cocoon snapshot name");
    }
    let cocoon = config.cocoon_bin.as_path();
    let inspected = output(cocoon, &["snapshot", "inspect", "--", name])?;
    let info = crate::cocoon::json::snapshot(&inspected)
        .map_err(|e| anyhow::anyhow!("snapshot inspect {name}: {}", e.message))?;
    if info.description.starts_with(DESCRIPTION_PREFIX) {
        bail!(
            "local snapshot {name} already carries the owner record {:?}; a record is never rewritten",
            info.description
        );
    }
    std::fs::create_dir_all(&config.staging_dir)
        .with_context(|| format!("creating {}", config.staging_dir.display()))?;
    let leaf = match crate::peer::plain_name(&info.id) {
        true => format!("own-{}.tar", info.id),
        false => format!("own-{}.tar", std::process::id()),
    };
    let file = config.staging_dir.join(leaf);
    eprintln!(
        "exporting {name} to {} (the snapshot's whole size is copied: about as long as copying its files)",
        file.display()
    );
    export(cocoon, name, &file)?;
    output(cocoon, &["snapshot", "rm", "--", name])?;
    let description = owner.description();
    eprintln!("importing {name} back with the record {description:?}");
    let import = [
        "snapshot",
        "import",
        "--name",
        name,
        "--description",
        &description,
    ];
    if let Err(e) = with_stdin(cocoon, &import, &file) {
        bail!(
            "{e:#}\nthe snapshot is kept in {}; import it by hand with: {} snapshot import --name {name} --description '{description}' < {}",
            file.display(),
            cocoon.display(),
            file.display()
        );
    }
    std::fs::remove_file(&file).with_context(|| format!("removing {}", file.display()))?;
    Ok(format!(
        "local snapshot {name} now belongs to {}",
        owner.record()
    ))
}

fn failed(argv: &[&str], out: &std::process::Output) -> anyhow::Error {
    anyhow::anyhow!(
        "cocoon {} failed ({}): {}",
        argv.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )
}

/// Runs cocoon with `argv`; its stdout as text.
fn output(cocoon: &Path, argv: &[&str]) -> Result<String> {
    let out = Command::new(cocoon)
        .args(argv)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting {}", cocoon.display()))?;
    if !out.status.success() {
        return Err(failed(argv, &out));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `snapshot export -o - -- <name>` into `file`, synced before the snapshot is removed.
fn export(cocoon: &Path, name: &str, file: &PathBuf) -> Result<()> {
    let argv = ["snapshot", "export", "-o", "-", "--", name];
    let sink =
        std::fs::File::create(file).with_context(|| format!("creating {}", file.display()))?;
    let out = Command::new(cocoon)
        .args(argv)
        .stdin(Stdio::null())
        .stdout(sink.try_clone()?)
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("starting {}", cocoon.display()))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(file);
        return Err(failed(&argv, &out));
    }
    sink.sync_all()
        .with_context(|| format!("syncing {}", file.display()))
}

fn with_stdin(cocoon: &Path, argv: &[&str], file: &PathBuf) -> Result<()> {
    let source =
        std::fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let out = Command::new(cocoon)
        .args(argv)
        .stdin(source)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("starting {}", cocoon.display()))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(failed(argv, &out)),
    }
}
