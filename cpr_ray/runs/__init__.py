"""Run machinery: stage running and manifests, progress, Prometheus metrics, failure
records, the Ray runtime, command-line plumbing and experiment tracking."""
