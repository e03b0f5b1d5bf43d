"""The decoder: one speculative loop (B prompts at a time), its KV cache, verification, the drafters, sampling,
the target-only baseline, the clock and the records a run hands to storage."""
