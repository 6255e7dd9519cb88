//! Sign-in for the movie server: HS256 JWTs minted by `moviedb-mcp token` and checked on every
//! request, on top of the library's principal and authenticator.

use axum::http::HeaderMap;
pub use mcp_mrtr::auth::{AnonymousOnly, AuthError, Authenticator, Principal};

/// Signed-in users by `Authorization: Bearer <JWT>` (HS256). No header means anonymous; a bad or
/// expired token is refused.
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

impl Authenticator for JwtAuthenticator {
    fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, AuthError> {
        let Some(value) = headers.get(axum::http::header::AUTHORIZATION) else {
            return Ok(Principal::Anonymous);
        };
        let value = value
            .to_str()
            .map_err(|_| AuthError("the Authorization header is not valid text".into()))?;
        let token = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
            .ok_or_else(|| AuthError("the Authorization header must be `Bearer <token>`".into()))?;
        let data = jsonwebtoken::decode::<Claims>(token.trim(), &self.key, &self.validation)
            .map_err(|e| AuthError(format!("invalid token: {e}")))?;
        if data.claims.sub.is_empty() {
            return Err(AuthError("invalid token: empty subject".into()));
        }
        Ok(Principal::User(data.claims.sub))
    }
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
