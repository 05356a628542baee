//! Who may call the control API, decided from the request alone (no IO), so that every rule
//! is unit-tested here and the middleware in `api.rs` only gathers the facts.
//!
//! Loopback is not a trust boundary: other users of the host, and web pages in the
//! operator's browser, reach 127.0.0.1 too. So, on every node and every port:
//! - the `Host` header must name this machine (an IP literal, `localhost`, or a host name of
//!   the configuration): a page on `rebind.evil.example` that resolves to 127.0.0.1 (DNS
//!   rebinding) is refused;
//! - an `Origin` header, when a browser sends one, must be this API's own origin: another
//!   page's script cannot drive the API, with or without cookies;
//! - a request with a body must declare it `application/json` (no form posts);
//! - with a secret, every request that changes something needs the token (bearer header) or
//!   the page's session (the `X-Evb-Session` header, see `session.rs`: never a cookie, and
//!   never the token itself) whoever sends it, loopback included; reading status and
//!   metrics needs one of them from beyond loopback only;
//! - without a secret, only loopback may call at all (configuration validation refuses a
//!   control address beyond loopback without a secret).

use std::net::IpAddr;

/// The name of the cookie that earlier versions set for the page on the API listening on
/// `port`. It is no longer read; opening the page clears it from the browser.
pub fn cookie_name(port: u16) -> String {
    format!("evb_token_{port}")
}

/// What the middleware read off one request.
#[derive(Debug, Clone, Default)]
pub struct Facts<'a> {
    pub peer: Option<IpAddr>,
    /// True for GET and HEAD: the methods that change nothing.
    pub read_only: bool,
    pub host: Option<&'a str>,
    pub origin: Option<&'a str>,
    pub content_type: Option<&'a str>,
    pub has_body: bool,
    /// `Authorization: Bearer <token>`, if sent.
    pub bearer: Option<&'a str>,
    /// The page's session id (`X-Evb-Session`), if sent.
    pub session: Option<&'a str>,
}

/// A refusal: the HTTP status and the reason, as the JSON error says it.
pub type Refusal = (u16, String);

