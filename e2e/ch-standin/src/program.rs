//! The guest program: which services the tiny guest runs, read from the `--initramfs` file
//! (a JSON document; see the README). Anything unreadable gives the defaults.

use serde::{Deserialize, Serialize};

pub const DEFAULT_BANNER: &str = "SSH-2.0-cocoon-standin";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Program {
    pub tcp_ports: Vec<u16>,
    pub value_port: u16,
    pub banner: String,
}

impl Default for Program {
    fn default() -> Self {
        Program {
            tcp_ports: vec![22, 8080],
            value_port: 7777,
            banner: DEFAULT_BANNER.to_string(),
        }
    }
}

#[derive(Deserialize)]
struct Doc {
    tcp_ports: Option<Vec<u16>>,
    value_port: Option<u16>,
    banner: Option<String>,
}

impl Program {
    /// The program and, when the defaults stood in, why (a console line).
    pub fn load(initramfs: Option<&str>) -> (Program, Option<String>) {
        let Some(path) = initramfs else {
            return (
                Program::default(),
                Some("no initramfs: default guest program".into()),
            );
        };
        let text = match std::fs::read(path) {
            Ok(t) => t,
            Err(e) => {
                return (
                    Program::default(),
                    Some(format!("initramfs {path}: {e}: default guest program")),
                )
            }
        };
        match Program::parse(&text) {
            Ok(p) => (p, None),
            Err(e) => (
                Program::default(),
                Some(format!(
                    "initramfs {path} is not a guest program ({e}): default guest program"
                )),
            ),
        }
    }

    pub fn parse(text: &[u8]) -> Result<Program, String> {
        let doc: Doc = serde_json::from_slice(text).map_err(|e| e.to_string())?;
        let d = Program::default();
        Ok(Program {
            tcp_ports: doc.tcp_ports.unwrap_or(d.tcp_ports),
            value_port: doc.value_port.unwrap_or(d.value_port),
            banner: doc.banner.unwrap_or(d.banner),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_optional() {
        let p = Program::parse(br#"{"tcp_ports":[22,80]}"#).unwrap();
        assert_eq!(p.tcp_ports, vec![22, 80]);
        assert_eq!(p.value_port, 7777);
        assert_eq!(p.banner, DEFAULT_BANNER);
        assert!(Program::parse(b"\x1f\x8b not json").is_err());
        let (p, why) = Program::load(Some("/nonexistent/initrd.img"));
        assert_eq!(p, Program::default());
        assert!(why.unwrap().contains("default guest program"));
    }
}
