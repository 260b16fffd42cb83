//! Who may talk to the web UI: every request is checked before a handler
//! sees it.
//!
//! The UI listens on a loopback port by default, but loopback is not a
//! boundary for a browser: any page the user has open may send requests to
//! `http://localhost:8074`, and through DNS rebinding (a hostile name that
//! resolves to 127.0.0.1) may even read the answers. Two rules close that:
//! - **Host**: a request must name this server as `localhost`, `127.0.0.1`
//!   or `[::1]` (any port), or a name given with `--ui_allowed_host`. A
//!   rebinding page's requests carry its own name, so they are refused
//!   before they read anything.
//! - **Actions** (any method but GET and HEAD): the `Origin` header, if the
//!   browser sent one, must be this server's own origin, and the request
//!   must carry [`ACTION_HEADER`]. A browser sends a custom header to
//!   another origin only after a CORS preflight, which this server never
//!   approves; a form or `text/plain` POST from another page cannot carry
//!   it. The page itself and `refract savepoint` send it.
//!
//! Other users of the machine are kept off as on the server's other ports
//! ([`refract_peercred::PeerGate`], `--local_peers`): the UI shows job logs
//! and cancels jobs. Its connections are checked per request, since axum
//! accepts them itself.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The header every state-changing request must carry (any value).
pub const ACTION_HEADER: &str = "x-refract-action";

/// Host names the UI answers to.
#[derive(Debug, Clone)]
pub struct AllowedHosts {
    names: Vec<String>,
}

impl AllowedHosts {
    /// Loopback names plus `extra` (`--ui_allowed_host`), compared without
    /// regard to case.
    pub fn new(extra: &[String]) -> Self {
        let mut names: Vec<String> = ["localhost", "127.0.0.1", "[::1]"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        names.extend(extra.iter().map(|h| h.trim().to_ascii_lowercase()));
        AllowedHosts { names }
    }

    /// Whether a `Host` header value (`name[:port]`) names this server.
    pub fn allows(&self, host: &str) -> bool {
        let name = host_name(host).to_ascii_lowercase();
        self.names.contains(&name)
    }
}

/// The name part of a `Host` value: `[::1]:8074` → `[::1]`,
/// `localhost:8074` → `localhost`.
fn host_name(host: &str) -> &str {
    let host = host.trim();
    if host.starts_with('[') {
        return match host.find(']') {
            Some(end) => &host[..=end],
            None => host,
        };
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Who may connect, and the port they connect to.
#[derive(Debug, Clone)]
pub struct PeerCheck {
    /// The gate of `--local_peers`.
    pub gate: refract_peercred::PeerGate,
    /// The UI's port.
    pub port: u16,
}

/// The middleware for the local-user rule: a request over a connection of
/// another user of this host is refused before any handler runs.
pub async fn check_peer(
    State(peers): State<PeerCheck>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<std::net::SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    match peers.gate.check(peer, peers.port) {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            tracing::warn!(%peer, path = %request.uri().path(), "web UI request refused: {refusal}");
            (
                StatusCode::FORBIDDEN,
                "only the user who started this Refract server may use its web UI \
                 (refract serve --local_peers)",
            )
                .into_response()
        }
    }
}

/// The middleware: refuses requests the rules above do not allow, with a
/// plain-text reason.
pub async fn check(State(allowed): State<AllowedHosts>, request: Request, next: Next) -> Response {
    match verdict(&allowed, &request) {
        Ok(()) => next.run(request).await,
        Err((status, why)) => {
            tracing::warn!(
                method = %request.method(),
                path = %request.uri().path(),
                host = ?request.headers().get(header::HOST),
                origin = ?request.headers().get(header::ORIGIN),
                reason = %why,
                "refused a web UI request"
            );
            (status, why).into_response()
        }
    }
}

fn verdict(allowed: &AllowedHosts, request: &Request<Body>) -> Result<(), (StatusCode, String)> {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .ok_or((
            StatusCode::BAD_REQUEST,
            "the request has no Host header".to_string(),
        ))?;
    if !allowed.allows(host) {
        return Err((
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "this server does not answer to the host name '{}'; start it with \
                 --ui_allowed_host {} to allow it",
                host_name(host),
                host_name(host)
            ),
        ));
    }
    if matches!(*request.method(), Method::GET | Method::HEAD) {
        return Ok(());
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let same = origin
            .to_str()
            .ok()
            .and_then(|o| o.strip_prefix("http://"))
            .is_some_and(|o| o.eq_ignore_ascii_case(host));
        if !same {
            return Err((
                StatusCode::FORBIDDEN,
                format!(
                    "actions are accepted only from this server's own page, not from {}",
                    String::from_utf8_lossy(origin.as_bytes())
                ),
            ));
        }
    }
    if !headers.contains_key(ACTION_HEADER) {
        return Err((
            StatusCode::FORBIDDEN,
            format!("actions need the {ACTION_HEADER} header"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, headers: &[(&str, &str)]) -> Request<Body> {
        let mut builder = Request::builder().method(method).uri("/api/jobs/x/cancel");
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(Body::empty()).expect("a request")
    }

    #[test]
    fn host_names_are_taken_without_their_port() {
        assert_eq!(host_name("localhost:8074"), "localhost");
        assert_eq!(host_name("[::1]:8074"), "[::1]");
        assert_eq!(host_name("[::1]"), "[::1]");
        assert_eq!(host_name("example.com"), "example.com");
    }

    #[test]
    fn only_loopback_and_named_hosts_are_answered() {
        let allowed = AllowedHosts::new(&["Runner.Local".to_string()]);
        for host in [
            "localhost:8074",
            "127.0.0.1:1",
            "[::1]:8074",
            "LOCALHOST",
            "runner.local:80",
        ] {
            assert!(allowed.allows(host), "{host}");
        }
        for host in [
            "evil.example:8074",
            "127.0.0.2",
            "localhost.evil.example",
            "",
        ] {
            assert!(!allowed.allows(host), "{host}");
        }
    }

    #[test]
    fn actions_need_the_header_and_a_same_origin() {
        let allowed = AllowedHosts::new(&[]);
        let host = ("host", "localhost:8074");
        assert!(verdict(&allowed, &request(Method::GET, &[host])).is_ok());
        assert!(verdict(
            &allowed,
            &request(Method::POST, &[host, (ACTION_HEADER, "1")])
        )
        .is_ok());
        assert!(verdict(
            &allowed,
            &request(
                Method::POST,
                &[
                    host,
                    (ACTION_HEADER, "1"),
                    ("origin", "http://localhost:8074")
                ]
            )
        )
        .is_ok());
        let refused = [
            request(Method::POST, &[host]),
            request(
                Method::POST,
                &[
                    host,
                    ("origin", "http://evil.example"),
                    (ACTION_HEADER, "1"),
                ],
            ),
            request(
                Method::POST,
                &[host, ("origin", "null"), (ACTION_HEADER, "1")],
            ),
            request(Method::GET, &[("host", "evil.example:8074")]),
            request(Method::GET, &[]),
        ];
        for r in refused {
            assert!(verdict(&allowed, &r).is_err(), "{:?}", r.headers());
        }
    }
}
