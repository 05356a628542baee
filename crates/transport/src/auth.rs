//! Handshake authentication with a shared secret: each side proves it knows the secret by an
//! HMAC-SHA256 over both Hellos, whose fresh random nonces make every proof single-use.
//!
//! Connector → Hello (nonce ≠ 0); acceptor → HelloAck (its own nonce ≠ 0) and
//! Auth(HMAC(secret, "evb-acceptor" ‖ hello ‖ hello-ack)); connector checks it, answers
//! Auth(HMAC(secret, "evb-connector" ‖ hello ‖ hello-ack)); the acceptor checks that before
//! the connection is reported open. Without a secret both nonces are zero and no Auth is sent.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use thiserror::Error;

/// Why no handshake nonce could be drawn.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NonceError {
    #[error("no randomness for the handshake nonce: {0}")]
    NoRandomness(getrandom::Error),
    #[error("the random source gave an all-zero nonce")]
    Zero,
}

/// `bytes` random bytes from the operating system, as lowercase hex (a session id, a
/// secret). `None` without OS randomness.
pub fn random_hex(bytes: usize) -> Option<String> {
    let mut b = vec![0u8; bytes];
    getrandom::getrandom(&mut b).ok()?;
    Some(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// A random, non-zero nonce from the operating system. Without OS randomness there is no
/// safe handshake: the error makes the handshake fail rather than use a guessable nonce.
pub fn nonce() -> Result<u64, NonceError> {
    nonce_from(getrandom::getrandom)
}

fn nonce_from(
    fill: impl FnOnce(&mut [u8]) -> Result<(), getrandom::Error>,
) -> Result<u64, NonceError> {
    let mut b = [0u8; 8];
    fill(&mut b).map_err(NonceError::NoRandomness)?;
    match u64::from_le_bytes(b) {
        // zero means "no authentication" on the wire; 2^-64 odds, but never send it
        0 => Err(NonceError::Zero),
        n => Ok(n),
    }
}

fn mac(secret: &[u8], role: &[u8], hello: &[u8], ack: &[u8]) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    m.update(role);
    m.update(&(hello.len() as u32).to_le_bytes());
    m.update(hello);
    m.update(ack);
    m
}

pub fn acceptor_proof(secret: &[u8], hello: &[u8], ack: &[u8]) -> Vec<u8> {
    mac(secret, b"evb-acceptor", hello, ack)
        .finalize()
        .into_bytes()
        .to_vec()
}

pub fn connector_proof(secret: &[u8], hello: &[u8], ack: &[u8]) -> Vec<u8> {
    mac(secret, b"evb-connector", hello, ack)
        .finalize()
        .into_bytes()
        .to_vec()
}

/// Constant-time check of a peer's proof.
pub fn check(secret: &[u8], acceptor: bool, hello: &[u8], ack: &[u8], proof: &[u8]) -> bool {
    let role: &[u8] = if acceptor {
        b"evb-acceptor"
    } else {
        b"evb-connector"
    };
    mac(secret, role, hello, ack).verify_slice(proof).is_ok()
}

/// The bearer token of the control API, derived from the run's secret (so that the secret
/// itself never travels in an HTTP header): lowercase hex of HMAC-SHA256(secret,
/// "evb-control-api-v1").
pub fn control_token(secret: &[u8]) -> String {
    let mut m = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    m.update(b"evb-control-api-v1");
    m.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Constant-time comparison of a presented control token with the expected one.
pub fn control_token_matches(secret: &[u8], presented: &str) -> bool {
    let expected = control_token(secret);
    let (a, b) = (expected.as_bytes(), presented.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_bind_secret_role_and_both_hellos() {
        let p = acceptor_proof(b"k", b"hello", b"ack");
        assert!(check(b"k", true, b"hello", b"ack", &p));
        assert!(!check(b"other", true, b"hello", b"ack", &p));
        assert!(
            !check(b"k", false, b"hello", b"ack", &p),
            "an acceptor proof is no connector proof"
        );
        assert!(!check(b"k", true, b"hellO", b"ack", &p));
        assert!(!check(b"k", true, b"hello", b"ack", &p[..31]));
        assert_ne!(nonce().unwrap(), nonce().unwrap());
    }

    #[test]
    fn no_randomness_fails_the_nonce_instead_of_a_guessable_one() {
        let failing = |_: &mut [u8]| Err(getrandom::Error::UNSUPPORTED);
        assert!(nonce_from(failing).is_err());
        let zeros = |b: &mut [u8]| {
            b.fill(0);
            Ok(())
        };
        assert!(nonce_from(zeros).is_err());
        let ones = |b: &mut [u8]| {
            b.fill(1);
            Ok(())
        };
        assert_eq!(nonce_from(ones), Ok(0x0101_0101_0101_0101));
    }

    #[test]
    fn control_tokens_follow_the_secret() {
        let t = control_token(b"s3cret");
        assert_eq!(t.len(), 64);
        assert!(control_token_matches(b"s3cret", &t));
        assert!(!control_token_matches(b"other", &t));
        assert!(!control_token_matches(b"s3cret", &t[..63]));
        assert!(!control_token_matches(b"s3cret", ""));
    }
}
