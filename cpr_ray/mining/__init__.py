"""Cross-topic citation mining (§3.2 P1): top venues, base papers, topic-disjoint pairs."""
