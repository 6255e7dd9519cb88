//! Resource-server mode: the MCP server as an OAuth 2.1 resource server, as the 2026-07-28
//! authorization spec makes it.
//!
//! - It publishes its Protected Resource Metadata (RFC 9728) at
//!   `/.well-known/oauth-protected-resource` and at the path-suffixed form for its endpoint,
//!   naming its one authorization server and the scopes it knows.
//! - It verifies access tokens (JWTs) against the keys the authorization server publishes (found
//!   through its RFC 8414 or OpenID Connect metadata): the signature (RS256, ES256 or EdDSA; never
//!   `none` or a shared-secret algorithm), the issuer, the audience (this server's resource URL,
//!   RFC 8707), and `exp`/`nbf` within a small leeway. The principal is the token's `sub`.
//! - A token signed with a key it does not know makes it fetch the keys again (the authorization
//!   server rotated them), at most once per refresh interval, so a flood of made-up key ids
//!   cannot hammer the authorization server. Keys older than their most age are fetched again
//!   before the next token is checked, so that a key the authorization server withdrew stops
//!   being trusted.
//! - A request without a token, or with one that fails, gets 401 with a `WWW-Authenticate`
//!   challenge pointing at the metadata; a token without a tool's scope gets 403 naming it.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::Router;
use axum::http::HeaderMap;
use axum::routing::get;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::{Value, json};
use tower_http::cors::{Any, CorsLayer};

use super::{AuthError, Authenticator, Caller, Principal, READ_SCOPE, WRITE_SCOPE, bearer_token};
use crate::bounded::read_at_most;

/// The longest a fetch from the authorization server may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest metadata document or key set read from the authorization server.
const MOST_FETCHED_BYTES: usize = 256 * 1024;
/// The scopes this server knows, as its metadata lists them.
const SCOPES: [&str; 2] = [READ_SCOPE, WRITE_SCOPE];
const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

/// The authorization server's keys, by key id (`""` for a key without one).
type Keys = HashMap<String, Vec<(Algorithm, DecodingKey)>>;

/// When the authorization server's keys are fetched again.
#[derive(Debug, Clone, Copy)]
pub struct KeyRefresh {
    /// The least time between two fetches, whatever asks for them.
    pub least_between: Duration,
    /// The longest keys are trusted as fetched.
    pub most_age: Duration,
}

/// The keys, and when they were fetched.
struct KeySet {
    keys: Keys,
    fetched: Instant,
}

/// The resource server (see the module docs).
pub struct ResourceServer {
    issuer: String,
    resource: String,
    metadata_url: String,
    metadata_paths: Vec<String>,
    jwks_uri: String,
    http: reqwest::Client,
    leeway: Duration,
    refresh: KeyRefresh,
    keys: RwLock<KeySet>,
    /// When the keys were last fetched or tried; held while fetching, so fetches never overlap.
    last_refresh: tokio::sync::Mutex<Instant>,
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    /// Checked by the decoder; kept to end long-lived streams when the token expires. A
    /// number of seconds, which RFC 7519 allows to have a fraction.
    exp: f64,
    /// RFC 9068's `scope`: space-separated, though some authorization servers send a list.
    #[serde(default)]
    scope: Option<ScopeClaim>,
    /// What some authorization servers (Okta, Microsoft Entra) send instead of `scope`: read
    /// only then, so that an odd one beside a good `scope` does not spoil the token.
    #[serde(default)]
    scp: Option<Value>,
}

/// An `exp` with a fraction of a second taken to the nearest second, as the decoder takes it.
fn whole_seconds(exp: f64) -> i64 {
    exp.round() as i64
}

/// A scope claim as authorization servers write it.
#[derive(Clone, Deserialize)]
#[serde(untagged)]
enum ScopeClaim {
    Spaced(String),
    Listed(Vec<String>),
}

impl Claims {
    /// The scopes the token grants: `scope`, else `scp` (none if it is neither a string nor a
    /// list of strings), else none.
    fn scopes(&self) -> Vec<String> {
        let scp = || {
            self.scp
                .clone()
                .and_then(|scp| serde_json::from_value::<ScopeClaim>(scp).ok())
        };
        match self.scope.clone().or_else(scp) {
            Some(ScopeClaim::Spaced(spaced)) => {
                spaced.split_whitespace().map(str::to_owned).collect()
            }
            Some(ScopeClaim::Listed(listed)) => listed
                .iter()
                .flat_map(|scope| scope.split_whitespace())
                .map(str::to_owned)
                .collect(),
            None => Vec::new(),
        }
    }
}

