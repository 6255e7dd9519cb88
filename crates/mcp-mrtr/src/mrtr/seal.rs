//! Sealing `requestState`: XChaCha20-Poly1305 over a small binary payload that binds a continuation
//! to its principal, to the request that started it and to an expiry. The key id travels in clear
//! (and is authenticated) so keys can rotate: the first configured key seals, all of them open.
//! The same keys vouch for short messages that do not need hiding (the ids of a legacy session's
//! questions), so any replica can tell the ones this deployment made from made-up ones.

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use chacha20poly1305::aead::{AeadInPlace, KeyInit};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;

use crate::store::ContinuationId;

const FORMAT_VERSION: u8 = 1;
const NONCE_LEN: usize = 24;
const TAG_LEN: usize = 16;
const KEY_LEN: usize = 32;
/// Bytes of the unique value a vouching tag is made under.
pub const VOUCH_UNIQUE_LEN: usize = 16;
/// Bytes of a vouching tag.
pub const VOUCH_TAG_LEN: usize = TAG_LEN;
/// Completes a vouching nonce: apart from the random nonces of sealed states.
const VOUCH_NONCE_SUFFIX: &[u8; NONCE_LEN - VOUCH_UNIQUE_LEN] = b"vouching";
/// expiry (8) + continuation id (16) + request digest (32), then the principal.
const FIXED_CLAIMS_LEN: usize = 8 + 16 + 32;

/// What a sealed state asserts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateClaims {
    /// The parked continuation the state points at.
    pub continuation: ContinuationId,
    /// The caller's [`Principal::id`](crate::auth::Principal::id); others cannot resume the state.
    pub principal: String,
    /// SHA-256 of the method, name and arguments, so the state resumes only the same request.
    pub request_digest: [u8; 32],
    /// Seconds since the Unix epoch.
    pub expires_at: u64,
}

/// Why a `requestState` could not be opened; sent to the client as -32602.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    #[error(
        "requestState failed its integrity check (it was altered, truncated or sealed by another server)"
    )]
    /// The state is not one this server sealed intact: bad encoding, wrong format or failed tag.
    Tampered,
    /// The state names a key id missing from this server's key ring (rotated out, or foreign).
    #[error("requestState was sealed with key {0:?}, which this server does not have")]
    UnknownKey(String),
}

/// Seals and opens request states with a ring of keys built once at start-up.
pub struct StateSealer {
    keys: Vec<(String, XChaCha20Poly1305)>,
}

