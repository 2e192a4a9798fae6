"""A deterministic synthetic raw corpus: Semantic Scholar bulk shards plus an OpenAlex snapshot.

Why: benchmarks and scale tests need the build's raw inputs at any size (a million papers on a
laptop, hundreds of millions on a cluster) without downloading or redistributing real data, and
with a known ground truth to check the build against. The records copy the real formats in
`shared/reference` (keys, nesting, URL-form ids, ids as strings in some exports, upper-case DOIs,
broken lines), so the ingest reads this output exactly as it reads the real dumps:

    OUT/s2/papers/papers-NNNN.jsonl.gz            OUT/s2/abstracts/abstracts-NNNN.jsonl.gz
    OUT/s2/citations/citations-NNNN.jsonl.gz
    OUT/s2/publication-venues/publication-venues-0000.jsonl.gz
    OUT/openalex/works/updated_date=2026-10-01/part_NNNN.gz
    OUT/openalex/sources/updated_date=2026-10-01/part_0000.gz

Ground truth, fixed by design:
- Paper i has corpusid `CORPUS_ID_BASE + 3i + (0..2)`. A share `overlap` of papers has an
  OpenAlex work `W<WORK_ID_OFFSET + corpusid>`, joinable by DOI (85%; the S2 DOI is upper-case for
  a quarter of papers, the OpenAlex one a lower-case URL), else only by MAG (10%) or only by PubMed
  (5%). The other papers have no work; about 5% of works (`W >= OA_ONLY_WORK_BASE`) have no
  paper. MAG ids equal the W number, as in OpenAlex.
- Venue v is an S2 publication venue (a uuid) and OpenAlex source `S<SOURCE_ID_BASE + v>`; they
  share an ISSN (S2 `issn`/`alternate_issns` against OpenAlex `issn_l`/`issn`). Repository
  sources have no S2 venue and no ISSN.
- Topics: the 26 fields and 4 domains of `taxonomy.py`, 10 subfields per field (id field*100+k)
  and 15 topics per subfield, names made up but the same for every seed (the hierarchy is
  OpenAlex's, not the corpus's). A work has 1-3 topics, mostly within its first topic's field.
- Citations run between S2 papers, ~80% within the citing field, to a paper published no later
  than the citing one where one exists, half to recent papers and half by a log-normal fitness
  (a heavy tail of citation counts); ~10% are unresolved (null cited id); pairs are unique.
- Malformed lines are extra lines (they never replace a record): truncated JSON, non-JSON
  garbage, a record without its id, a record with a bad id; each shard of each S2 table and of
  the works gets Binomial(rows, malformed_rate) of them at random positions.

Speed: columns are built with numpy, pyarrow and polars; polars encodes the JSON lines and gzips
them (level 1). Python loops only over small things (taxonomy, venues, malformed lines, the few
works with an abstract inverted index). 1M papers and 10M citations take about 45 s on 2 cores.
"""

from cpr_ray.sample.synthetic.design import (
    CORPUS_ID_BASE,
    OA_ONLY_WORK_BASE,
    PMID_BASE,
    SNAPSHOT_DATE,
    SOURCE_ID_BASE,
    TOPIC_ID_BASE,
    WORK_ID_OFFSET,
    SyntheticStats,
)
from cpr_ray.sample.synthetic.generate import generate, main

__all__ = [
    "CORPUS_ID_BASE",
    "OA_ONLY_WORK_BASE",
    "PMID_BASE",
    "SNAPSHOT_DATE",
    "SOURCE_ID_BASE",
    "TOPIC_ID_BASE",
    "WORK_ID_OFFSET",
    "SyntheticStats",
    "generate",
    "main",
]
