"""Hard negatives, the leak-free split and the export (§3.3 N2, §3.4).

`split` (pure: which query goes where, and the leakage check), `negatives` (the judge-negatives
stage), `format` (the export's schemas, defined once), `export` (the export stage and its card),
`hydrate` (`cpr hydrate`: abstracts an export may not carry, from the user's own S2 shards).
"""
