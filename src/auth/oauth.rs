//! Resource-server mode: the MCP server as an OAuth 2.1 resource server, as the 2026-07-28
//! authorization spec makes it.
//!
//! - It publishes its Protected Resource Metadata (RFC 9728) at
//!   `/.well-known/oauth-protected-resource` and at the path-suffixed form for its endpoint,
//!   naming its one authorization server and the scopes it knows.
//! - It verifies access tokens (JWTs) against the keys the authorization server publishes (found
//!   through its RFC 8414 or OpenID Connect metadata): the signature (RS256, ES256 or EdDSA; never
//!   `none` or a shared-secret algorithm), the issuer, the audience (this server's resource URL,
//!   RFC 8707, with or without a final `/`), and `exp`/`nbf` within a small leeway. The
//!   principal is the token's `sub`. Its `typ` header is not required to be RFC 9068's
//!   `at+jwt` (several authorization servers write `JWT`): the audience is what keeps an ID
//!   token or a token for another resource out.
//! - The keys are held by [`super::keys`]: fetched again for a token naming a key id they do not
//!   hold, at most once per refresh interval, and in the background once they are old.
//! - A request without a token, or with one that fails, gets 401 with a `WWW-Authenticate`
//!   challenge pointing at the metadata; a token without a tool's scope gets 403 naming it.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::http::HeaderMap;
use axum::routing::get;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::{Value, json};
use tower_http::cors::{Any, CorsLayer};

use super::keys::{KeyRefresh, KeySource, fetch_json};
use super::{
    AuthError, Authenticator, Caller, Principal, READ_SCOPE, WRITE_SCOPE, bearer_token,
    names_another_scheme,
};

/// The longest a fetch from the authorization server may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The scopes this server knows, as its metadata lists them.
const SCOPES: [&str; 2] = [READ_SCOPE, WRITE_SCOPE];
const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

/// The resource server (see the module docs).
pub struct ResourceServer {
    issuer: String,
    resource: String,
    /// The audiences a token may name (see [`Resource::parse`]).
    audiences: Vec<String>,
    metadata_url: String,
    metadata_paths: Vec<String>,
    leeway: Duration,
    keys: Arc<KeySource>,
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

/// The token's claims as the first of `keys` that verifies it reads them, or why not: what
/// was wrong with its claims under a key that verified its signature, else a key's error
/// (`None` with no key).
fn verify(
    token: &str,
    keys: &[DecodingKey],
    validation: &Validation,
) -> Result<Claims, Option<jsonwebtoken::errors::Error>> {
    let mut refusal: Option<jsonwebtoken::errors::Error> = None;
    for key in keys {
        match jsonwebtoken::decode::<Claims>(token, key, validation) {
            Ok(data) => return Ok(data.claims),
            Err(e) if refusal.is_none() || about_claims(e.kind()) => refusal = Some(e),
            Err(_) => {}
        }
    }
    Err(refusal)
}

/// Whether a token was refused for its claims, which are read once its signature verified.
fn about_claims(kind: &ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::ExpiredSignature
            | ErrorKind::ImmatureSignature
            | ErrorKind::InvalidAudience
            | ErrorKind::InvalidIssuer
            | ErrorKind::InvalidSubject
            | ErrorKind::MissingRequiredClaim(_)
            | ErrorKind::InvalidClaimFormat(_)
            | ErrorKind::Json(_)
    )
}

/// An `exp` with a fraction of a second taken to the nearest second, as the decoder takes it.
fn whole_seconds(exp: f64) -> i64 {
    exp.round() as i64
}

/// A scope claim as authorization servers write it.
#[derive(Deserialize)]
#[serde(untagged)]
enum ScopeClaim {
    Spaced(String),
    Listed(Vec<String>),
}

/// The scopes a token grants: its `scope`, else its `scp` (none if that is neither a string nor
/// a list of strings), else none.
fn granted_scopes(scope: Option<ScopeClaim>, scp: Option<Value>) -> Vec<String> {
    let scp = || scp.and_then(|scp| serde_json::from_value::<ScopeClaim>(scp).ok());
    match scope.or_else(scp) {
        Some(ScopeClaim::Spaced(spaced)) => spaced.split_whitespace().map(str::to_owned).collect(),
        Some(ScopeClaim::Listed(listed)) => listed
            .iter()
            .flat_map(|scope| scope.split_whitespace())
            .map(str::to_owned)
            .collect(),
        None => Vec::new(),
    }
}