impl ResourceServer {
    /// Finds `issuer`'s metadata and keys, for tokens meant for `resource` (this server's
    /// canonical URL, the audience its tokens must name), accepting `leeway` of clock difference
    /// and fetching the keys again as `refresh` says. Fails when the authorization server cannot
    /// be reached or its metadata does not hold.
    pub async fn discover(
        issuer: &str,
        resource: &str,
        leeway: Duration,
        refresh: KeyRefresh,
    ) -> anyhow::Result<Self> {
        let resource = resource.trim_end_matches('/').to_owned();
        let resource_url = reqwest::Url::parse(&resource)
            .with_context(|| format!("--resource-url {resource:?} is not an absolute URL"))?;
        anyhow::ensure!(
            matches!(resource_url.scheme(), "http" | "https") && resource_url.fragment().is_none(),
            "--resource-url must be an http(s) URL without a fragment"
        );
        let origin = resource_url.origin().ascii_serialization();
        let path = resource_url.path().trim_end_matches('/').to_owned();
        let mut metadata_paths = vec![WELL_KNOWN.to_owned()];
        if !path.is_empty() {
            metadata_paths.push(format!("{WELL_KNOWN}{path}"));
        }
        let metadata_url = format!("{origin}{}", metadata_paths[metadata_paths.len() - 1]);
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(same_origin_redirects())
            .build()
            .context("setting up the HTTP client for the authorization server")?;
        let (issuer, jwks_uri) = discover_jwks_uri(&http, issuer).await?;
        secure_url(&jwks_uri, "the authorization server's jwks_uri")?;
        let keys = fetch_keys(&http, &jwks_uri).await?;
        tracing::info!(
            %issuer,
            %resource,
            keys = keys.values().map(Vec::len).sum::<usize>(),
            "sign-in: access tokens of the authorization server, for this resource"
        );
        Ok(Self {
            issuer,
            resource,
            metadata_url,
            metadata_paths,
            jwks_uri,
            http,
            leeway,
            refresh,
            keys: RwLock::new(KeySet {
                keys,
                fetched: Instant::now(),
            }),
            last_refresh: tokio::sync::Mutex::new(Instant::now()),
        })
    }

    /// The Protected Resource Metadata document (RFC 9728).
    pub fn metadata(&self) -> Value {
        json!({
            "resource": self.resource,
            "authorization_servers": [self.issuer],
            "scopes_supported": SCOPES,
            "bearer_methods_supported": ["header"],
            "resource_name": "moviedb-mcp",
        })
    }

    /// `GET` of the metadata at the root well-known path and at the one suffixed with the
    /// endpoint's path, readable from any origin (a browser-based client reads it before it has
    /// anything to sign in with; it holds nothing private).
    pub fn routes(self: &Arc<Self>) -> Router {
        let mut router = Router::new();
        for path in &self.metadata_paths {
            let server = self.clone();
            router = router.route(
                path,
                get(move || {
                    let document = server.metadata();
                    async move { axum::Json(document) }
                }),
            );
        }
        router.layer(
            CorsLayer::new()
                .allow_origin(Any)
                .allow_methods([axum::http::Method::GET])
                .allow_headers(Any),
        )
    }

    /// The challenge of a 401: where the metadata is, the scope to start with, and the error if a
    /// token was sent.
    fn challenge(&self, error: Option<&str>) -> String {
        let mut challenge = format!(
            "Bearer resource_metadata=\"{}\", scope=\"{READ_SCOPE}\"",
            self.metadata_url
        );
        if let Some(description) = error {
            challenge.push_str(&format!(
                ", error=\"invalid_token\", error_description=\"{}\"",
                description.replace(['"', '\\'], "'")
            ));
        }
        challenge
    }

    fn refuse(&self, reason: &str) -> AuthError {
        AuthError::new(reason).with_challenge(self.challenge(Some(reason)))
    }

    /// The keys for `kid` that sign with `alg`, fetching the keys again first when they are past
    /// their most age, or after when `kid` is unknown (in both cases only when the last fetch is
    /// old enough); for a `kid` still unknown then, the keys published without an id.
    async fn keys_for(&self, kid: &str, alg: Algorithm) -> Vec<DecodingKey> {
        // Old keys are fetched again by one request; the others, meanwhile, go on with them
        // rather than wait for an authorization server that may be slow or away.
        if self.fetched_at().elapsed() >= self.refresh.most_age
            && let Ok(last) = self.last_refresh.try_lock()
            && self.fetched_at().elapsed() >= self.refresh.most_age
        {
            self.fetch_again(last, "the keys were past their most age")
                .await;
        }
        let known = self.lookup(kid, alg);
        if !known.is_empty() {
            return known;
        }
        // In a key set that names none of its keys, a token's key id is no sign of a rotation:
        // its keys are tried without a fetch, and without waiting for one.
        if let Some(unnamed) = self.all_unnamed(alg) {
            return unnamed;
        }
        let last = self.last_refresh.lock().await;
        let known = self.lookup(kid, alg);
        if !known.is_empty() {
            return known;
        }
        self.fetch_again(last, "unknown key id").await;
        let known = self.lookup(kid, alg);
        // A key id is optional in a key set and only a hint in a token: a token naming a key the
        // authorization server publishes without an id is checked with those keys.
        if known.is_empty() && !kid.is_empty() {
            return self.unnamed(alg);
        }
        known
    }

