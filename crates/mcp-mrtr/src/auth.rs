//! Who is calling: the principal the transport resolves for each request, and the pluggable
//! authenticator that resolves it.

use axum::http::HeaderMap;

/// The caller of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Anonymous,
    User(String),
}

impl Principal {
    /// A stable identifier, used to bind request states to their caller.
    pub fn id(&self) -> String {
        match self {
            Self::Anonymous => "anonymous".to_owned(),
            Self::User(name) => format!("user:{name}"),
        }
    }

    pub fn user(&self) -> Option<&str> {
        match self {
            Self::Anonymous => None,
            Self::User(name) => Some(name),
        }
    }
}

/// Why a request's credentials were refused (sent as HTTP 401).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct AuthError(pub String);

/// Resolves the principal of a request from its HTTP headers.
pub trait Authenticator: Send + Sync + 'static {
    fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, AuthError>;
}

/// Treats every request as anonymous.
pub struct AnonymousOnly;

impl Authenticator for AnonymousOnly {
    fn authenticate(&self, _: &HeaderMap) -> Result<Principal, AuthError> {
        Ok(Principal::Anonymous)
    }
}
