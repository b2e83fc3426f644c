//! What is shipped, as a user gets it: `make image` pushes the daemon's image to the testbed
//! registry, and it is pulled back and its binary run; `make deb`'s package installs into a
//! scratch root with the unit and the env file in place. Both need the release build of
//! `make dist`, so they run from `make e2e-packaging`, not from `make test`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{ensure, Context, Result};
use e2e::testbed::{Testbed, TestbedOptions};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn top() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| top().join("target"))
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn version_of(binary: &Path) -> Result<String> {
    Ok(run(Command::new(binary).arg("version"))?.trim().to_string())
}

async fn pull_blob(client: &Client, image: &Reference, d: &OciDescriptor) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    client.pull_blob(image, d, &mut out).await?;
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the release build of make dist: run by make e2e-packaging"]
async fn make_image_pushes_an_image_whose_binary_runs() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::default().with_registry()).await?;
    let registry = &tb.registry.as_ref().context("registry")?.addr;
    let target = format!("{registry}/vk-cocoon:{VERSION}");
    let printed = run(Command::new("make")
        .current_dir(top())
        .arg("image")
        .arg(format!("IMAGE_PUSH={target}"))
        .arg("IMAGE_INSECURE=1"))?;
    eprintln!("{printed}");
    ensure!(printed.contains(&format!("pushed {target}")), "{printed}");

    let client = Client::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..ClientConfig::default()
    });
    let image: Reference = target.parse()?;
    let (manifest, digest) = client
        .pull_manifest_raw(
            &image,
            &RegistryAuth::Anonymous,
            &["application/vnd.oci.image.manifest.v1+json"],
        )
        .await?;
    // The registry holds the very manifest make image printed and wrote into its archive.
    ensure!(printed.contains(&digest), "{digest} not in {printed}");
    let manifest: OciImageManifest = serde_json::from_slice(&manifest)?;
    let config: serde_json::Value =
        serde_json::from_slice(&pull_blob(&client, &image, &manifest.config).await?)?;
    ensure!(
        config["config"]["Entrypoint"] == serde_json::json!(["/usr/bin/vk-cocoon"]),
        "entrypoint: {}",
        config["config"]
    );
    ensure!(manifest.layers.len() == 1, "layers: {:?}", manifest.layers);
    let layer = pull_blob(&client, &image, &manifest.layers[0]).await?;
    let mut tar = Vec::new();
    flate2::read::GzDecoder::new(layer.as_slice()).read_to_end(&mut tar)?;

    let root = tempfile::tempdir()?;
    tar::Archive::new(tar.as_slice()).unpack(root.path())?;
    let binary = root.path().join("usr/bin/vk-cocoon");
    let version = version_of(&binary)?;
    ensure!(
        version.starts_with(&format!("vk-cocoon {VERSION} ")),
        "version: {version}"
    );
    // Static and stripped: nothing to load, no debug sections (they are in the .debug file).
    let headers = run(Command::new("readelf").args(["-lS", "-W"]).arg(&binary))?;
    ensure!(
        !headers.contains("INTERP"),
        "dynamically linked:\n{headers}"
    );
    // (`.debug_gdb_scripts` is loaded code's pointer to pretty-printers, not debug information.)
    ensure!(
        !headers.contains(".debug_info") && !headers.contains(".debug_line"),
        "debug sections left:\n{headers}"
    );
    ensure!(
        headers.contains(".gnu_debuglink"),
        "no debuglink:\n{headers}"
    );
    ensure!(
        root.path()
            .join("etc/ssl/certs/ca-certificates.crt")
            .is_file(),
        "no CA bundle in the image"
    );
    Ok(())
}

#[test]
#[ignore = "needs make deb: run by make e2e-packaging"]
fn the_package_installs_into_a_scratch_root() -> Result<()> {
    let debian = target_dir().join("debian");
    let deb = debian.join(format!("vk-cocoon_{VERSION}-1_amd64.deb"));
    let dbgsym = debian.join(format!("vk-cocoon-dbgsym_{VERSION}-1_amd64.ddeb"));
    for f in [&deb, &dbgsym] {
        ensure!(f.is_file(), "{} is missing: run make deb", f.display());
    }
    let root = tempfile::tempdir()?;
    let r = root.path();
    // An empty dpkg database: the package goes in as on a host, conffiles registered.
    for d in ["var/lib/dpkg/info", "var/lib/dpkg/updates"] {
        std::fs::create_dir_all(r.join(d))?;
    }
    std::fs::write(r.join("var/lib/dpkg/status"), "")?;
    run(Command::new("dpkg")
        .arg(format!("--root={}", r.display()))
        .args(["--force-not-root", "--install"])
        .arg(&deb)
        .arg(&dbgsym))?;
    let status = run(Command::new("dpkg-query")
        .arg(format!("--root={}", r.display()))
        .args(["-W", "-f=${Status} ${Version}", "vk-cocoon"]))?;
    ensure!(
        status == format!("install ok installed {VERSION}-1"),
        "dpkg status: {status}"
    );

    let version = version_of(&r.join("usr/bin/vk-cocoon"))?;
    ensure!(
        version.starts_with(&format!("vk-cocoon {VERSION} ")),
        "{version}"
    );
    let same = |installed: &str, source: &str| -> Result<()> {
        let a = std::fs::read(r.join(installed)).with_context(|| installed.to_string())?;
        let b = std::fs::read(top().join(source))?;
        ensure!(a == b, "{installed} differs from {source}");
        Ok(())
    };
    same(
        "lib/systemd/system/vk-cocoon.service",
        "packaging/vk-cocoon.service",
    )?;
    same(
        "etc/cocoon/vk/vk-cocoon.env",
        "packaging/vk-cocoon.env.example",
    )?;
    same(
        "usr/share/doc/vk-cocoon/examples/vk-cocoon.kubeconfig.example",
        "packaging/vk-cocoon.kubeconfig.example",
    )?;
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(r.join("etc/cocoon/vk/vk-cocoon.env"))?
        .permissions()
        .mode();
    ensure!(mode & 0o777 == 0o600, "env file mode {mode:o}");
    // An upgrade keeps the operator's edits of the env file.
    let conffiles = std::fs::read_to_string(r.join("var/lib/dpkg/info/vk-cocoon.conffiles"))?;
    ensure!(
        conffiles
            .lines()
            .any(|l| l == "/etc/cocoon/vk/vk-cocoon.env"),
        "conffiles: {conffiles}"
    );
    // Stripped, and its debug information sits where gdb looks it up by build id.
    let binary = r.join("usr/bin/vk-cocoon");
    let notes = run(Command::new("readelf")
        .args(["-n", "-S", "-W"])
        .arg(&binary))?;
    ensure!(
        !notes.contains(".debug_info") && !notes.contains(".debug_line"),
        "debug sections left in the binary"
    );
    let id = notes
        .lines()
        .find_map(|l| l.split_once("Build ID: ").map(|(_, id)| id.trim()))
        .context("no build id")?
        .to_string();
    let debug = r.join(format!(
        "usr/lib/debug/.build-id/{}/{}.debug",
        &id[..2],
        &id[2..]
    ));
    let sections = run(Command::new("readelf").args(["-S", "-W"]).arg(&debug))?;
    ensure!(
        sections.contains(".debug_line"),
        "no line tables in {}",
        debug.display()
    );
    Ok(())
}