    fn fetched_at(&self) -> Instant {
        self.keys.read().unwrap_or_else(|p| p.into_inner()).fetched
    }

    /// Fetches the keys again, unless the last fetch (held in `last`) was too recent. Keys that
    /// cannot be fetched are kept as they are, and tried again after the interval.
    async fn fetch_again(&self, mut last: tokio::sync::MutexGuard<'_, Instant>, why: &str) {
        if last.elapsed() < self.refresh.least_between {
            return;
        }
        *last = Instant::now();
        match fetch_keys(&self.http, &self.jwks_uri).await {
            Ok(keys) => {
                tracing::info!("fetched the authorization server's keys again ({why})");
                *self.keys.write().unwrap_or_else(|p| p.into_inner()) = KeySet {
                    keys,
                    fetched: Instant::now(),
                };
            }
            Err(e) => tracing::warn!("cannot fetch the authorization server's keys ({why}): {e:#}"),
        }
    }

    /// The published keys that sign with `alg`: those named `kid`, or all of them for a token
    /// naming no key.
    fn lookup(&self, kid: &str, alg: Algorithm) -> Vec<DecodingKey> {
        let set = self.keys.read().unwrap_or_else(|p| p.into_inner());
        let keys = &set.keys;
        let candidates: Box<dyn Iterator<Item = &Vec<(Algorithm, DecodingKey)>>> = if kid.is_empty()
        {
            Box::new(keys.values())
        } else {
            Box::new(keys.get(kid).into_iter())
        };
        signing_with(candidates, alg)
    }

    /// The keys published without a key id that sign with `alg`.
    fn unnamed(&self, alg: Algorithm) -> Vec<DecodingKey> {
        let set = self.keys.read().unwrap_or_else(|p| p.into_inner());
        signing_with(set.keys.get("").into_iter(), alg)
    }

    /// [`Self::unnamed`] when no published key has an id.
    fn all_unnamed(&self, alg: Algorithm) -> Option<Vec<DecodingKey>> {
        let set = self.keys.read().unwrap_or_else(|p| p.into_inner());
        let unnamed = set.keys.get("")?;
        (set.keys.len() == 1).then(|| signing_with(std::iter::once(unnamed), alg))
    }
}

/// The keys among `candidates` that sign with `alg`.
fn signing_with<'a>(
    candidates: impl Iterator<Item = &'a Vec<(Algorithm, DecodingKey)>>,
    alg: Algorithm,
) -> Vec<DecodingKey> {
    candidates
        .flatten()
        .filter(|(signs, _)| *signs == alg)
        .map(|(_, key)| key.clone())
        .collect()
}

