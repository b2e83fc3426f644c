//! Registry credentials from the Docker config (`$DOCKER_CONFIG/config.json`, else
//! `~/.docker/config.json`), in Docker's order: a credential helper named for the host
//! (`credHelpers.<host>`), else the default store (`credsStore`), else `auths.<host>`
//! (`auth`, base64 `user:password`, or `username`/`password`). A helper is the program
//! `docker-credential-<name> get` (e.g. `gcloud` for Artifact Registry with the host's
//! application default credentials); its answers can expire, so callers resolve credentials
//! again for each transfer. No file and no entry is anonymous.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use oci_client::secrets::RegistryAuth;
use serde_json::Value;

/// A helper that has not answered by then is killed and the config's `auths` used instead.
const HELPER_TIMEOUT: Duration = Duration::from_secs(10);

pub fn docker_config_auth(host: &str) -> RegistryAuth {
    let Some(path) = config_path() else {
        return RegistryAuth::Anonymous;
    };
    let Ok(bytes) = std::fs::read(&path) else {
        return RegistryAuth::Anonymous;
    };
    if let Some(helper) = helper_for(&bytes, host) {
        match run_helper(&helper, host) {
            Ok(auth) => return auth,
            Err(e) => tracing::warn!(
                helper = %helper,
                host,
                error = %e,
                "registry credential helper failed; trying the config's auths"
            ),
        }
    }
    auth_from_config(&bytes, host)
}

/// A credential helper's answer is good for this long; then the config is read again, since
/// helpers hand out short-lived tokens (an hour for `gcloud`).
const REFRESH: Duration = Duration::from_secs(300);

/// The credentials a registry's calls use: fixed, or read from the Docker config and read
/// again once `REFRESH` has passed.
#[derive(Clone)]
pub struct Credentials {
    host: Option<String>,
    cached: std::sync::Arc<std::sync::Mutex<(Option<Instant>, RegistryAuth)>>,
}

impl Credentials {
    pub fn fixed(auth: RegistryAuth) -> Credentials {
        Credentials {
            host: None,
            cached: std::sync::Arc::new(std::sync::Mutex::new((None, auth))),
        }
    }

    pub fn docker_config(host: &str) -> Credentials {
        let auth = docker_config_auth(host);
        Credentials {
            host: Some(host.to_string()),
            cached: std::sync::Arc::new(std::sync::Mutex::new((Some(Instant::now()), auth))),
        }
    }

    pub async fn get(&self) -> RegistryAuth {
        let fresh = {
            let c = self.cached.lock().unwrap_or_else(|p| p.into_inner());
            match (&self.host, c.0) {
                (Some(_), Some(at)) if at.elapsed() >= REFRESH => None,
                _ => Some(c.1.clone()),
            }
        };
        if let Some(auth) = fresh {
            return auth;
        }
        let host = self.host.clone().unwrap_or_default();
        // A helper is a process that may take seconds: off the async workers.
        let auth = tokio::task::spawn_blocking(move || docker_config_auth(&host))
            .await
            .unwrap_or(RegistryAuth::Anonymous);
        let mut c = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        *c = (Some(Instant::now()), auth.clone());
        auth
    }
}

/// The credential helper Docker would use for `host`, if any.
pub fn helper_for(bytes: &[u8], host: &str) -> Option<String> {
    let v: Value = serde_json::from_slice(bytes).ok()?;
    let per_host = v
        .get("credHelpers")
        .and_then(Value::as_object)
        .and_then(|m| m.iter().find(|(k, _)| key_host(k) == host))
        .and_then(|(_, h)| h.as_str());
    per_host
        .or_else(|| v.get("credsStore").and_then(Value::as_str))
        .filter(|h| !h.is_empty())
        .map(str::to_string)
}

/// `docker-credential-<helper> get` with the host on stdin; answers `{"Username","Secret"}`.
pub fn run_helper(helper: &str, host: &str) -> Result<RegistryAuth, String> {
    // The name becomes part of a program name looked up on PATH: nothing but a plain word.
    if !helper
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        return Err(format!("helper name {helper:?} is not a plain name"));
    }
    helper_answer(&format!("docker-credential-{helper}"), host)
}

fn helper_answer(program: &str, host: &str) -> Result<RegistryAuth, String> {
    let mut child = Command::new(program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{program}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(host.as_bytes())
            .map_err(|e| format!("{program}: writing the host: {e}"))?;
    }
    let deadline = Instant::now() + HELPER_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{program} did not answer within {HELPER_TIMEOUT:?}"
                ));
            }
            Err(e) => return Err(format!("{program}: {e}")),
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} get: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("{program} get answered something other than JSON: {e}"))?;
    match (
        v.get("Username").and_then(Value::as_str),
        v.get("Secret").and_then(Value::as_str),
    ) {
        (Some(u), Some(s)) if !s.is_empty() => Ok(RegistryAuth::Basic(u.into(), s.into())),
        _ => Err(format!("{program} get answered no Username and Secret")),
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

    #[test]
    fn a_host_helper_beats_the_store_and_the_store_beats_nothing() {
        let cfg = br#"{"credHelpers":{"us-docker.pkg.dev":"gcloud"},"credsStore":"pass"}"#;
        assert_eq!(
            helper_for(cfg, "us-docker.pkg.dev").as_deref(),
            Some("gcloud")
        );
        assert_eq!(helper_for(cfg, "reg.example").as_deref(), Some("pass"));
        assert_eq!(helper_for(br#"{"auths":{}}"#, "reg.example"), None);
    }

    #[test]
    fn a_helper_name_that_is_not_a_plain_word_is_never_run() {
        let err = run_helper("../../bin/sh", "reg.example").unwrap_err();
        assert!(err.contains("not a plain name"), "{err}");
    }

    #[test]
    fn a_helper_is_asked_for_the_host_and_its_secret_used() {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("docker-credential-test");
        // Answers only for the host it is asked about, as real helpers do.
        std::fs::write(
            &program,
            "#!/bin/sh\nread host\n[ \"$1\" = get ] && [ \"$host\" = reg.example ] && \
             echo '{\"ServerURL\":\"reg.example\",\"Username\":\"oauth2accesstoken\",\"Secret\":\"tok\"}'\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        let program = program.to_str().unwrap();
        match helper_answer(program, "reg.example\n") {
            Ok(RegistryAuth::Basic(u, p)) => {
                assert_eq!((u.as_str(), p.as_str()), ("oauth2accesstoken", "tok"))
            }
            other => panic!("want basic, got {other:?}"),
        }
        assert!(helper_answer(program, "other.example\n").is_err());
    }

    #[test]
    fn a_missing_helper_is_an_error_naming_the_program() {
        let err = run_helper("vk-cocoon-test-absent", "reg.example").unwrap_err();
        assert!(
            err.contains("docker-credential-vk-cocoon-test-absent"),
            "{err}"
        );
    }
}
