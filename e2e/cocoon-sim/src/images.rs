//! Image verbs (CLI-6.1–CLI-6.3): a local image index only, no bytes are kept. An image ref
//! whose name contains `missing` cannot be pulled (a registry 404, or for a cloud-image URL the
//! web server's 404 as cocoon reports it), which lets tests hit that path. A cloud image at an
//! `http://` URL on this host (a test's own server on loopback) is really fetched, as cocoon
//! fetches it: the pull lasts as long as the server takes, and a status other than 2xx fails
//! it. Other URLs are only indexed (the tests run without a network).

use std::io::{BufRead, BufReader, Read, Write};

use crate::cli::ImageCmd;
use crate::config::Env;
use crate::error::{fail, Context, Result};
use crate::faults;
use crate::ids;
use crate::model::ImageRec;
use crate::names;
use crate::output::{self, log};
use crate::store::Store;
use crate::timefmt::{now_ns, rfc3339_nano};
use crate::{exact_args, min_args};

const FAKE_SIZE: i64 = 268_435_456;

pub fn dispatch(env: &Env, cmd: ImageCmd) -> Result<()> {
    match cmd {
        ImageCmd::Pull { force, args } => pull(env, force, &args),
        ImageCmd::Inspect { args } => inspect(env, &args),
        ImageCmd::Import { args } => import(env, &args),
        ImageCmd::List { format } => list(env, &format),
    }
}

fn record(name: &str, kind: &str, digest: &str) -> ImageRec {
    ImageRec {
        id: if digest.is_empty() {
            format!("sha256:{}", ids::fake_digest(name))
        } else {
            digest.to_string()
        },
        name: name.to_string(),
        kind: kind.to_string(),
        size: FAKE_SIZE,
        created_at: rfc3339_nano(now_ns()),
    }
}

/// `clone --pull`: make the snapshot's base image present (pinned by digest when known).
pub fn ensure(store: &Store, image: &str, kind: &str, digest: &str) -> Result<()> {
    store.update(|db| {
        if !db.images.contains_key(image) {
            db.images
                .insert(image.to_string(), record(image, kind, digest));
        }
        Ok(())
    })
}

fn pull(env: &Env, force: bool, args: &[String]) -> Result<()> {
    exact_args(args, 1)?;
    let image = &args[0];
    let fx = faults::on_verb(env, "image pull")?;
    fx.sleep();
    if image.contains("missing") && names::is_url(image) {
        return fail(format!(
            "pull {image}: http get {image}: status 404 404 Not Found"
        ));
    }
    if image.contains("missing") {
        return fail(format!(
            "pull {image}: GET {image}: MANIFEST_UNKNOWN: manifest unknown"
        ));
    }
    let kind = if names::is_url(image) {
        "cloudimg"
    } else {
        "oci"
    };
    if let Some((authority, path)) = loopback_http(image) {
        fetch(image, authority, path)?;
    }
    let store = Store::new(&env.root);
    store.update(|db| {
        let refresh = force && kind == "cloudimg";
        if refresh || !db.images.contains_key(image) {
            db.images.insert(image.clone(), record(image, kind, ""));
        }
        Ok(())
    })?;
    log("cmd.image.pull", format!("pulled {image}"));
    Ok(())
}

/// The authority and path of an `http://` URL whose host is this one (loopback), if it is one.
fn loopback_http(image: &str) -> Option<(&str, &str)> {
    let rest = image.strip_prefix("http://")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let host = match authority.rsplit_once(':') {
        Some((h, _)) if !h.is_empty() => h,
        _ => authority,
    };
    let loopback = host == "localhost"
        || host == "[::1]"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|a| a.is_loopback());
    loopback.then_some((authority, path))
}

