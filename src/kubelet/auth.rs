//! Who may call the kubelet API (K9), decided as a kubelet decides it: a verified client
//! certificate (CN = user, O = groups) or a bearer token the apiserver vouches for
//! (TokenReview) names the caller; the apiserver then says whether that caller may use this
//! node's resource for the path (SubjectAccessReview). A request with no credentials is
//! refused, unless `VK_KUBELET_ANONYMOUS` opens the reads (logs, stats, metrics) to everyone.
//!
//! Decisions are cached briefly, so a `kubectl logs -f` reconnecting or a scraper every few
//! seconds costs the apiserver one review per caller and path kind, not one per request.
//! Tokens nobody has vouched for yet are what a caller can invent without end, so their
//! reviews are bounded (K11): a few at once and a steady rate, the rest answered 429 without
//! asking the apiserver; tokens found good and tokens found bad are cached apart, so a flood
//! of bad ones never pushes out the callers already known, and a token found good in the
//! last [`VOUCHED_TTL`] is reviewed again past those bounds, so a flood never holds up a
//! known caller whose answer expired.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{header, Method, StatusCode};
use actix_web::middleware::Next;
use actix_web::{web, HttpResponse};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::metrics::{Cap, Metrics};

/// Allowed answers are kept longer than denials, so a newly granted role takes effect soon.
const ALLOWED_TTL: Duration = Duration::from_secs(30);
const DENIED_TTL: Duration = Duration::from_secs(5);
/// K11: how long a token the apiserver vouched for keeps its place ahead of the bounds on
/// reviews; a caller cannot forge one, so this lane is no way around them.
const VOUCHED_TTL: Duration = Duration::from_secs(600);
/// Bounds each cache: a caller cycling through tokens cannot grow the daemon's memory.
const CACHE_ENTRIES: usize = 1024;
/// K11: TokenReviews of tokens not in a cache, at once. A review takes the apiserver a few
/// milliseconds; the callers with tokens (Prometheus, a person's curl) are few, and each
/// needs one review per 30 s.
pub const REVIEWS_AT_ONCE: usize = 4;
/// K11: and in a steady stream, per second, after a burst of [`REVIEW_BURST`]: far more new
/// callers a second than a node sees, and far less than would load an apiserver.
pub const REVIEWS_PER_SECOND: u32 = 10;
pub const REVIEW_BURST: u32 = 20;

