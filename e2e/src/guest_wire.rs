//! Talking to a stand-in guest from the host, as its users would: ICMP echo, the SSH banner
//! on 22, and the value port's `SET`/`GET` lines (e2e/ch-standin/README.md, "The guest").

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The guest program's value port.
pub const VALUE_PORT: u16 = 7777;

/// One ICMP echo, answered within a second.
pub fn ping(ip: &str) -> bool {
    Command::new("ping")
        .args(["-c", "1", "-W", "1", "--", ip])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn connect(ip: &str, port: u16) -> std::io::Result<TcpStream> {
    let addr: SocketAddr = format!("{ip}:{port}")
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    Ok(s)
}

/// The first line the guest sends on port 22.
pub fn banner(ip: &str) -> std::io::Result<String> {
    let mut line = String::new();
    BufReader::new(connect(ip, 22)?).read_line(&mut line)?;
    Ok(line)
}

/// One request line to the value port (`SET <v>` or `GET`), its answer line back.
pub fn value_port(ip: &str, request: &str) -> std::io::Result<String> {
    let mut s = connect(ip, VALUE_PORT)?;
    s.write_all(format!("{request}\n").as_bytes())?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    Ok(line.trim_end().to_string())
}

/// Whether process `pid` still exists.
pub fn alive(pid: i64) -> bool {
    pid > 0 && std::path::Path::new(&format!("/proc/{pid}")).exists()
}
