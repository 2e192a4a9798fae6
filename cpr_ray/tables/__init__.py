"""Table plumbing: hash buckets, column helpers, table files, compaction, the DuckDB
engine inside Ray tasks, and the Arrow schemas of the corpus tables."""
