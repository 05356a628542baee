//! Handshake authentication with a shared secret: each side proves it knows the secret by an
//! HMAC-SHA256 over both Hellos, whose fresh random nonces make every proof single-use.
//!
//! Connector → Hello (nonce ≠ 0); acceptor → HelloAck (its own nonce ≠ 0) and
//! Auth(HMAC(secret, "evb-acceptor" ‖ hello ‖ hello-ack)); connector checks it, answers
//! Auth(HMAC(secret, "evb-connector" ‖ hello ‖ hello-ack)); the acceptor checks that before
//! the connection is reported open. Without a secret both nonces are zero and no Auth is sent.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// A random, non-zero nonce.
pub fn nonce() -> u64 {
    let mut b = [0u8; 8];
    // Without OS randomness there is no safe handshake; an all-zero nonce would then be
    // refused by the peer, which is the safe failure.
    let _ = getrandom::getrandom(&mut b);
    u64::from_le_bytes(b).max(1)
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
        assert_ne!(nonce(), nonce());
    }
}
