"""Per-token log-probs of given responses (policy, old policy, reference, SFT)."""
