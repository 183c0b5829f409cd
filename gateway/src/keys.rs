//! API keys: stored as SHA-256 hashes, looked up by the hash of the key a request presents.
//!
//! The config file lists `sha256:<64 hex digits>` (print one with `kvgate-gateway --hash-key`, which reads
//! the key from standard input); a plain key is accepted too and hashed when the file is read, so the
//! gateway never keeps a key in memory after that. Keys are never logged, never shown in errors, and
//! never sent upstream.
//!
//! # No timing leak
//!
//! A request's key is hashed first (SHA-256 takes the same time for every key of a length), then the
//! digest is looked up in a map of the configured digests, and the entry found is compared with the
//! digest in constant time (every byte, no early exit). What the lookup's timing depends on is the
//! digest of the presented key, which tells an attacker nothing about any configured key (finding a
//! key from its digest is SHA-256's preimage problem). A missing and an unknown key take the same path
//! up to the lookup.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::fmt;

/// The SHA-256 digest of an API key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash([u8; 32]);

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only a prefix of the digest: enough to tell keys apart in a debug print.
        write!(f, "KeyHash(sha256:{}…)", &self.to_hex()[..8])
    }
}

impl KeyHash {
    /// The digest of `key`.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvgate_gateway::keys::KeyHash;
    ///
    /// let hash = KeyHash::of("sk-alice");
    /// assert_eq!(KeyHash::parse(&hash.to_string()), Ok(hash));
    /// assert!(hash.to_string().starts_with("sha256:"));
    /// ```
    pub fn of(key: &str) -> Self {
        Self(Sha256::digest(key.as_bytes()).into())
    }

    /// Reads a configured key: `sha256:<64 hex digits>`, or a plain key (hashed here).
    ///
    /// # Errors
    ///
    /// A message for an empty key, or a `sha256:` value that is not 64 hex digits.
    pub fn parse(configured: &str) -> Result<Self, String> {
        let Some(hex) = configured.strip_prefix("sha256:") else {
            if configured.trim().is_empty() {
                return Err("an API key is empty".into());
            }
            return Ok(Self::of(configured.trim()));
        };
        let bytes = hex.as_bytes();
        if bytes.len() != 64 || !bytes.iter().all(u8::is_ascii_hexdigit) {
            return Err("a sha256: key must be followed by 64 hex digits (kvgate-gateway --hash-key prints one)".into());
        }
        let mut digest = [0u8; 32];
        for (i, pair) in bytes.chunks(2).enumerate() {
            let text = std::str::from_utf8(pair).expect("hex digits are ASCII");
            digest[i] = u8::from_str_radix(text, 16).expect("two hex digits");
        }
        Ok(Self(digest))
    }

    /// The digest in lower-case hex.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Compares every byte, whatever differs first.
    fn constant_time_eq(&self, other: &KeyHash) -> bool {
        let mut diff = 0u8;
        for (a, b) in self.0.iter().zip(other.0.iter()) {
            diff |= a ^ b;
        }
        // Keep the comparison from being turned back into an early-exit loop.
        std::hint::black_box(diff) == 0
    }
}

impl fmt::Display for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.to_hex())
    }
}

/// The bearer token of a request, if it has one: `Authorization: Bearer <key>` (`bearer` too).
pub fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    let value = headers.get(http::header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, key) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| key.trim()).filter(|k| !k.is_empty())
}

/// Why a request has no caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyError {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A key that is not configured.
    Unknown,
}

/// Digests of the configured keys → what each key resolves to (`T`: the caller).
#[derive(Debug)]
pub struct KeyTable<T> {
    by_hash: HashMap<KeyHash, (KeyHash, T)>,
}

impl<T> Default for KeyTable<T> {
    fn default() -> Self {
        Self { by_hash: HashMap::new() }
    }
}

impl<T> KeyTable<T> {
    /// Adds a key; `false` if it is there already.
    pub fn insert(&mut self, hash: KeyHash, value: T) -> bool {
        if self.by_hash.contains_key(&hash) {
            return false;
        }
        self.by_hash.insert(hash, (hash, value));
        true
    }

    /// Whether no key is configured.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// Configured keys.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// What the request's bearer key resolves to.
    ///
    /// # Errors
    ///
    /// [`KeyError::Missing`] without a bearer key, [`KeyError::Unknown`] for one not configured.
    pub fn resolve(&self, headers: &http::HeaderMap) -> Result<&T, KeyError> {
        let presented = KeyHash::of(bearer(headers).ok_or(KeyError::Missing)?);
        match self.by_hash.get(&presented) {
            Some((stored, value)) if stored.constant_time_eq(&presented) => Ok(value),
            _ => Err(KeyError::Unknown),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_parse_and_resolve() {
        let hash = KeyHash::of("sk-a");
        assert_eq!(KeyHash::parse("sk-a"), Ok(hash));
        assert_eq!(KeyHash::parse(&format!("sha256:{}", hash.to_hex())), Ok(hash));
        for bad in ["", "  ", "sha256:", "sha256:xyz", &format!("sha256:{}0", hash.to_hex())] {
            assert!(KeyHash::parse(bad).is_err(), "{bad:?}");
        }
        // The well-known digest of "abc".
        assert_eq!(KeyHash::of("abc").to_hex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        let mut table = KeyTable::default();
        assert!(table.insert(hash, "alice"));
        assert!(!table.insert(hash, "bob"));
        let mut headers = http::HeaderMap::new();
        assert_eq!(table.resolve(&headers), Err(KeyError::Missing));
        headers.insert(http::header::AUTHORIZATION, "Basic sk-a".parse().unwrap());
        assert_eq!(table.resolve(&headers), Err(KeyError::Missing));
        headers.insert(http::header::AUTHORIZATION, "bearer  sk-a ".parse().unwrap());
        assert_eq!(table.resolve(&headers), Ok(&"alice"));
        headers.insert(http::header::AUTHORIZATION, "Bearer sk-b".parse().unwrap());
        assert_eq!(table.resolve(&headers), Err(KeyError::Unknown));
        assert!(!format!("{hash:?}").contains(&hash.to_hex()), "debug prints show a prefix only");
    }
}
