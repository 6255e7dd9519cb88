//! DNS-rebinding protection: the `Origin` header must name an allowed origin (localhost by default,
//! plus a configured allow-list), and when serving on loopback the `Host` header must be local too.

use axum::http::{HeaderMap, header};

use crate::protocol::error::excerpt;

/// Which browser origins may call the endpoint; requests from others are refused with 403.
#[derive(Debug, Clone, Default)]
pub struct OriginPolicy {
    /// Full origins (`https://app.example.com`) or `*` for any.
    allowed: Vec<String>,
    /// Check `Host` as well (on when the server listens on loopback only).
    check_host: bool,
}

impl OriginPolicy {
    /// Allows localhost origins plus `allowed` (trailing `/` ignored, `*` for any), and checks
    /// `Host` too when `check_host` is set.
    pub fn new(allowed: Vec<String>, check_host: bool) -> Self {
        Self {
            allowed: allowed
                .into_iter()
                .map(|o| o.trim_end_matches('/').to_owned())
                .collect(),
            check_host,
        }
    }

    /// Whether a browser page from `origin` (an `Origin` header's value) may call the endpoint.
    pub fn allows_origin(&self, origin: &str) -> bool {
        let origin = origin.trim_end_matches('/');
        self.allowed.iter().any(|a| a == "*" || a == origin)
            || origin
                .split_once("://")
                .is_some_and(|(_, authority)| is_local(authority))
    }

    /// `Err` with a reason when the request must be refused with 403.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), String> {
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin
                .to_str()
                .map_err(|_| "Origin header is not valid text".to_owned())?;
            if !self.allows_origin(origin) {
                let origin = origin.trim_end_matches('/');
                return Err(format!("Origin {} is not allowed", excerpt(origin)));
            }
        }
        if self.check_host
            && let Some(host) = headers.get(header::HOST)
        {
            let host = host
                .to_str()
                .map_err(|_| "Host header is not valid text".to_owned())?;
            let listed = self
                .allowed
                .iter()
                .any(|a| a == "*" || a.split_once("://").is_some_and(|(_, auth)| auth == host));
            if !is_local(host) && !listed {
                return Err(format!("Host {} is not allowed", excerpt(host)));
            }
        }
        Ok(())
    }
}

/// Whether an authority (`host[:port]`) names this machine.
fn is_local(authority: &str) -> bool {
    let host = if let Some(rest) = authority.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host)
    };
    ["localhost", "127.0.0.1", "::1"]
        .iter()
        .any(|local| host.eq_ignore_ascii_case(local))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn local_origins_pass_and_foreign_ones_do_not() {
        let policy = OriginPolicy::new(vec!["https://app.example.com".into()], true);
        assert!(
            policy
                .check(&headers(&[
                    ("origin", "http://localhost:3000"),
                    ("host", "localhost:3000")
                ]))
                .is_ok()
        );
        assert!(
            policy
                .check(&headers(&[
                    ("origin", "http://[::1]:8080"),
                    ("host", "[::1]:8080")
                ]))
                .is_ok()
        );
        assert!(policy.check(&headers(&[("host", "127.0.0.1:1")])).is_ok());
        assert!(
            policy
                .check(&headers(&[
                    ("origin", "https://app.example.com"),
                    ("host", "localhost")
                ]))
                .is_ok()
        );
        assert!(
            policy
                .check(&headers(&[
                    ("origin", "http://evil.example.com"),
                    ("host", "localhost")
                ]))
                .is_err()
        );
        assert!(
            policy
                .check(&headers(&[("host", "evil.example.com")]))
                .is_err()
        );
        let open = OriginPolicy::new(vec![], false);
        assert!(open.check(&headers(&[("host", "mcp.example.com")])).is_ok());
    }
}