/// GETs `path` from `authority` (HTTP/1.0, so the body ends with the connection) and reads the
/// whole body, failing as cocoon does on a status other than 2xx.
fn fetch(image: &str, authority: &str, path: &str) -> Result<()> {
    let addr = match authority.rsplit_once(':') {
        Some((_, port)) if port.bytes().all(|b| b.is_ascii_digit()) => authority.to_string(),
        _ => format!("{authority}:80"),
    };
    let prefix = format!("pull {image}: http get {image}");
    let mut conn = std::net::TcpStream::connect(&addr).ctx(&prefix)?;
    // One write: a server that answers after the request line and closes must not see the
    // rest of the request arrive after it, or the write fails with a broken pipe.
    let request = format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n");
    conn.write_all(request.as_bytes()).ctx(&prefix)?;
    let mut reader = BufReader::new(conn);
    let mut status = String::new();
    if reader.read_line(&mut status).ctx(&prefix)? == 0 {
        return fail(format!("{prefix}: unexpected EOF"));
    }
    let mut words = status.trim_end().splitn(3, ' ');
    let code = words.nth(1).unwrap_or("");
    if !code.starts_with('2') {
        let text = words.next().unwrap_or("");
        return fail(format!("{prefix}: status {code} {code} {text}"));
    }
    std::io::copy(&mut reader, &mut std::io::sink()).ctx(&prefix)?;
    Ok(())
}

fn inspect(env: &Env, args: &[String]) -> Result<()> {
    exact_args(args, 1)?;
    let fx = faults::on_verb(env, "image inspect")?;
    fx.sleep();
    let name = &args[0];
    let img = Store::new(&env.root).read(|db| {
        Ok(db
            .images
            .get(name)
            .or_else(|| db.images.values().find(|i| i.id == *name))
            .cloned())
    })?;
    let Some(img) = img else {
        return fail(format!("image {name:?}: not found in any backend"));
    };
    if fx.garbage {
        return output::emit(faults::GARBAGE);
    }
    output::print_pretty(&img)
}

/// Type from magic bytes: qcow2 `QFI\xfb` is a cloud image, tar or gzip an OCI layer.
fn import(env: &Env, args: &[String]) -> Result<()> {
    min_args(args, 1)?;
    let name = &args[0];
    let fx = faults::on_verb(env, "image import")?;
    let mut data = Vec::new();
    if args.len() == 1 {
        std::io::stdin().lock().read_to_end(&mut data)?;
    }
    // Several files are the parts of one split image, in order, as cocoon reads them.
    for file in &args[1..] {
        let mut f = std::fs::File::open(file).ctx(format!("open {file}: open {file}"))?;
        f.read_to_end(&mut data)?;
    }
    fx.sleep();
    let is_tar = data.len() > 262 && &data[257..262] == b"ustar";
    let kind = if data.starts_with(b"QFI\xfb") {
        "cloudimg"
    } else if data.starts_with(&[0x1f, 0x8b]) || is_tar {
        "oci"
    } else if data.is_empty() {
        return fail("import: read image: empty input");
    } else {
        return fail("import: unrecognized image format (want qcow2, tar or tar.gz)");
    };
    let head = String::from_utf8_lossy(&data[..data.len().min(4096)]).to_string();
    let digest = format!(
        "sha256:{}",
        ids::fake_digest(&format!("{}{head}", data.len()))
    );
    Store::new(&env.root).update(|db| {
        let mut rec = record(name, kind, &digest);
        rec.size = data.len() as i64;
        db.images.insert(name.clone(), rec);
        Ok(())
    })?;
    log("cmd.image.import", format!("imported {name} ({kind})"));
    Ok(())
}

fn list(env: &Env, format: &str) -> Result<()> {
    let imgs: Vec<ImageRec> =
        Store::new(&env.root).read(|db| Ok(db.images.values().cloned().collect()))?;
    if imgs.is_empty() {
        return output::emit("No images found.\n");
    }
    if format == "json" {
        return output::print_pretty(&imgs);
    }
    let mut t = String::from("NAME  TYPE  ID  SIZE\n");
    for i in &imgs {
        t.push_str(&format!("{}  {}  {}  {}\n", i.name, i.kind, i.id, i.size));
    }
    output::emit(&t)
}
