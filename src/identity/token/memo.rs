//! The verified-signature memo of a key set: the same token presented
//! again is not verified again; every other check still runs.

/// The most signatures a key set remembers; past it, it forgets them all
/// and starts again (a burst of distinct tokens costs one verification
/// each, as it would with no memory at all).
pub(super) const MAX_VERIFIED_SIGNATURES: usize = 4096;

/// Signatures a key set has verified, so that the same token presented
/// again (an executor's or a gateway's every call carries its user's token)
/// is not verified again: an ES256 verification costs about 280 µs here.
///
/// What is remembered is the SHA-256 of (the key's position in the set,
/// the signing input, the signature): "this key of this set verified this
/// signature over these bytes", nothing more. Every other check (shape,
/// algorithm, key binding, `exp`/`nbf`, issuer, audience, claims) still
/// runs on every use. Only a signature that verified is ever remembered,
/// so a flood of forged tokens cannot fill it; and the memory belongs to
/// the set: when the key source rotates the set, a new set starts empty,
/// so a key removed from it verifies nothing remembered.
#[derive(Default)]
pub(super) struct VerifiedSignatures(std::sync::Mutex<std::collections::HashSet<[u8; 32]>>);

impl VerifiedSignatures {
    pub(super) fn fingerprint(key_index: usize, signing_input: &str, signature: &[u8]) -> [u8; 32] {
        use sha2::Digest as _;
        let mut hash = sha2::Sha256::new();
        hash.update((key_index as u64).to_le_bytes());
        // The signing input is base64url and dots: it never holds a NUL.
        hash.update(signing_input.as_bytes());
        hash.update([0]);
        hash.update(signature);
        hash.finalize().into()
    }

    pub(super) fn contains(&self, fingerprint: &[u8; 32]) -> bool {
        self.0.lock().is_ok_and(|set| set.contains(fingerprint))
    }

    pub(super) fn remember(&self, fingerprint: [u8; 32]) {
        // A poisoned lock only means no memory: every token is verified.
        if let Ok(mut set) = self.0.lock() {
            if set.len() >= MAX_VERIFIED_SIGNATURES {
                set.clear();
            }
            set.insert(fingerprint);
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0.lock().map_or(0, |set| set.len())
    }
}
