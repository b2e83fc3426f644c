//! A stand-in for cocoon-net's lease release API (LEASE-7), served on a Unix
//! socket: `DELETE /v1/leases/<mac>` drops that MAC's row from the lease file and answers
//! 204, also when there was none; an unparseable MAC is 400; another method on the path is
//! 405 with `Allow: DELETE`; a lease file that cannot be rewritten is 500. One connection at a
//! time: its callers are few and quick.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::Duration;

use crate::config::Env;
use crate::error::Result;
use crate::ids::normalize_mac;
use crate::leases;
use crate::output::log;

pub fn serve(env: &Env, socket: &Path) -> Result<()> {
    let _ = fs::remove_file(socket);
    if let Some(dir) = socket.parent() {
        fs::create_dir_all(dir)?;
    }
    let listener = UnixListener::bind(socket)?;
    fs::set_permissions(socket, fs::Permissions::from_mode(0o600))?;
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        if let Err(e) = answer(env, &mut conn) {
            log("sim.net_control", format!("connection failed: {e}"));
        }
    }
    Ok(())
}

fn answer(env: &Env, conn: &mut UnixStream) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
    }
    let mut parts = request.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, extra, body) = match (method, path.strip_prefix("/v1/leases/")) {
        ("DELETE", Some(mac)) => match normalize_mac(&unescape(mac)) {
            Some(mac) => match leases::release(&env.leases, &mac) {
                Ok(()) => {
                    log("sim.net_control", format!("released the lease of {mac}"));
                    ("204 No Content", "", "")
                }
                Err(_) => ("500 Internal Server Error", "", "lease release failed\n"),
            },
            None => ("400 Bad Request", "", "invalid MAC address\n"),
        },
        (_, Some(_)) => ("405 Method Not Allowed", "Allow: DELETE\r\n", ""),
        _ => ("404 Not Found", "", "not found\n"),
    };
    write!(
        conn,
        "HTTP/1.1 {status}\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// `%3A` and friends back to bytes (a path-escaped MAC).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = (b[i] == b'%' && i + 2 < b.len())
            .then(|| std::str::from_utf8(&b[i + 1..i + 3]).ok())
            .flatten()
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(v) => {
                out.push(v);
                i += 3;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn unescapes_a_path_escaped_mac() {
        assert_eq!(unescape("02%3A5e%3a11:3a:9c:01"), "02:5e:11:3a:9c:01");
        assert_eq!(unescape("trailing%3"), "trailing%3");
    }
}