#[async_trait::async_trait]
impl Authenticator for ResourceServer {
    async fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, AuthError> {
        let token = match bearer_token(headers) {
            Ok(Some(token)) => token,
            Ok(None) => {
                return Err(AuthError::new("this server needs a bearer access token")
                    .with_challenge(self.challenge(None)));
            }
            Err(e) => return Err(self.refuse(&e.reason)),
        };
        let header = jsonwebtoken::decode_header(token)
            .map_err(|_| self.refuse("the token is not a signed JWT"))?;
        if !matches!(
            header.alg,
            Algorithm::RS256 | Algorithm::ES256 | Algorithm::EdDSA
        ) {
            return Err(self.refuse("the token is signed with an algorithm this server refuses"));
        }
        let kid = header.kid.as_deref().unwrap_or_default();
        let keys = self.keys_for(kid, header.alg).await;
        if keys.is_empty() {
            return Err(self.refuse(
                "the token is signed with a key the authorization server does not publish",
            ));
        }
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.resource]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.validate_nbf = true;
        validation.leeway = self.leeway.as_secs();
        let mut last_error = None;
        for key in &keys {
            match jsonwebtoken::decode::<Claims>(token, key, &validation) {
                Ok(data) => {
                    if let Some(refusal) = super::user_name_refusal(&data.claims.sub) {
                        return Err(self.refuse(&format!("the token's subject {refusal}")));
                    }
                    let scopes = data.claims.scopes();
                    let caller = Caller {
                        principal: Principal::User(data.claims.sub),
                        scopes: Some(scopes),
                        valid_until: None,
                    };
                    let exp = whole_seconds(data.claims.exp);
                    return Ok(super::expiring(caller, exp, self.leeway.as_secs()));
                }
                Err(e) => last_error = Some(e),
            }
        }
        let reason = match last_error.as_ref().map(jsonwebtoken::errors::Error::kind) {
            Some(jsonwebtoken::errors::ErrorKind::ExpiredSignature) => "the token has expired",
            Some(jsonwebtoken::errors::ErrorKind::ImmatureSignature) => {
                "the token is not valid yet"
            }
            Some(jsonwebtoken::errors::ErrorKind::InvalidAudience) => {
                "the token was not issued for this server (audience)"
            }
            Some(jsonwebtoken::errors::ErrorKind::InvalidIssuer) => {
                "the token was not issued by this server's authorization server"
            }
            Some(jsonwebtoken::errors::ErrorKind::InvalidSignature) => {
                "the token's signature does not verify"
            }
            _ => "the token is not valid",
        };
        Err(self.refuse(reason))
    }

    fn insufficient_scope(&self, scope: &str) -> String {
        format!(
            "Bearer error=\"insufficient_scope\", scope=\"{scope}\", resource_metadata=\"{}\", \
             error_description=\"this needs the {scope} scope\"",
            self.metadata_url
        )
    }
}

/// The authorization server's issuer and `jwks_uri`, from its metadata: RFC 8414 first, then
/// OpenID Connect Discovery, at the well-known URLs the MCP spec lists, in its order. A document
/// is used only when its `issuer` is `issuer` (a final `/` aside: operators write issuers both
/// ways); the issuer returned is the document's, the one its tokens name, character for
/// character.
async fn discover_jwks_uri(
    http: &reqwest::Client,
    issuer: &str,
) -> anyhow::Result<(String, String)> {
    let url = secure_url(issuer, "--auth-issuer")?;
    let without_slash = |issuer: &'_ str| issuer.strip_suffix('/').unwrap_or(issuer).to_owned();
    let wanted = without_slash(issuer);
    let origin = url.origin().ascii_serialization();
    let path = url.path().trim_end_matches('/');
    let candidates = if path.is_empty() {
        vec![
            format!("{origin}/.well-known/oauth-authorization-server"),
            format!("{origin}/.well-known/openid-configuration"),
        ]
    } else {
        vec![
            format!("{origin}/.well-known/oauth-authorization-server{path}"),
            format!("{origin}/.well-known/openid-configuration{path}"),
            format!("{origin}{path}/.well-known/openid-configuration"),
        ]
    };
    let mut tried = Vec::new();
    for candidate in candidates {
        let document = match fetch_json(http, &candidate).await {
            Ok(document) => document,
            Err(e) => {
                tried.push(format!("{candidate}: {e:#}"));
                continue;
            }
        };
        let Some(named) = document["issuer"]
            .as_str()
            .filter(|named| without_slash(named) == wanted)
        else {
            tried.push(format!("{candidate}: its issuer is not {issuer}"));
            continue;
        };
        let jwks_uri = document["jwks_uri"]
            .as_str()
            .with_context(|| format!("{candidate} names no jwks_uri"))?;
        return Ok((named.to_owned(), jwks_uri.to_owned()));
    }
    anyhow::bail!(
        "no metadata of the authorization server {issuer}: {}",
        tried.join("; ")
    )
}

/// `url` parsed, if it is an absolute `https` URL, or an `http` one on a loopback host (a
/// development or test authorization server): the spec has every authorization server endpoint
/// served over HTTPS, and keys fetched in the clear could be swapped for anyone's.
fn secure_url(url: &str, what: &str) -> anyhow::Result<reqwest::Url> {
    let parsed = reqwest::Url::parse(url)
        .with_context(|| format!("{what} {url:?} is not an absolute URL"))?;
    let loopback = parsed.host_str().is_some_and(|host| {
        host.eq_ignore_ascii_case("localhost")
            || host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    });
    match parsed.scheme() {
        "https" => Ok(parsed),
        "http" if loopback => Ok(parsed),
        _ => anyhow::bail!("{what} {url:?} must be an https URL (http only on a loopback host)"),
    }
}