impl StateSealer {
    /// Parses `id:base64key[,id:base64key…]`; the first key seals. Keys are 32 bytes.
    pub fn from_spec(spec: &str) -> Result<Self, String> {
        let mut keys = Vec::new();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (id, encoded) = entry
                .split_once(':')
                .ok_or_else(|| format!("state key {entry:?} is not of the form id:base64key"))?;
            if id.is_empty()
                || id.len() > 32
                || !id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(format!(
                    "state key id {id:?} must be 1-32 characters of [A-Za-z0-9_-]"
                ));
            }
            let material = STANDARD
                .decode(encoded)
                .or_else(|_| URL_SAFE_NO_PAD.decode(encoded))
                .map_err(|_| format!("state key {id:?} is not valid base64"))?;
            if material.len() != KEY_LEN {
                return Err(format!(
                    "state key {id:?} must be {KEY_LEN} bytes, found {}",
                    material.len()
                ));
            }
            if keys.iter().any(|(known, _)| known == id) {
                return Err(format!("state key id {id:?} appears twice"));
            }
            let cipher = XChaCha20Poly1305::new_from_slice(&material).map_err(|e| e.to_string())?;
            keys.push((id.to_owned(), cipher));
        }
        if keys.is_empty() {
            return Err("no state keys given".into());
        }
        Ok(Self { keys })
    }

    /// A fresh random key, for development runs with no configured keys.
    pub fn generate() -> Self {
        Self::from_spec(&Self::generate_spec("dev"))
            .unwrap_or_else(|_| unreachable!("a generated key is valid"))
    }

    /// A new key in the configuration format of [`StateSealer::from_spec`].
    pub fn generate_spec(id: &str) -> String {
        let mut material = [0u8; KEY_LEN];
        rand::thread_rng().fill_bytes(&mut material);
        format!("{id}:{}", STANDARD.encode(material))
    }

    /// The id of the key that seals new states (the first in the spec).
    pub fn active_key_id(&self) -> &str {
        &self.keys[0].0
    }

    /// Seals `claims` into an opaque URL-safe string to send as `requestState`.
    pub fn seal(&self, claims: &StateClaims) -> String {
        let (key_id, cipher) = &self.keys[0];
        // One buffer: the header (authenticated, in clear), the nonce, the claims encrypted in
        // place, then the tag.
        let header_len = 2 + key_id.len();
        let mut out = Vec::with_capacity(
            header_len + NONCE_LEN + FIXED_CLAIMS_LEN + claims.principal.len() + TAG_LEN,
        );
        out.push(FORMAT_VERSION);
        out.push(key_id.len() as u8);
        out.extend_from_slice(key_id.as_bytes());
        let mut nonce = [0u8; NONCE_LEN];
        rand::thread_rng().fill_bytes(&mut nonce);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&claims.expires_at.to_be_bytes());
        out.extend_from_slice(claims.continuation.as_bytes());
        out.extend_from_slice(&claims.request_digest);
        out.extend_from_slice(claims.principal.as_bytes());
        let (header, rest) = out.split_at_mut(header_len);
        let tag = cipher
            .encrypt_in_place_detached(&XNonce::from(nonce), header, &mut rest[NONCE_LEN..])
            .unwrap_or_else(|_| unreachable!("encryption of an in-memory buffer cannot fail"));
        out.extend_from_slice(&tag);
        URL_SAFE_NO_PAD.encode(out)
    }

    /// A fresh random value and a tag under it vouching for `message`: the authenticator of the
    /// active key over `message`, with nothing encrypted (the value is drawn here, so no two
    /// messages share one, as a one-time authenticator requires). Callers put their own context
    /// in `message`, so tags made for one purpose do not check out for another.
    pub fn vouch(&self, message: &[u8]) -> ([u8; VOUCH_UNIQUE_LEN], [u8; VOUCH_TAG_LEN]) {
        let mut unique = [0u8; VOUCH_UNIQUE_LEN];
        rand::thread_rng().fill_bytes(&mut unique);
        let (_, cipher) = &self.keys[0];
        let tag = cipher
            .encrypt_in_place_detached(&vouch_nonce(&unique), message, &mut [])
            .unwrap_or_else(|_| unreachable!("authenticating an in-memory buffer cannot fail"));
        (unique, tag.into())
    }

    /// Whether one of the keys made `tag` for `message` under `unique`.
    pub fn vouches(
        &self,
        unique: &[u8; VOUCH_UNIQUE_LEN],
        message: &[u8],
        tag: &[u8; VOUCH_TAG_LEN],
    ) -> bool {
        let nonce = vouch_nonce(unique);
        self.keys.iter().any(|(_, cipher)| {
            cipher
                .decrypt_in_place_detached(&nonce, message, &mut [], &(*tag).into())
                .is_ok()
        })
    }

    /// Opens a `requestState` and checks its integrity; the caller checks expiry and bindings.
    pub fn open(&self, state: &str) -> Result<StateClaims, SealError> {
        let mut raw = URL_SAFE_NO_PAD
            .decode(state)
            .map_err(|_| SealError::Tampered)?;
        let (&version, rest) = raw.split_first().ok_or(SealError::Tampered)?;
        let (&id_len, rest) = rest.split_first().ok_or(SealError::Tampered)?;
        let header_len = 2 + id_len as usize;
        if version != FORMAT_VERSION || rest.len() < id_len as usize + NONCE_LEN + TAG_LEN {
            return Err(SealError::Tampered);
        }
        let (header, rest) = raw.split_at_mut(header_len);
        let key_id = std::str::from_utf8(&header[2..]).map_err(|_| SealError::Tampered)?;
        let (nonce, sealed) = rest.split_at_mut(NONCE_LEN);
        let (plaintext, tag) = sealed.split_at_mut(sealed.len() - TAG_LEN);
        let cipher = self
            .keys
            .iter()
            .find(|(id, _)| id == key_id)
            .map(|(_, cipher)| cipher)
            .ok_or_else(|| SealError::UnknownKey(key_id.to_owned()))?;
        let nonce: [u8; NONCE_LEN] = (&*nonce).try_into().map_err(|_| SealError::Tampered)?;
        let tag: [u8; TAG_LEN] = (&*tag).try_into().map_err(|_| SealError::Tampered)?;
        cipher
            .decrypt_in_place_detached(&XNonce::from(nonce), header, plaintext, &tag.into())
            .map_err(|_| SealError::Tampered)?;
        if plaintext.len() < FIXED_CLAIMS_LEN {
            return Err(SealError::Tampered);
        }
        let (expiry, rest) = plaintext.split_at(8);
        let (continuation, rest) = rest.split_at(16);
        let (digest, principal) = rest.split_at(32);
        Ok(StateClaims {
            continuation: ContinuationId::from_slice(continuation).ok_or(SealError::Tampered)?,
            principal: std::str::from_utf8(principal)
                .map_err(|_| SealError::Tampered)?
                .to_owned(),
            request_digest: digest.try_into().map_err(|_| SealError::Tampered)?,
            expires_at: u64::from_be_bytes(expiry.try_into().map_err(|_| SealError::Tampered)?),
        })
    }
}

