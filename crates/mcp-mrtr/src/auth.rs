//! Who is calling: the principal the transport resolves for each request, and the pluggable
//! authenticator that resolves it.

use axum::http::HeaderMap;

/// The caller of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// No credentials were presented, or the authenticator does not distinguish callers.
    Anonymous,
    /// An authenticated user, by the name the authenticator gave them.
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

    /// The user's name, or `None` for an anonymous caller.
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
    /// The caller named by `headers`, or an [`AuthError`] to refuse the request with HTTP 401.
    fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, AuthError>;
}

/// Treats every request as anonymous.
pub struct AnonymousOnly;

impl Authenticator for AnonymousOnly {
    fn authenticate(&self, _: &HeaderMap) -> Result<Principal, AuthError> {
        Ok(Principal::Anonymous)
    }
}
