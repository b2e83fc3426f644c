//! A one-file web server on loopback, so the real cocoon can pull a cloud image by URL
//! without the network: `GET /<name>` answers the file, any other path `404 Not Found`.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;

/// Serves `file` as `/<its name>` until the test process exits; returns the base URL.
pub fn serve(file: &Path) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let base = format!("http://{}", listener.local_addr().expect("its address"));
    let name = format!("/{}", file.file_name().unwrap().to_string_lossy());
    let body = std::fs::read(file).expect("the served file");
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut request = String::new();
            let mut reader = BufReader::new(&conn);
            if reader.read_line(&mut request).is_err() {
                continue;
            }
            // The headers are read to their end so the client sees no reset.
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let path = request.split_whitespace().nth(1).unwrap_or("");
            let (status, bytes): (&str, &[u8]) = if path == name {
                ("200 OK", &body)
            } else {
                ("404 Not Found", b"not found\n")
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
                bytes.len()
            );
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(bytes);
        }
    });
    base
}
