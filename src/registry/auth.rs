//! Registry credentials from the Docker config (`$DOCKER_CONFIG/config.json`, else
//! `~/.docker/config.json`): `auths.<host>.auth` (base64 `user:password`) or
//! `username`/`password`. Anything else — no file, no entry, a credential helper — is anonymous.

use std::path::PathBuf;

use base64::Engine;
use oci_client::secrets::RegistryAuth;
use serde_json::Value;

pub fn docker_config_auth(host: &str) -> RegistryAuth {
    let Some(path) = config_path() else {
        return RegistryAuth::Anonymous;
    };
    match std::fs::read(&path) {
        Ok(bytes) => auth_from_config(&bytes, host),
        Err(_) => RegistryAuth::Anonymous,
    }
}

fn config_path() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker/config.json"))
}

/// Keys may carry a scheme or a path (`https://host/v1/`); only the host part is compared.
fn key_host(key: &str) -> &str {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or(k)
}

pub fn auth_from_config(bytes: &[u8], host: &str) -> RegistryAuth {
    let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
        return RegistryAuth::Anonymous;
    };
    let Some(auths) = v.get("auths").and_then(Value::as_object) else {
        return RegistryAuth::Anonymous;
    };
    for (key, entry) in auths {
        if key_host(key) != host {
            continue;
        }
        if let Some(b64) = entry.get("auth").and_then(Value::as_str) {
            if let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(b64.trim()) {
                if let Some((u, p)) = String::from_utf8_lossy(&raw).split_once(':') {
                    return RegistryAuth::Basic(u.to_string(), p.to_string());
                }
            }
        }
        let user = entry.get("username").and_then(Value::as_str);
        let pass = entry.get("password").and_then(Value::as_str);
        if let (Some(u), Some(p)) = (user, pass) {
            return RegistryAuth::Basic(u.to_string(), p.to_string());
        }
    }
    RegistryAuth::Anonymous
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_by_host() {
        let cfg = br#"{"auths":{
            "https://reg.example:5000/v1/":{"auth":"dXNlcjpwYTpzcw=="},
            "other.example":{"username":"u2","password":"p2"}}}"#;
        match auth_from_config(cfg, "reg.example:5000") {
            RegistryAuth::Basic(u, p) => assert_eq!((u.as_str(), p.as_str()), ("user", "pa:ss")),
            _ => panic!("want basic"),
        }
        match auth_from_config(cfg, "other.example") {
            RegistryAuth::Basic(u, p) => assert_eq!((u.as_str(), p.as_str()), ("u2", "p2")),
            _ => panic!("want basic"),
        }
        assert!(matches!(
            auth_from_config(cfg, "reg.example"),
            RegistryAuth::Anonymous
        ));
        assert!(matches!(
            auth_from_config(b"{", "x"),
            RegistryAuth::Anonymous
        ));
    }
}
