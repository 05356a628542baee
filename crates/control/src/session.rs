//! The run page's sessions. Opening the page with the run's token (`/?token=…`) mints a
//! session: a random id, distinct from the token, that the page keeps in its tab's
//! `sessionStorage` (per origin: scheme, host *and port*) and sends in the `X-Evb-Session`
//! header. It is never a cookie, which browsers share across the ports of a host: another
//! service on 127.0.0.1 that the operator opens receives nothing of it. A session lasts
//! [`TTL`], is forgotten with the process, and `POST /api/v1/logout` revokes it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a session lasts.
pub const TTL: Duration = Duration::from_secs(12 * 3600);
/// Most sessions at once; a new one beyond them replaces the one that ends first.
pub const MAX: usize = 64;
/// The header the page sends its session in.
pub const HEADER: &str = "x-evb-session";

#[derive(Default)]
pub struct Sessions {
    /// Session id → when it ends.
    live: Mutex<HashMap<String, Instant>>,
}

impl Sessions {
    /// A new session; `None` without OS randomness.
    pub fn mint(&self) -> Option<String> {
        let id = evb_transport::random_hex(32)?;
        let now = Instant::now();
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.retain(|_, end| *end > now);
        if live.len() >= MAX {
            if let Some(first) = live
                .iter()
                .min_by_key(|(_, end)| **end)
                .map(|(k, _)| k.clone())
            {
                live.remove(&first);
            }
        }
        live.insert(id.clone(), now + TTL);
        Some(id)
    }

    /// Whether `id` is a live session.
    pub fn valid(&self, id: &str) -> bool {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.get(id).is_some_and(|end| *end > Instant::now())
    }

    /// Ends session `id`; whether it was live.
    pub fn revoke(&self, id: &str) -> bool {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.remove(id).is_some_and(|end| end > Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_random_distinct_and_revocable() {
        let s = Sessions::default();
        let a = s.mint().unwrap();
        let b = s.mint().unwrap();
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert!(s.valid(&a) && s.valid(&b));
        assert!(!s.valid("not-a-session"));
        assert!(s.revoke(&a));
        assert!(!s.valid(&a) && s.valid(&b));
        assert!(!s.revoke(&a));
        for _ in 0..2 * MAX {
            s.mint().unwrap();
        }
        assert!(s.live.lock().unwrap().len() <= MAX);
    }
}