fn vouch_nonce(unique: &[u8; VOUCH_UNIQUE_LEN]) -> XNonce {
    let mut nonce = [0u8; NONCE_LEN];
    nonce[..VOUCH_UNIQUE_LEN].copy_from_slice(unique);
    nonce[VOUCH_UNIQUE_LEN..].copy_from_slice(VOUCH_NONCE_SUFFIX);
    XNonce::from(nonce)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vouching_tag_checks_out_for_its_message_under_any_key_of_the_ring_only() {
        let old = StateSealer::generate_spec("old");
        let sealer = StateSealer::from_spec(&old).expect("a key");
        let (unique, tag) = sealer.vouch(b"session-a\0watched");
        assert_ne!(
            sealer.vouch(b"session-a\0watched").0,
            unique,
            "fresh each time"
        );
        let rotated =
            StateSealer::from_spec(&format!("{},{old}", StateSealer::generate_spec("new")))
                .expect("two keys");
        assert!(sealer.vouches(&unique, b"session-a\0watched", &tag));
        assert!(
            rotated.vouches(&unique, b"session-a\0watched", &tag),
            "an older key"
        );
        assert!(
            !sealer.vouches(&unique, b"session-b\0watched", &tag),
            "another message"
        );
        let mut other = unique;
        other[0] ^= 1;
        assert!(
            !sealer.vouches(&other, b"session-a\0watched", &tag),
            "another value"
        );
        let mut bent = tag;
        bent[0] ^= 1;
        assert!(!sealer.vouches(&unique, b"session-a\0watched", &bent));
        assert!(!StateSealer::generate().vouches(&unique, b"session-a\0watched", &tag));
    }

    fn claims() -> StateClaims {
        StateClaims {
            continuation: ContinuationId::from_slice(&[1; 16]).unwrap(),
            principal: "user:alice".into(),
            request_digest: [7; 32],
            expires_at: 1_900_000_000,
        }
    }

    #[test]
    fn a_sealed_state_opens_to_the_same_claims_and_differs_each_time() {
        let sealer = StateSealer::generate();
        let claims = claims();
        let first = sealer.seal(&claims);
        let second = sealer.seal(&claims);
        assert_ne!(first, second, "a fresh nonce each time");
        assert_eq!(sealer.open(&first), Ok(claims.clone()));
        assert_eq!(sealer.open(&second), Ok(claims));
    }

    #[test]
    fn any_change_to_the_state_is_detected() {
        let sealer = StateSealer::generate();
        let state = sealer.seal(&claims());
        assert_eq!(
            sealer.open(&format!("{state}-TAMPERED")),
            Err(SealError::Tampered)
        );
        let mut flipped = state.clone().into_bytes();
        let middle = flipped.len() / 2;
        flipped[middle] = if flipped[middle] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            sealer.open(std::str::from_utf8(&flipped).unwrap()),
            Err(SealError::Tampered)
        );
        assert_eq!(
            sealer.open(&state[..state.len() - 4]),
            Err(SealError::Tampered)
        );
        assert_eq!(sealer.open("not base64!"), Err(SealError::Tampered));
    }

    #[test]
    fn rotated_keys_still_open_states_sealed_with_the_old_key() {
        let old = StateSealer::generate_spec("k1");
        let new = StateSealer::generate_spec("k2");
        let before = StateSealer::from_spec(&old).unwrap();
        let state = before.seal(&claims());
        let after = StateSealer::from_spec(&format!("{new},{old}")).unwrap();
        assert_eq!(after.active_key_id(), "k2");
        assert_eq!(after.open(&state), Ok(claims()));
        let dropped = StateSealer::from_spec(&new).unwrap();
        assert_eq!(
            dropped.open(&state),
            Err(SealError::UnknownKey("k1".into()))
        );
    }

    #[test]
    fn malformed_key_specs_are_refused() {
        assert!(StateSealer::from_spec("").is_err());
        assert!(StateSealer::from_spec("nokey").is_err());
        assert!(StateSealer::from_spec("k1:c2hvcnQ=").is_err());
        let key = StateSealer::generate_spec("same");
        assert!(StateSealer::from_spec(&format!("{key},{key}")).is_err());
    }
}