/// The DER of the client certificate the TLS layer verified for a connection.
#[derive(Clone, Debug)]
pub struct PeerCert(pub Vec<u8>);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What a request is asking for, in the terms RBAC grants: a verb on `nodes/<subresource>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Attributes {
    pub verb: &'static str,
    pub subresource: &'static str,
    /// A read the open mode serves without credentials: a `get` of container logs, stats or
    /// metrics (K9). Never exec, attach or port-forward, whose WebSockets are `get`s too.
    pub read: bool,
}

/// The kubelet's mapping of paths to node subresources: stats, metrics and the node log
/// directory have their own; everything else (pods, container logs, exec, attach,
/// port-forward) is `proxy`, the most powerful.
pub fn attributes(method: &Method, path: &str) -> Attributes {
    let under = |prefix: &str| path == prefix || path.starts_with(&format!("{prefix}/"));
    let readable = ["/containerLogs", "/stats", "/metrics", "/logs"]
        .iter()
        .any(|p| under(p));
    let subresource = if under("/stats") {
        "stats"
    } else if under("/metrics") {
        "metrics"
    } else if under("/logs") {
        "log"
    } else {
        "proxy"
    };
    let verb = match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "get",
    };
    Attributes {
        verb,
        subresource,
        read: readable && verb == "get",
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// 401: no credentials, or ones nobody vouches for.
    Unauthenticated(String),
    /// 403: a known caller without the permission.
    Forbidden(String),
    /// 429: a token not seen yet, while the reviews of new tokens are at their cap (K11).
    Throttled(String),
    /// 500: the apiserver could not be asked.
    Failed(String),
}

impl Verdict {
    /// The status and text a refusal is answered with; `None` for [`Verdict::Allow`].
    pub fn refusal(&self) -> Option<(StatusCode, &str)> {
        match self {
            Verdict::Allow => None,
            Verdict::Unauthenticated(t) => Some((StatusCode::UNAUTHORIZED, t.as_str())),
            Verdict::Forbidden(t) => Some((StatusCode::FORBIDDEN, t.as_str())),
            Verdict::Throttled(t) => Some((StatusCode::TOO_MANY_REQUESTS, t.as_str())),
            Verdict::Failed(t) => Some((StatusCode::INTERNAL_SERVER_ERROR, t.as_str())),
        }
    }

    fn response(&self) -> HttpResponse {
        let (code, text) = self.refusal().unwrap_or((StatusCode::OK, ""));
        let mut res = HttpResponse::build(code);
        if let Verdict::Throttled(_) = self {
            res.insert_header((header::RETRY_AFTER, "1"));
        }
        res.content_type(PLAIN).body(text.to_string())
    }
}

/// The content type of a refusal's text.
pub const PLAIN: &str = "text/plain; charset=utf-8";

/// A map whose entries expire, and which never holds more than `CACHE_ENTRIES`.
struct Cache<K, V> {
    entries: HashMap<K, (V, Instant)>,
}

impl<K: Hash + Eq, V: Clone> Cache<K, V> {
    fn new() -> Self {
        Self {
            entries: HashMap::new(),
        }
    }

    fn get(&mut self, k: &K, now: Instant) -> Option<V> {
        match self.entries.get(k) {
            Some((v, until)) if *until > now => Some(v.clone()),
            Some(_) => {
                self.entries.remove(k);
                None
            }
            None => None,
        }
    }

    fn remove(&mut self, k: &K) {
        self.entries.remove(k);
    }

    fn put(&mut self, k: K, v: V, until: Instant, now: Instant) {
        if self.entries.len() >= CACHE_ENTRIES {
            self.entries.retain(|_, (_, u)| *u > now);
        }
        if self.entries.len() >= CACHE_ENTRIES {
            // Still full of live entries: start over rather than grow; the cost is a review
            // per caller again, never a wrong answer.
            self.entries.clear();
        }
        self.entries.insert(k, (v, until));
    }
}

/// A token bucket: `burst` at once, refilled at `rate` a second.
struct Bucket {
    tokens: f64,
    at: Instant,
    rate: f64,
    burst: f64,
}

impl Bucket {
    fn new(rate: u32, burst: u32, now: Instant) -> Self {
        Self {
            tokens: f64::from(burst),
            at: now,
            rate: f64::from(rate),
            burst: f64::from(burst),
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + refill).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// What the apiserver said of a token, or that it was not asked.
enum Review {
    Known(User),
    Unknown,
    /// K11: over the cap on reviews; the apiserver was not asked.
    Throttled(String),
}

struct Inner {
    client: kube::Client,
    node: String,
    certificates: bool,
    anonymous: bool,
    metrics: Metrics,
    /// Tokens the apiserver vouched for, and those it did not, apart (K11).
    tokens: Mutex<Cache<[u8; 32], User>>,
    rejected: Mutex<Cache<[u8; 32], ()>>,
    /// Tokens the apiserver vouched for lately: reviewed again without waiting on the caps.
    vouched: Mutex<Cache<[u8; 32], ()>>,
    reviews_at_once: Arc<tokio::sync::Semaphore>,
    review_rate: Mutex<Bucket>,
    decisions: Mutex<Cache<(User, Attributes), bool>>,
}

#[derive(Clone)]
pub struct Guard(Arc<Inner>);

impl Guard {
    pub fn new(
        client: kube::Client,
        node: String,
        certificates: bool,
        anonymous: bool,
        metrics: Metrics,
    ) -> Self {
        Self(Arc::new(Inner {
            client,
            node,
            certificates,
            anonymous,
            metrics,
            tokens: Mutex::new(Cache::new()),
            rejected: Mutex::new(Cache::new()),
            vouched: Mutex::new(Cache::new()),
            reviews_at_once: Arc::new(tokio::sync::Semaphore::new(REVIEWS_AT_ONCE)),
            review_rate: Mutex::new(Bucket::new(
                REVIEWS_PER_SECOND,
                REVIEW_BURST,
                Instant::now(),
            )),
            decisions: Mutex::new(Cache::new()),
        }))
    }

    /// Says at every start what the API accepts, and how to change it.
    pub fn announce(&self) {
        let i = &self.0;
        if i.anonymous {
            tracing::warn!(
                "VK_KUBELET_ANONYMOUS=true: the kubelet API serves reads without credentials, \
                 unchecked; anyone who reaches the port reads pod logs, stats and metrics \
                 (exec, attach and port-forward still need credentials). Unset it and set \
                 VK_CLIENT_CA_FILE to check callers"
            );
        }
        if !i.certificates {
            tracing::warn!(
                "VK_CLIENT_CA_FILE is not set: the kubelet API refuses client certificates, so \
                 the apiserver's kubectl logs (which presents its --kubelet-client-certificate) is \
                 refused; bearer tokens are still checked with the apiserver. Set \
                 VK_CLIENT_CA_FILE to the CA that signs the apiserver's kubelet client certificate"
            );
        }
    }

    /// The verdict for one request; `cert` is the connection's verified client certificate.
    pub async fn check(
        &self,
        cert: Option<&PeerCert>,
        authorization: Option<&str>,
        attrs: Attributes,
    ) -> Verdict {
        let user = if let Some(cert) = cert {
            match user_of_certificate(&cert.0) {
                Ok(u) => u,
                Err(e) => return Verdict::Unauthenticated(format!("Unauthorized: {e}")),
            }
        } else if let Some(token) = authorization.and_then(bearer) {
            match self.review_token(token).await {
                Ok(Review::Known(u)) => u,
                Ok(Review::Unknown) => return Verdict::Unauthenticated("Unauthorized".into()),
                Ok(Review::Throttled(why)) => {
                    self.0.metrics.cap_refused(Cap::TokenReviews);
                    return Verdict::Throttled(why);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "kubelet API: TokenReview failed");
                    return Verdict::Unauthenticated("Unauthorized".into());
                }
            }
        } else if self.0.anonymous && attrs.read {
            return Verdict::Allow;
        } else if self.0.anonymous {
            return Verdict::Unauthenticated(
                "Unauthorized: without credentials only container logs, stats and metrics may \
                 be read (VK_KUBELET_ANONYMOUS); exec, attach, port-forward and every other \
                 path need a client certificate or a bearer token"
                    .into(),
            );
        } else {
            return Verdict::Unauthenticated("Unauthorized".into());
        };
        let what = format!(
            "user={}, verb={}, resource=nodes, subresource={}",
            user.name, attrs.verb, attrs.subresource
        );
        match self.review_access(user, attrs).await {
            Ok(true) => Verdict::Allow,
            Ok(false) => Verdict::Forbidden(format!("Forbidden ({what})")),
            Err(e) => {
                tracing::warn!(error = %e, "kubelet API: SubjectAccessReview failed");
                Verdict::Failed(format!("Authorization error ({what})"))
            }
        }
    }

    async fn review_token(&self, token: &str) -> anyhow::Result<Review> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let now = Instant::now();
        if let Some(user) = lock(&self.0.tokens).get(&key, now) {
            return Ok(Review::Known(user));
        }
        if lock(&self.0.rejected).get(&key, now).is_some() {
            return Ok(Review::Unknown);
        }
        let vouched = lock(&self.0.vouched).get(&key, now).is_some();
        let at_once = self.0.reviews_at_once.clone().try_acquire_owned();
        let _at_once = match at_once {
            Ok(permit) => Some(permit),
            Err(_) if vouched => None,
            Err(_) => {
                return Ok(Review::Throttled(format!(
                    "Too many requests: {REVIEWS_AT_ONCE} bearer tokens new to this node are \
                     being checked with the apiserver already; retry in a second"
                )))
            }
        };
        if !vouched && !lock(&self.0.review_rate).take(now) {
            return Ok(Review::Throttled(format!(
                "Too many requests: this node checks at most {REVIEWS_PER_SECOND} new bearer \
                 tokens a second with the apiserver; retry in a second"
            )));
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        let out = Api::<TokenReview>::all(self.0.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let status = out.status.unwrap_or_default();
        let user = match (status.authenticated, status.user) {
            (Some(true), Some(u)) => Some(User {
                name: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default(),
            }),
            _ => None,
        };
        let now = Instant::now();
        Ok(match user {
            Some(user) => {
                lock(&self.0.tokens).put(key, user.clone(), now + ALLOWED_TTL, now);
                lock(&self.0.vouched).put(key, (), now + VOUCHED_TTL, now);
                Review::Known(user)
            }
            None => {
                lock(&self.0.vouched).remove(&key);
                lock(&self.0.rejected).put(key, (), now + DENIED_TTL, now);
                Review::Unknown
            }
        })
    }

    async fn review_access(&self, user: User, attrs: Attributes) -> anyhow::Result<bool> {
        let key = (user, attrs);
        let now = Instant::now();
        if let Some(hit) = lock(&self.0.decisions).get(&key, now) {
            return Ok(hit);
        }
        let (user, _) = &key;
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(attrs.verb.into()),
                    group: Some(String::new()),
                    version: Some("v1".into()),
                    resource: Some("nodes".into()),
                    subresource: Some(attrs.subresource.into()),
                    name: Some(self.0.node.clone()),
                    ..Default::default()
                }),
                non_resource_attributes: None,
            },
            ..Default::default()
        };
        let out = Api::<SubjectAccessReview>::all(self.0.client.clone())
            .create(&PostParams::default(), &review)
            .await?;
        let allowed = out.status.is_some_and(|s| s.allowed);
        let ttl = if allowed { ALLOWED_TTL } else { DENIED_TTL };
        lock(&self.0.decisions).put(key, allowed, now + ttl, now);
        Ok(allowed)
    }
}

#[cfg(test)]
impl Guard {
    /// Remembers `user` as allowed `attrs`, as a SubjectAccessReview would have answered.
    pub fn remember_allowed(&self, user: User, attrs: Attributes) {
        let now = Instant::now();
        let until = now + Duration::from_secs(3600);
        lock(&self.0.decisions).put((user, attrs), true, until, now);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A cache is only ever whole entries in and out; a poisoned one is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// CN is the user and every O a group, as the apiserver reads its own client certificates.
pub fn user_of_certificate(der: &[u8]) -> Result<User, String> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, cert) =
        X509Certificate::from_der(der).map_err(|e| format!("unreadable certificate: {e}"))?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .filter(|n| !n.is_empty())
        .ok_or("the client certificate has no common name")?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok().map(str::to_string))
        .collect();
    Ok(User {
        name,
        uid: String::new(),
        groups,
        extra: BTreeMap::new(),
    })
}

/// The middleware in front of every route, unknown paths included.
pub async fn middleware(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let Some(guard) = req.app_data::<web::Data<Guard>>().cloned() else {
        let refused = Verdict::Failed("the kubelet API has no guard".into()).response();
        return Ok(req.into_response(refused).map_into_right_body());
    };
    let cert = req.conn_data::<PeerCert>().cloned();
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let attrs = attributes(req.method(), req.path());
    match guard
        .check(cert.as_ref(), authorization.as_deref(), attrs)
        .await
    {
        Verdict::Allow => next
            .call(req)
            .await
            .map(ServiceResponse::map_into_left_body),
        refused => {
            tracing::debug!(path = %req.path(), ?refused, "kubelet API request refused");
            Ok(req.into_response(refused.response()).map_into_right_body())
        }
    }
}

#[cfg(test)]
#[path = "auth_reviews_tests.rs"]
mod reviews_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_node_subresources_as_the_kubelet_maps_them() {
        let get = Method::GET;
        for (path, sub) in [
            ("/stats/summary", "stats"),
            ("/stats", "stats"),
            ("/metrics/resource", "metrics"),
            ("/logs", "log"),
            ("/logs/syslog", "log"),
            ("/containerLogs/default/p/agent", "proxy"),
            ("/pods", "proxy"),
            ("/runningpods/", "proxy"),
            ("/exec/default/p/agent", "proxy"),
            ("/statsx", "proxy"),
        ] {
            assert_eq!(attributes(&get, path).subresource, sub, "{path}");
        }
        assert_eq!(attributes(&Method::POST, "/exec/a/b/c").verb, "create");
        assert_eq!(attributes(&Method::HEAD, "/pods").verb, "get");
        assert_eq!(attributes(&Method::DELETE, "/pods").verb, "delete");
    }

    #[test]
    fn a_bearer_header_gives_its_token() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer  abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer "), None);
    }

    #[test]
    fn a_certificate_names_its_user_and_groups() {
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "kube-apiserver-kubelet-client");
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:masters");
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = p.self_signed(&key).unwrap();
        let u = user_of_certificate(cert.der()).unwrap();
        assert_eq!(u.name, "kube-apiserver-kubelet-client");
        assert_eq!(u.groups, ["system:masters"]);
        assert!(user_of_certificate(b"junk").is_err());
    }

    /// A client whose apiserver never answers: no review can succeed.
    fn unreachable() -> kube::Client {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        kube::Client::try_from(config).unwrap()
    }

    #[tokio::test]
    async fn without_credentials_only_the_open_mode_serves() {
        let attrs = attributes(&Method::GET, "/stats/summary");
        let closed = Guard::new(unreachable(), "node-a".into(), true, false, Metrics::new());
        assert!(matches!(
            closed.check(None, None, attrs).await,
            Verdict::Unauthenticated(_)
        ));
        let open = Guard::new(unreachable(), "node-a".into(), false, true, Metrics::new());
        assert_eq!(open.check(None, None, attrs).await, Verdict::Allow);
        // Credentials that are presented are checked even in the open mode: a token nobody
        // can vouch for is refused, and a certificate's user is still authorized.
        assert!(matches!(
            open.check(None, Some("Bearer who-knows"), attrs).await,
            Verdict::Unauthenticated(_)
        ));
        assert!(matches!(
            closed
                .check(Some(&PeerCert(b"junk".to_vec())), None, attrs)
                .await,
            Verdict::Unauthenticated(_)
        ));
    }

    /// The open mode serves reads only: a WebSocket exec or port-forward is a `get` too, and
    /// is refused like everything that is not a log, stats or metrics read.
    #[tokio::test]
    async fn without_credentials_the_open_mode_serves_reads_only() {
        let open = Guard::new(unreachable(), "node-a".into(), false, true, Metrics::new());
        for path in [
            "/containerLogs/default/p/agent",
            "/stats/summary",
            "/metrics",
            "/metrics/resource",
            "/logs/syslog",
        ] {
            let attrs = attributes(&Method::GET, path);
            assert!(attrs.read, "{path}");
            assert_eq!(
                open.check(None, None, attrs).await,
                Verdict::Allow,
                "{path}"
            );
        }
        for (method, path) in [
            (Method::GET, "/exec/default/p/agent"),
            (Method::POST, "/exec/default/p/agent"),
            (Method::GET, "/attach/default/p/agent"),
            (Method::GET, "/portForward/default/p"),
            (Method::POST, "/portForward/default/p"),
            (Method::GET, "/pods"),
            (Method::GET, "/runningpods/"),
            (Method::POST, "/containerLogs/default/p/agent"),
            (Method::GET, "/containerLogsx"),
        ] {
            let attrs = attributes(&method, path);
            assert!(!attrs.read, "{method} {path}");
            match open.check(None, None, attrs).await {
                Verdict::Unauthenticated(why) => {
                    assert!(
                        why.contains("only container logs, stats and metrics"),
                        "{why}"
                    )
                }
                other => panic!("{method} {path}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_cache_expires_and_stays_bounded() {
        let mut c = Cache::new();
        let t0 = Instant::now();
        c.put(1u32, true, t0 + Duration::from_secs(5), t0);
        assert_eq!(c.get(&1, t0), Some(true));
        assert_eq!(c.get(&1, t0 + Duration::from_secs(6)), None);
        for k in 0..(CACHE_ENTRIES as u32 * 3) {
            c.put(k, false, t0 + Duration::from_secs(30), t0);
            assert!(c.entries.len() <= CACHE_ENTRIES);
        }
    }
}
