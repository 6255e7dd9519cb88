//! DNS-rebinding protection: the `Origin` header must name an allowed origin (localhost by default,
//! plus a configured allow-list), and when serving on loopback the host the request names must be
//! local too: its `Host` header and the authority its URI carries, if any (HTTP/2's `:authority`,
//! as HTTP/2 has no `Host` header of its own, or an HTTP/1 request line in absolute form,
//! `POST http://host/mcp`).

use axum::http::{HeaderMap, Uri, header};

use crate::protocol::error::excerpt;

/// Which browser origins may call the endpoint; requests from others are refused with 403.
#[derive(Debug, Clone, Default)]
pub struct OriginPolicy {
    /// Full origins (`https://app.example.com`) or `*` for any.
    allowed: Vec<String>,
    /// Check the host the request names as well (on when the server listens on loopback only).
    check_host: bool,
}

impl OriginPolicy {
    /// Allows localhost origins plus `allowed` (surrounding spaces and a trailing `/` ignored,
    /// empty entries skipped, `*` for any), and checks the host a request names (`Host`, or the
    /// URI's authority) too when `check_host` is set.
    pub fn new(allowed: Vec<String>, check_host: bool) -> Self {
        Self {
            allowed: allowed
                .iter()
                .map(|o| o.trim().trim_end_matches('/'))
                .filter(|o| !o.is_empty())
                .map(str::to_owned)
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

    /// `Err` with a reason when the request to `uri` with `headers` must be refused with 403.
    pub fn check(&self, uri: &Uri, headers: &HeaderMap) -> Result<(), String> {
        if let Some(origin) = headers.get(header::ORIGIN) {
            let origin = origin
                .to_str()
                .map_err(|_| "Origin header is not valid text".to_owned())?;
            if !self.allows_origin(origin) {
                let origin = origin.trim_end_matches('/');
                return Err(format!("Origin {} is not allowed", excerpt(origin)));
            }
        }
        if !self.check_host {
            return Ok(());
        }
        if let Some(host) = headers.get(header::HOST) {
            let host = host
                .to_str()
                .map_err(|_| "Host header is not valid text".to_owned())?;
            self.allows_host(host)?;
        }
        // Both are checked when both come: a client may send a `Host` header over HTTP/2 too.
        if let Some(authority) = uri.authority() {
            let host = authority.as_str();
            self.allows_host(host.rsplit_once('@').map_or(host, |(_, host)| host))?;
        }
        Ok(())
    }

    /// `Err` unless `host` (`host[:port]`) is this machine or the authority of an allowed origin.
    fn allows_host(&self, host: &str) -> Result<(), String> {
        let listed = self
            .allowed
            .iter()
            .any(|a| a == "*" || a.split_once("://").is_some_and(|(_, auth)| auth == host));
        if is_local(host) || listed {
            Ok(())
        } else {
            Err(format!("Host {} is not allowed", excerpt(host)))
        }
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

    fn path() -> Uri {
        Uri::from_static("/mcp")
    }

    #[test]
    fn a_list_written_with_spaces_allows_each_origin_it_names() {
        // As `--allowed-origins "https://a.example, https://b.example/,"` gives it.
        let listed = ["https://a.example", " https://b.example/", ""].map(String::from);
        let policy = OriginPolicy::new(listed.to_vec(), true);
        for (origin, host) in [
            ("https://a.example", "a.example"),
            ("https://b.example", "b.example"),
        ] {
            let allowed = policy.check(&path(), &headers(&[("origin", origin), ("host", host)]));
            assert!(allowed.is_ok(), "{origin}: {allowed:?}");
        }
        let foreign = headers(&[("origin", "https://c.example"), ("host", "localhost")]);
        assert!(policy.check(&path(), &foreign).is_err());
        assert_eq!(policy.allowed.len(), 2, "the empty entry is skipped");
    }

    #[test]
    fn local_origins_pass_and_foreign_ones_do_not() {
        let policy = OriginPolicy::new(vec!["https://app.example.com".into()], true);
        assert!(
            policy
                .check(
                    &path(),
                    &headers(&[
                        ("origin", "http://localhost:3000"),
                        ("host", "localhost:3000")
                    ])
                )
                .is_ok()
        );
        assert!(
            policy
                .check(
                    &path(),
                    &headers(&[("origin", "http://[::1]:8080"), ("host", "[::1]:8080")])
                )
                .is_ok()
        );
        assert!(
            policy
                .check(&path(), &headers(&[("host", "127.0.0.1:1")]))
                .is_ok()
        );
        assert!(
            policy
                .check(
                    &path(),
                    &headers(&[("origin", "https://app.example.com"), ("host", "localhost")])
                )
                .is_ok()
        );
        assert!(
            policy
                .check(
                    &path(),
                    &headers(&[("origin", "http://evil.example.com"), ("host", "localhost")])
                )
                .is_err()
        );
        assert!(
            policy
                .check(&path(), &headers(&[("host", "evil.example.com")]))
                .is_err()
        );
        // HTTP/2 names the host in the URI's authority, and has no `Host` header of its own.
        let h2 = |uri: &'static str| Uri::from_static(uri);
        assert!(
            policy
                .check(&h2("http://localhost:3000/mcp"), &HeaderMap::new())
                .is_ok()
        );
        assert!(
            policy
                .check(&h2("http://evil.example.com:3000/mcp"), &HeaderMap::new())
                .is_err()
        );
        assert!(
            policy
                .check(
                    &h2("http://evil.example.com/mcp"),
                    &headers(&[("host", "localhost")])
                )
                .is_err()
        );
        // The host comes after any user information in the authority.
        assert!(
            policy
                .check(
                    &h2("http://localhost@evil.example.com/mcp"),
                    &HeaderMap::new()
                )
                .is_err()
        );
        assert!(
            policy
                .check(&h2("http://someone@localhost:3000/mcp"), &HeaderMap::new())
                .is_ok()
        );
        let open = OriginPolicy::new(vec![], false);
        assert!(
            open.check(&path(), &headers(&[("host", "mcp.example.com")]))
                .is_ok()
        );
    }
}
