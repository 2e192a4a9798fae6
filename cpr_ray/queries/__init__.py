"""Query writing (App. B.3) and per-base-paper deduplication (App. B.4)."""