/// Redirects within the origin asked, at most a few: the metadata and keys must come from the
/// authorization server itself, not from wherever a redirect points.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if !same_origin {
            let to = attempt.url().origin().ascii_serialization();
            attempt.error(format!("redirected to another origin ({to})"))
        } else if attempt.previous().len() > 5 {
            attempt.error("too many redirects")
        } else {
            attempt.follow()
        }
    })
}

/// The JSON document at `url`, read up to [`MOST_FETCHED_BYTES`].
async fn fetch_json(http: &reqwest::Client, url: &str) -> anyhow::Result<Value> {
    let mut response = http.get(url).send().await?.error_for_status()?;
    let body = read_at_most(&mut response, MOST_FETCHED_BYTES)
        .await?
        .with_context(|| format!("the document is larger than {MOST_FETCHED_BYTES} bytes"))?;
    Ok(serde_json::from_slice(&body)?)
}

/// The keys at `jwks_uri` this server can verify with, each with the algorithm it signs with.
async fn fetch_keys(http: &reqwest::Client, jwks_uri: &str) -> anyhow::Result<Keys> {
    let document = fetch_json(http, jwks_uri)
        .await
        .with_context(|| format!("fetching the keys at {jwks_uri}"))?;
    let set: JwkSet = serde_json::from_value(document)
        .with_context(|| format!("reading the keys at {jwks_uri}"))?;
    let mut keys: Keys = HashMap::new();
    for jwk in &set.keys {
        let Some(alg) = signing_algorithm(jwk) else {
            continue;
        };
        let Ok(key) = DecodingKey::from_jwk(jwk) else {
            continue;
        };
        let kid = jwk.common.key_id.clone().unwrap_or_default();
        keys.entry(kid).or_default().push((alg, key));
    }
    Ok(keys)
}

/// The algorithm a published key signs with, among those this server accepts; `None` for an
/// encryption key or another algorithm.
fn signing_algorithm(jwk: &Jwk) -> Option<Algorithm> {
    if jwk
        .common
        .public_key_use
        .as_ref()
        .is_some_and(|usage| *usage != jsonwebtoken::jwk::PublicKeyUse::Signature)
    {
        return None;
    }
    let by_type = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(ec) if ec.curve == EllipticCurve::P256 => {
            Algorithm::ES256
        }
        AlgorithmParameters::OctetKeyPair(_) => Algorithm::EdDSA,
        _ => return None,
    };
    match jwk.common.key_algorithm {
        None => Some(by_type),
        Some(declared) => {
            let declared = format!("{declared:?}");
            (declared == format!("{by_type:?}")).then_some(by_type)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scopes_of(claims: Value) -> Vec<String> {
        let mut claims = claims;
        claims["exp"] = json!(2_000_000_000);
        serde_json::from_value::<Claims>(claims)
            .expect("claims that parse")
            .scopes()
    }

    #[test]
    fn scopes_are_read_spaced_or_listed_from_scope_or_scp() {
        let both = [READ_SCOPE.to_owned(), WRITE_SCOPE.to_owned()];
        let spaced = format!("{READ_SCOPE} {WRITE_SCOPE}");
        assert_eq!(scopes_of(json!({"sub": "ann", "scope": spaced})), both);
        assert_eq!(scopes_of(json!({"sub": "ann", "scope": both})), both);
        assert_eq!(scopes_of(json!({"sub": "ann", "scp": both})), both);
        assert_eq!(scopes_of(json!({"sub": "ann", "scp": spaced})), both);
        // `scope` wins over `scp` when a token carries both.
        assert_eq!(
            scopes_of(json!({"sub": "ann", "scope": READ_SCOPE, "scp": both})),
            [READ_SCOPE]
        );
        assert!(scopes_of(json!({"sub": "ann"})).is_empty());
        let numeric = json!({"sub": "ann", "exp": 2_000_000_000, "scope": 7});
        assert!(serde_json::from_value::<Claims>(numeric).is_err());
        // An odd `scp` beside a good `scope` is not read; alone, it grants nothing.
        assert_eq!(
            scopes_of(json!({"sub": "ann", "scope": READ_SCOPE, "scp": [1]})),
            [READ_SCOPE]
        );
        assert!(scopes_of(json!({"sub": "ann", "scp": 7})).is_empty());
        // An expiry with a fraction of a second, as RFC 7519 allows, counts to the nearest
        // second, as the decoder counts it.
        let fractional = json!({"sub": "ann", "exp": 2_000_000_000.5});
        let claims = serde_json::from_value::<Claims>(fractional).expect("a fractional exp");
        assert_eq!(whole_seconds(claims.exp), 2_000_000_001);
        assert_eq!(whole_seconds(1_000.4), 1_000);
    }
}
