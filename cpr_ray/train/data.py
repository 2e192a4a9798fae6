"""Training data: every supported format read into one table of examples, then filtered and
sampled the same way (§4.1, App. I).

The internal form (``EXAMPLES``) is one row per query: its text, its positive, its hard
negatives (possibly none), a key per document (S2 corpus id for CPR, a hash of the text
otherwise: equal keys are the same document, which is how the loss keeps a document from being
a negative of a query it is the positive of), its content-word count, field and domain.

Formats (one module each in ``formats/``), as their public releases lay them out (one
JSONL/Parquet file or a folder of them, except CPR):

- ``cpr``: a dataset export folder: ``cpr-train`` (query_id, query, base_corpus_id, positive_id,
  negative_ids, field, domain) with texts from ``corpus`` (corpus_id, title, abstract, domain).
- ``triplets``: ``query``, ``positive``, ``negatives`` (list, may be empty or absent); optional
  ``query_id``, ``field``, ``domain``.
- ``msmarco``: MS MARCO v1.1 train: ``query``, ``query_id``, ``passages`` as Hugging Face gives
  it (a struct of lists ``is_selected``, ``passage_text``, ``url``) or as the original JSON does
  (a list of such structs). Queries with exactly one selected passage and at least 9 unselected
  ones; the first 9 unselected are the negatives.
- ``reasonir``: ReasonIR HQ and VL: ``query`` ([instruction, text]), ``pos`` and ``neg`` (lists
  of [instruction, text]); our own instructions replace theirs. HQ positives are BRIGHT
  document ids, filled from ``train.reasonir_documents`` (id, content).
- ``specter``: SciRepEval ``cite_prediction``: ``query``, ``pos``, ``neg`` papers (title,
  abstract); every paper becomes "title. abstract".

A file that breaks its format (a missing column, a wrong type, a null or empty text where one
is required, a line that is not JSON, a CPR id missing from the corpus) raises `InputError`
naming the file, the line or row and the column, before any training. Examples the method leaves
out (an empty text, a positive among its negatives, a repeated negative, an MS MARCO query
without one selected and nine unselected passages, a held-out domain) are dropped and counted
by reason in the stats.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from cpr_ray.storage.store import Storage
from cpr_ray.train.examples import DataOptions
from cpr_ray.train.filters import prepare
from cpr_ray.train.formats import read_raw


def read_examples(storage: Storage, options: DataOptions) -> tuple[pa.Table, dict[str, Any]]:
    """The training examples of `options.data` in the internal form, and what was dropped."""
    raw, dropped = read_raw(storage, options)
    examples, stats = prepare(raw, options)
    return examples, {"format": options.format, "data": options.data, **dropped, **stats}
