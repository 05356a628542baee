//! A small blocking HTTP/JSON client for the control API (the EVM calling its nodes,
//! `evb ctl` calling the EVM).

use std::time::Duration;

use serde_json::Value;

/// Where an API is and how to prove the right to use it.
#[derive(Debug, Clone)]
pub struct Api {
    /// `http://host:port`
    pub base: String,
    /// Bearer token (derived from the run's secret), sent when set.
    pub token: Option<String>,
    pub timeout: Duration,
    /// Keeps its connection open between requests (the EVM asks every node every second:
    /// one connection each, not one per request and a new local port every time).
    agent: ureq::Agent,
}

fn make_agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        // a 4xx carries a JSON body that says why: read it rather than fail
        .http_status_as_error(false)
        .build()
        .into()
}

/// A reply: the HTTP status and its JSON body (or the text, as a JSON string).
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub body: Value,
}

impl Reply {
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The body read as `T` (a reply of `crate::replies`); a body that lacks a field or
    /// holds one of another type is an error naming it, never a default.
    pub fn typed<T: serde::de::DeserializeOwned>(&self, what: &str) -> Result<T, String> {
        serde_json::from_value(self.body.clone())
            .map_err(|e| format!("the control's answer to {what} cannot be read: {e}"))
    }

    /// The error message of a refused request.
    pub fn error(&self) -> String {
        self.body["error"]
            .as_str()
            .map(String::from)
            .unwrap_or_else(|| self.body.to_string())
    }
}

/// Why a call got no answer: the API could not be reached or its answer not read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{base}: {detail}")]
pub struct CallError {
    /// The API called (`http://host:port`).
    pub base: String,
    pub kind: CallErrorKind,
    /// What the HTTP client said.
    pub detail: String,
}

/// The kinds of [`CallError`] a caller decides by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallErrorKind {
    /// Nothing listens there (yet, or any more): the connection was refused.
    Refused,
    /// No answer in time.
    Timeout,
    /// Anything else (a broken connection, an unreadable answer).
    Other,
}

impl CallError {
    fn new(base: &str, e: ureq::Error) -> CallError {
        let kind = match &e {
            ureq::Error::Timeout(_) => CallErrorKind::Timeout,
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                CallErrorKind::Refused
            }
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
                CallErrorKind::Timeout
            }
            _ => CallErrorKind::Other,
        };
        CallError {
            base: base.to_string(),
            kind,
            detail: e.to_string(),
        }
    }

    /// Nothing listens there: a node starting may not be listening yet.
    pub fn is_refused(&self) -> bool {
        self.kind == CallErrorKind::Refused
    }

    /// What an operator reads (the page's note, `evb ctl`): the kind in words, not the HTTP
    /// client's terms.
    pub fn in_words(&self) -> String {
        match self.kind {
            CallErrorKind::Refused => "not running: nothing listens at its control API".into(),
            CallErrorKind::Timeout => {
                "not answering (frozen, or too busy to answer in time)".into()
            }
            CallErrorKind::Other => format!("cannot be asked: {}", self.detail),
        }
    }
}

impl From<CallError> for String {
    fn from(e: CallError) -> String {
        e.to_string()
    }
}

impl Api {
    pub fn new(base: &str, token: Option<String>) -> Api {
        let base = if base.starts_with("http://") || base.starts_with("https://") {
            base.trim_end_matches('/').to_string()
        } else {
            format!("http://{}", base.trim_end_matches('/'))
        };
        let timeout = Duration::from_secs(5);
        Api {
            base,
            token,
            timeout,
            agent: make_agent(timeout),
        }
    }

    pub fn with_timeout(mut self, t: Duration) -> Api {
        self.timeout = t;
        self.agent = make_agent(t);
        self
    }

    fn agent(&self) -> &ureq::Agent {
        &self.agent
    }

    /// GET `path`; an error when the API cannot be reached.
    pub fn get(&self, path: &str) -> Result<Reply, CallError> {
        let mut req = self.agent().get(format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        read(req.call(), &self.base)
    }

    /// DELETE `path`.
    pub fn delete(&self, path: &str) -> Result<Reply, CallError> {
        let mut req = self.agent().delete(format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        read(req.call(), &self.base)
    }

    /// POST a JSON body to `path`.
    pub fn post(&self, path: &str, body: &Value) -> Result<Reply, CallError> {
        let mut req = self.agent().post(format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        read(req.send_json(body), &self.base)
    }
}

fn read(
    r: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    base: &str,
) -> Result<Reply, CallError> {
    let mut resp = r.map_err(|e| CallError::new(base, e))?;
    let status = resp.status().as_u16();
    let text = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| CallError::new(base, e))?;
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok(Reply { status, body })
}