/// This server as a protected resource: what `--resource-url` names, read once.
#[derive(Debug, PartialEq)]
struct Resource {
    /// The URL in its normal form (scheme and host in lower case, no default port, no final
    /// `/`), as the metadata publishes it and as clients, which normalize the URL they are
    /// given, ask tokens for.
    identifier: String,
    /// The audiences a token may name: the identifier, and the URL as it was typed, each with and
    /// without a final `/` (clients and authorization servers write it both ways).
    audiences: Vec<String>,
    /// Where the 401's challenge points: the metadata at the path-suffixed well-known URL.
    metadata_url: String,
    /// The paths the metadata is served at: the root well-known path, and the path-suffixed one
    /// when the resource has a path.
    metadata_paths: Vec<String>,
}

impl Resource {
    /// Reads `--resource-url`: an https URL (http only on a loopback host, as for the
    /// authorization server), with no query or fragment (RFC 8707's resource indicator, which
    /// RFC 9728's metadata derives its location from).
    fn parse(typed: &str) -> anyhow::Result<Self> {
        let url = secure_url(typed, "--resource-url")?;
        anyhow::ensure!(
            url.query().is_none() && url.fragment().is_none(),
            "--resource-url {typed:?} must not carry a query or a fragment"
        );
        // The metadata is public: a user name or password in it would be published.
        anyhow::ensure!(
            url.username().is_empty() && url.password().is_none(),
            "--resource-url must not carry a user name or password"
        );
        let identifier = url.as_str().trim_end_matches('/').to_owned();
        let typed = typed.trim_end_matches('/');
        let mut audiences = vec![identifier.clone(), format!("{identifier}/")];
        if typed != identifier {
            audiences.extend([typed.to_owned(), format!("{typed}/")]);
        }
        let path = url.path().trim_end_matches('/');
        let mut metadata_paths = vec![WELL_KNOWN.to_owned()];
        if !path.is_empty() {
            metadata_paths.push(format!("{WELL_KNOWN}{path}"));
        }
        let metadata_url = format!(
            "{}{}",
            url.origin().ascii_serialization(),
            metadata_paths[metadata_paths.len() - 1]
        );
        Ok(Self {
            identifier,
            audiences,
            metadata_url,
            metadata_paths,
        })
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
        let Resource {
            identifier: resource,
            audiences,
            metadata_url,
            metadata_paths,
        } = Resource::parse(resource)?;
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(same_origin_redirects())
            .build()
            .context("setting up the HTTP client for the authorization server")?;
        let (issuer, jwks_uri) = discover_jwks_uri(&http, issuer).await?;
        secure_url(&jwks_uri, "the authorization server's jwks_uri")?;
        let keys = KeySource::fetch(http, jwks_uri, refresh).await?;
        tracing::info!(
            %issuer,
            %resource,
            keys = keys.count(),
            "sign-in: access tokens of the authorization server, for this resource"
        );
        Ok(Self {
            issuer,
            audiences,
            resource,
            metadata_url,
            metadata_paths,
            leeway,
            keys,
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
            Err(e) if names_another_scheme(headers) => {
                return Err(AuthError::new(e.reason).with_challenge(self.challenge(None)));
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
        let asked = std::time::Instant::now();
        let keys = self.keys.for_token(kid, header.alg).await;
        if keys.is_empty() {
            return Err(self.refuse(
                "the token is signed with a key the authorization server does not publish",
            ));
        }
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&self.audiences);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.validate_nbf = true;
        validation.leeway = self.leeway.as_secs();
        let mut verified = verify(token, &keys, &validation);
        if let Err(Some(e)) = &verified
            && matches!(e.kind(), ErrorKind::InvalidSignature)
            && let Some(renewed) = self
                .keys
                .after_failed_signature(kid, header.alg, asked)
                .await
        {
            verified = verify(token, &renewed, &validation);
        }
        let refusal = match verified {
            Ok(Claims {
                sub,
                exp,
                scope,
                scp,
            }) => {
                if let Some(refusal) = super::user_name_refusal(&sub) {
                    return Err(self.refuse(&format!("the token's subject {refusal}")));
                }
                let caller = Caller {
                    principal: Principal::User(sub),
                    scopes: Some(granted_scopes(scope, scp)),
                    valid_until: None,
                };
                let exp = whole_seconds(exp);
                return Ok(super::expiring(caller, exp, self.leeway.as_secs()));
            }
            Err(refusal) => refusal,
        };
        let reason = match refusal.as_ref().map(jsonwebtoken::errors::Error::kind) {
            Some(ErrorKind::ExpiredSignature) => "the token has expired",
            Some(ErrorKind::ImmatureSignature) => "the token is not valid yet",
            Some(ErrorKind::InvalidAudience) => {
                "the token was not issued for this server (audience)"
            }
            Some(ErrorKind::InvalidIssuer) => {
                "the token was not issued by this server's authorization server"
            }
            Some(ErrorKind::InvalidSignature) => "the token's signature does not verify",
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
    match parsed.scheme() {
        "https" => Ok(parsed),
        "http" if crate::config::names_loopback(&parsed) => Ok(parsed),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resource_url_is_published_in_its_normal_form_and_accepted_as_typed() {
        let typed = Resource::parse("HTTPS://Movies.Example.com:443/mcp/").expect("a resource");
        assert_eq!(typed.identifier, "https://movies.example.com/mcp");
        assert_eq!(
            typed.audiences,
            [
                "https://movies.example.com/mcp",
                "https://movies.example.com/mcp/",
                "HTTPS://Movies.Example.com:443/mcp",
                "HTTPS://Movies.Example.com:443/mcp/",
            ]
        );
        assert_eq!(
            typed.metadata_url,
            "https://movies.example.com/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            typed.metadata_paths,
            [
                "/.well-known/oauth-protected-resource",
                "/.well-known/oauth-protected-resource/mcp"
            ]
        );

        let root = Resource::parse("http://127.0.0.1:3000").expect("a resource on loopback");
        assert_eq!(root.identifier, "http://127.0.0.1:3000");
        assert_eq!(root.audiences.len(), 2, "typed as it is published");
        assert_eq!(
            root.metadata_paths,
            ["/.well-known/oauth-protected-resource"]
        );

        for (refused, why) in [
            ("http://movies.example.com/mcp", "must be an https URL"),
            (
                "https://movies.example.com/mcp?tenant=1",
                "must not carry a query",
            ),
            (
                "https://movies.example.com/mcp#top",
                "must not carry a query or a fragment",
            ),
            ("/mcp", "is not an absolute URL"),
            (
                "https://ann:secret@movies.example.com/mcp",
                "user name or password",
            ),
        ] {
            let error = Resource::parse(refused).expect_err(refused).to_string();
            assert!(
                error.contains(why) && error.contains("--resource-url"),
                "{refused}: {error}"
            );
        }
    }

    fn scopes_of(claims: Value) -> Vec<String> {
        let mut claims = claims;
        claims["exp"] = json!(2_000_000_000);
        let claims = serde_json::from_value::<Claims>(claims).expect("claims that parse");
        granted_scopes(claims.scope, claims.scp)
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

    #[test]
    fn a_refusal_says_what_was_wrong_with_the_claims_whichever_key_verified_the_signature() {
        let secret = |name: &str| format!("{name}-a-secret-long-enough-for-hs256");
        let sign = |name: &str, exp: i64| {
            let claims = serde_json::json!({"sub": "ann", "exp": exp});
            jsonwebtoken::encode(
                &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
                &claims,
                &jsonwebtoken::EncodingKey::from_secret(secret(name).as_bytes())
                    .expect("an HMAC key"),
            )
            .expect("a token")
        };
        let key =
            |name: &str| DecodingKey::from_secret(secret(name).as_bytes()).expect("an HMAC key");
        let validation = Validation::new(jsonwebtoken::Algorithm::HS256);
        let now = chrono::Utc::now().timestamp();
        let kind = |token: &str, keys: &[DecodingKey]| match verify(token, keys, &validation) {
            Ok(claims) => format!("accepted for {}", claims.sub),
            Err(Some(e)) => format!("{:?}", e.kind()),
            Err(None) => "no key".to_owned(),
        };

        let expired = sign("second", now - 3600);
        for keys in [[key("first"), key("second")], [key("second"), key("first")]] {
            assert_eq!(kind(&expired, &keys), "ExpiredSignature");
            assert_eq!(kind(&sign("second", now + 3600), &keys), "accepted for ann");
            assert_eq!(kind(&sign("third", now + 3600), &keys), "InvalidSignature");
        }
        assert_eq!(kind(&expired, &[]), "no key");
    }
}