/// The host part of a `Host` header value (`name`, `name:port`, `[v6]`, `[v6]:port`).
pub(crate) fn host_part(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

/// True when `host` (a Host header value) names this machine rather than some other name
/// that merely resolves to it.
pub fn host_allowed(host: &str, known: &[String]) -> bool {
    let h = host_part(host.trim());
    h.parse::<IpAddr>().is_ok()
        || h.eq_ignore_ascii_case("localhost")
        || known.iter().any(|k| k.eq_ignore_ascii_case(h))
}

/// Decides one request. `token_ok` says whether a presented token is the run's,
/// `session_ok` whether a presented session id is a live session of the page.
pub fn decide(
    secret: bool,
    known_hosts: &[String],
    f: &Facts<'_>,
    token_ok: impl Fn(&str) -> bool,
    session_ok: impl Fn(&str) -> bool,
) -> Result<(), Refusal> {
    if let Some(host) = f.host {
        if !host_allowed(host, known_hosts) {
            return Err((
                403,
                format!(
                    "Host {host:?} is not a name of this node: use its IP address, localhost \
                     or a host name of the configuration (DNS rebinding protection)"
                ),
            ));
        }
    }
    if let Some(origin) = f.origin {
        let own = f.host.map(|h| format!("http://{h}"));
        if own.as_deref() != Some(origin) {
            return Err((
                403,
                format!("cross-origin request from {origin:?} refused: the API serves only its own page"),
            ));
        }
    }
    if !f.read_only && f.has_body {
        let json = f
            .content_type
            .and_then(|c| c.split(';').next())
            .is_some_and(|c| c.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return Err((
                415,
                "a request body must be sent as Content-Type: application/json".into(),
            ));
        }
    }
    let loopback = f
        .peer
        .is_some_and(|ip| ip.is_loopback() || is_mapped_loopback(ip));
    if !secret {
        return if loopback {
            Ok(())
        } else {
            Err((
                403,
                "this API takes requests from beyond loopback only with run.secret set".into(),
            ))
        };
    }
    // a session is a header a page of another origin cannot send (no CORS here), and a value
    // no other origin can read: it is not the token, and a leaked one is not the token either
    let authenticated = f.bearer.is_some_and(&token_ok) || f.session.is_some_and(&session_ok);
    if authenticated || (f.read_only && loopback) {
        return Ok(());
    }
    let why = if f.read_only {
        "a valid bearer token is required from beyond loopback"
    } else {
        "a valid bearer token is required for every command while run.secret is set, loopback included"
    };
    Err((
        401,
        format!("{why} (derived from run.secret: `evb ctl` computes it; the page takes it once as ?token=)"),
    ))
}

fn is_mapped_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
        IpAddr::V4(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LO: &str = "127.0.0.1";

    fn facts(peer: &str, read_only: bool) -> Facts<'static> {
        Facts {
            peer: Some(peer.parse().unwrap()),
            read_only,
            host: Some("127.0.0.1:8100"),
            ..Facts::default()
        }
    }

    fn good(t: &str) -> bool {
        t == "tok"
    }

    fn status(r: Result<(), Refusal>) -> u16 {
        r.err().map(|e| e.0).unwrap_or(200)
    }

    #[test]
    fn with_a_secret_every_command_needs_the_token_even_on_loopback() {
        let f = facts(LO, false);
        assert_eq!(status(decide(true, &[], &f, good, sess)), 401);
        let with = Facts {
            bearer: Some("tok"),
            ..f.clone()
        };
        assert_eq!(status(decide(true, &[], &with, good, sess)), 200);
        let wrong = Facts {
            bearer: Some("nope"),
            ..f
        };
        assert_eq!(status(decide(true, &[], &wrong, good, sess)), 401);
    }

    #[test]
    fn reads_need_the_token_only_from_beyond_loopback() {
        assert_eq!(status(decide(true, &[], &facts(LO, true), good, sess)), 200);
        assert_eq!(
            status(decide(true, &[], &facts("10.1.2.3", true), good, sess)),
            401
        );
        assert_eq!(
            status(decide(false, &[], &facts("10.1.2.3", true), good, sess)),
            403
        );
        assert_eq!(
            status(decide(false, &[], &facts(LO, false), good, sess)),
            200
        );
        assert_eq!(
            status(decide(false, &[], &facts("::1", false), good, sess)),
            200
        );
        assert_eq!(
            status(decide(
                false,
                &[],
                &facts("::ffff:127.0.0.1", false),
                good,
                sess
            )),
            200
        );
    }

    #[test]
    fn foreign_host_names_are_refused_even_with_the_token() {
        let mut f = facts(LO, true);
        f.host = Some("rebind.evil.example:8100");
        f.bearer = Some("tok");
        assert_eq!(status(decide(true, &[], &f, good, sess)), 403);
        assert_eq!(status(decide(false, &[], &f, good, sess)), 403);
        let known = vec!["daq-evm01".to_string()];
        f.host = Some("DAQ-evm01:8100");
        assert_eq!(status(decide(true, &known, &f, good, sess)), 200);
        for ok in ["localhost:1", "[::1]:80", "[::1]", "10.0.0.1", "localhost"] {
            assert!(host_allowed(ok, &[]), "{ok}");
        }
        for bad in ["evil", "127.0.0.1.nip.io:80", "localhost.evil:1", ""] {
            assert!(!host_allowed(bad, &[]), "{bad}");
        }
    }

    #[test]
    fn cross_origin_and_form_posts_are_refused() {
        let mut f = facts(LO, false);
        f.bearer = Some("tok");
        f.origin = Some("http://evil.example");
        assert_eq!(status(decide(true, &[], &f, good, sess)), 403);
        assert_eq!(status(decide(false, &[], &f, good, sess)), 403);
        f.origin = Some("null");
        assert_eq!(status(decide(false, &[], &f, good, sess)), 403);
        f.origin = Some("http://127.0.0.1:8100");
        assert_eq!(status(decide(true, &[], &f, good, sess)), 200);
        f.has_body = true;
        f.content_type = Some("text/plain");
        assert_eq!(status(decide(true, &[], &f, good, sess)), 415);
        f.content_type = Some("application/json; charset=utf-8");
        assert_eq!(status(decide(true, &[], &f, good, sess)), 200);
    }

    fn sess(s: &str) -> bool {
        s == "sess-1"
    }

    /// The page's session (a header, not a cookie) works for commands and reads; the token
    /// is not a session and a session is not a bearer token; another origin is refused.
    #[test]
    fn the_page_s_session_is_its_own_credential() {
        let mut f = facts(LO, false);
        f.session = Some("sess-1");
        assert_eq!(status(decide(true, &[], &f, good, sess)), 200);
        f.origin = Some("http://127.0.0.1:8100");
        assert_eq!(status(decide(true, &[], &f, good, sess)), 200);
        f.origin = Some("http://127.0.0.1:9999");
        assert_eq!(status(decide(true, &[], &f, good, sess)), 403);
        f.origin = None;
        f.session = Some("tok");
        assert_eq!(status(decide(true, &[], &f, good, sess)), 401);
        f.session = None;
        f.bearer = Some("sess-1");
        assert_eq!(status(decide(true, &[], &f, good, sess)), 401);
        let mut r = facts("10.1.2.3", true);
        r.session = Some("sess-1");
        assert_eq!(status(decide(true, &[], &r, good, sess)), 200);
    }
}
