//! Sign-in for the movie server, in one of two modes on top of the library's caller and
//! authenticator:
//!
//! - development (no issuer configured): HS256 JWTs minted by `moviedb-mcp token` with a shared
//!   secret, checked here;
//! - resource server ([`oauth`]): access tokens of an OAuth 2.1 authorization server, discovered
//!   and verified as the MCP authorization spec says.

pub mod keys;
pub mod oauth;

use axum::http::HeaderMap;
pub use mcp_mrtr::auth::{AnonymousOnly, AuthError, Authenticator, Caller, Principal};

/// The scope of the tools that read (the catalogue, summaries, the user's own list).
pub const READ_SCOPE: &str = "movies:read";
/// The scope of `addToWatchlist`.
pub const WRITE_SCOPE: &str = "watchlist:write";

/// Longest user name a token's subject may carry, in bytes. User names are keys of the database
/// (PostgreSQL refuses index entries past about 2.7 KB); real subjects are far shorter.
pub const MOST_SUBJECT_BYTES: usize = 255;

/// Why `name` cannot name a user of this server, if it cannot ("is empty", "is longer than …",
/// "holds control characters": PostgreSQL refuses NUL in text, and line breaks could forge log
/// lines).
pub fn user_name_refusal(name: &str) -> Option<String> {
    if name.is_empty() {
        Some("is empty".into())
    } else if name.len() > MOST_SUBJECT_BYTES {
        Some(format!("is longer than {MOST_SUBJECT_BYTES} bytes"))
    } else if name.chars().any(char::is_control) {
        Some("holds control characters".into())
    } else {
        None
    }
}

/// Development sign-in: users by `Authorization: Bearer <JWT>` (HS256, the shared secret). No
/// header means anonymous; a bad or expired token is refused. Tokens carry no scopes.
pub struct JwtAuthenticator {
    key: jsonwebtoken::DecodingKey,
    validation: jsonwebtoken::Validation,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Claims {
    sub: String,
    iat: i64,
    exp: i64,
}

impl JwtAuthenticator {
    pub fn new(secret: &[u8]) -> anyhow::Result<Self> {
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
        validation.leeway = 5;
        Ok(Self {
            key: jsonwebtoken::DecodingKey::from_secret(secret)?,
            validation,
        })
    }
}

#[async_trait::async_trait]
impl Authenticator for JwtAuthenticator {
    async fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, AuthError> {
        let Some(token) = bearer_token(headers)? else {
            return Ok(Caller::unlimited(Principal::Anonymous));
        };
        let data = jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation)
            .map_err(|e| AuthError::new(format!("invalid token: {}", why_refused(&e))))?;
        if let Some(refusal) = user_name_refusal(&data.claims.sub) {
            return Err(AuthError::new(format!(
                "invalid token: its subject {refusal}"
            )));
        }
        let caller = Caller::unlimited(Principal::User(data.claims.sub));
        Ok(expiring(caller, data.claims.exp, self.validation.leeway))
    }
}

/// `caller`, whose token expiring at `exp` (Unix seconds) stops being accepted once the second
/// `leeway` seconds later is over (as the decoder counts); one expiring past what the clock can
/// tell is taken as not expiring.
fn expiring(caller: Caller, exp: i64, leeway: u64) -> Caller {
    let seconds = u64::try_from(exp)
        .unwrap_or(0)
        .saturating_add(leeway)
        .saturating_add(1);
    match std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(seconds)) {
        Some(at) => caller.expiring(at),
        None => caller,
    }
}

/// Why a development token was refused, in words of this server's own: the decoder's message
/// can quote the token (its header's `alg`, say), which the caller chose.
fn why_refused(error: &jsonwebtoken::errors::Error) -> &'static str {
    use jsonwebtoken::errors::ErrorKind;
    match error.kind() {
        ErrorKind::ExpiredSignature => "it has expired",
        ErrorKind::ImmatureSignature => "it is not valid yet",
        ErrorKind::InvalidSignature => "its signature does not verify",
        ErrorKind::InvalidAlgorithm => "it is not signed with HS256",
        ErrorKind::MissingRequiredClaim(_) => "it lacks a required claim",
        _ => "it is not a JWT signed by this server",
    }
}

/// The bearer token of `Authorization: Bearer <token>`; `None` without the header.
fn bearer_token(headers: &HeaderMap) -> Result<Option<&str>, AuthError> {
    let Some(value) = headers.get(axum::http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| AuthError::new("the Authorization header is not valid text"))?;
    let token = value
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|token| !token.is_empty())
        .ok_or_else(|| AuthError::new("the Authorization header must be `Bearer <token>`"))?;
    Ok(Some(token))
}

/// Whether `Authorization` carries credentials of a scheme other than Bearer (`Basic …`): to a
/// resource server that is no bearer token at all, answered without an error code (RFC 6750,
/// section 3).
fn names_another_scheme(headers: &HeaderMap) -> bool {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(' ').next())
        .is_some_and(|scheme| !scheme.is_empty() && !scheme.eq_ignore_ascii_case("bearer"))
}

/// Signs a token for `user`, valid for `ttl`.
pub fn mint_token(secret: &[u8], user: &str, ttl: std::time::Duration) -> anyhow::Result<String> {
    let now = chrono::Utc::now().timestamp();
    let claims = Claims {
        sub: user.to_owned(),
        iat: now,
        exp: now + ttl.as_secs() as i64,
    };
    Ok(jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret)?,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_good_until_the_second_after_its_leeway_or_for_ever_past_the_clock() {
        let user = || Caller::unlimited(Principal::User("ann".into()));
        let expected = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000 + 5 + 1);
        assert_eq!(expiring(user(), 1_000, 5).valid_until, Some(expected));
        assert_eq!(expiring(user(), i64::MAX, 300).valid_until, None);
    }
}
