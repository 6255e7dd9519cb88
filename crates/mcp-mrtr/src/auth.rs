//! Who is calling: the principal the transport resolves for each request, the scopes its
//! credentials grant, and the pluggable authenticator that resolves both.

use std::time::SystemTime;

use async_trait::async_trait;
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

/// The caller of one request as its credentials show it: who, and what they may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Who is calling.
    pub principal: Principal,
    /// The OAuth scopes the caller's token grants; `None` when its credentials are not limited
    /// by scopes (anonymous callers, development tokens).
    pub scopes: Option<Vec<String>>,
    /// When the caller's credentials stop being accepted (a token's expiry, leeway included);
    /// `None` when they do not expire. A long-lived stream they opened ends then.
    pub valid_until: Option<SystemTime>,
}

impl Caller {
    /// A caller whose credentials are not limited by scopes and do not expire.
    pub fn unlimited(principal: Principal) -> Self {
        Self {
            principal,
            scopes: None,
            valid_until: None,
        }
    }

    /// The same caller, whose credentials stop being accepted at `at`.
    pub fn expiring(mut self, at: SystemTime) -> Self {
        self.valid_until = Some(at);
        self
    }

    /// Whether the caller may do what `scope` stands for.
    pub fn may(&self, scope: &str) -> bool {
        self.scopes
            .as_ref()
            .is_none_or(|granted| granted.iter().any(|s| s == scope))
    }
}

/// Why a request's credentials were refused (sent as HTTP 401).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason}")]
pub struct AuthError {
    /// What was wrong, for the client and the log.
    pub reason: String,
    /// The whole `WWW-Authenticate` value to send; a plain `Bearer error="invalid_token"`
    /// challenge naming the reason when `None`.
    pub challenge: Option<String>,
}

impl AuthError {
    /// A refusal for `reason`, with the plain Bearer challenge.
    pub fn new(reason: impl Into<String>) -> Self {
        Self {
            reason: reason.into(),
            challenge: None,
        }
    }

    /// The same refusal, sent with `challenge` as its `WWW-Authenticate` value.
    pub fn with_challenge(mut self, challenge: String) -> Self {
        self.challenge = Some(challenge);
        self
    }
}

/// Resolves the caller of a request from its HTTP headers. It runs before the request's body is
/// read and before the request takes a turn among the concurrent requests, so that a refused
/// caller holds neither.
#[async_trait]
pub trait Authenticator: Send + Sync + 'static {
    /// The caller named by `headers`, or an [`AuthError`] to refuse the request with HTTP 401.
    async fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, AuthError>;

    /// The `WWW-Authenticate` value refusing, with HTTP 403, a caller whose token lacks `scope`.
    fn insufficient_scope(&self, scope: &str) -> String {
        format!("Bearer error=\"insufficient_scope\", scope=\"{scope}\"")
    }
}

/// Treats every request as anonymous.
pub struct AnonymousOnly;

#[async_trait]
impl Authenticator for AnonymousOnly {
    async fn authenticate(&self, _: &HeaderMap) -> Result<Caller, AuthError> {
        Ok(Caller::unlimited(Principal::Anonymous))
    }
}
