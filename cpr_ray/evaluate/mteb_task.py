"""CPR-eval as MTEB tasks: ``mteb.evaluate(model, tasks=[CPREval(export)])`` runs any model MTEB
can run on a cpr-ray export, with MTEB's own encoding, search and scoring (pytrec_eval).

Two tasks, the two protocols of `cpr eval`:

- :class:`CPREval` (``--benchmark cpr``): each query ranks its own candidate pool (the positive
  and its hard negatives, 151 in the full set). The pools are MTEB's ``top_ranked`` candidate
  lists, its mechanism for reranking tasks: the encoder wrapper encodes the documents once and
  scores each query against its own list only, as `cpr eval` does (task type ``Reranking``).
- :class:`CPREvalFull` (``--benchmark cpr-full``): the whole exported corpus is searched, and a
  query's own base paper is never returned. MTEB's only exclusion, ``ignore_identical_ids``,
  drops a document whose id equals the query's id; several queries share a base paper, so it
  cannot express this. The exclusion is applied where the task receives the model: its
  ``_evaluate_subset`` hands MTEB's evaluator a search model (:class:`WithoutExcluded`) that
  asks the user's model for ``top_k`` + 1 hits and removes each query's base paper before MTEB
  scores them (and before ``prediction_folder`` saves them), exactly as the runner's
  ``drop_excluded`` does. MTEB's data, search and metric code run unchanged.

Data: the export (a local path or ``s3://…`` through our :class:`~cpr_ray.storage.store.Storage`) is
read by `load_cpr`, the loader `cpr eval` uses, so both see the same queries (records it rejects
are left out of both; see ``task.benchmark.rejects``), documents and document texts
(`document_texts`: title and abstract, given to MTEB as the document's ``text`` with no separate
``title``, so MTEB reads exactly the string we encode). Queries are the exported text. MTEB's
split is ``test``, its subset ``default``.

Instructions: MTEB lets the model choose its prompts (a sentence-transformers model's own
``prompts``, or ``model_prompts`` of mteb's wrapper); `cpr eval` prefixes queries and documents
by ``encoder.query_prefix`` / ``doc_prefix`` or the preset of the model's name (E5's
``query: ``). To compare the two, give the MTEB model the same prefixes, e.g.
``SentenceTransformerEncoderWrapper(model, model_prompts={"query": "query: ",
"document": "passage: "})``; MiniLM has none on either side.

Scores: nDCG@10 and Recall@k agree with `cpr eval` (CPR-eval's relevance is binary, so MTEB's
linear-gain nDCG equals ours; MTEB reports them rounded to 5 places, its per-query pytrec_eval
scores agree to 1e-6) when no two candidates of a query score the same. On a tie the
order differs: pytrec_eval puts the larger document id first; our runner breaks ties within a
pool by a seeded random key and, over the corpus, puts the lower corpus id first. Dense scores
only tie on identical texts. The main score is Recall@10, CPR-eval's primary metric.

Revision: each task's dataset revision is its export's (`export_revision`: the format and a
fingerprint of the split table's and corpus' files), and `cpr eval` writes the same into its
MTEB file, so a result records which export it was made on. MTEB's result cache still returns
a complete cached result for the same model and task name without running, whatever its
revision (mteb 2.26, ``overwrite_strategy="only-missing"``, the default); pass ``cache=None``,
a cache folder per export, or ``overwrite_strategy="always"`` when evaluating another export of
the same name.

Needs the ``mteb`` extra (``pip install 'cpr-ray[mteb]'``); `cpr eval` itself does not.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

try:
    from datasets import Dataset
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData
    from mteb.abstasks.task_metadata import TaskMetadata
    from mteb.models import (
        CrossEncoderProtocol,
        EncoderProtocol,
        SearchCrossEncoderWrapper,
        SearchEncoderWrapper,
        SearchProtocol,
    )
except ImportError:
    raise ImportError(
        "cpr_ray.evaluate.mteb_task needs mteb, which is not installed: pip install 'cpr-ray[mteb]'"
    ) from None

from cpr_ray.evaluate.benchmark import Benchmark
from cpr_ray.evaluate.loaders.cpr_eval import load_cpr
from cpr_ray.evaluate.mteb_results import (
    DATASET_REVISION,
    DEFAULT_TABLE,
    LANGUAGES,
    MAIN_SCORE,
    SPLIT,
    SUBSET,
    TASK_NAMES,
    export_revision,
)
from cpr_ray.retrieval.base import PAD
from cpr_ray.storage.store import Storage, StorageConfig

__all__ = ["CPREval", "CPREvalFull", "WithoutExcluded"]
logger = logging.getLogger(__name__)

_METADATA: dict[str, Any] = {
    "dataset": {"path": "cpr-ray export (the task's source)", "revision": DATASET_REVISION},
    "category": "t2t",
    "modalities": ["text"],
    "eval_splits": [SPLIT],
    "eval_langs": LANGUAGES,
    "main_score": MAIN_SCORE,
    "date": ("2010-01-01", "2025-12-31"),  # base papers' publication years (§3.2)
    "domains": ["Academic", "Written"],
    "license": "multiple",  # per-paper abstract licences (the corpus' abstract_license)
    "annotations_creators": "LM-generated",  # LLM judges, App. B
    "dialect": [],
    "sample_creation": "LM-generated and verified",  # queries written and reviewed, App. B.3
    "bibtex_citation": "",
}


class _CPRTask(AbsTaskRetrieval):
    """A CPR-eval export as an MTEB retrieval task; the subclasses fix the protocol."""

    full: bool = False

    def __init__(
        self,
        source: str,
        *,
        storage: Storage | None = None,
        table: str = DEFAULT_TABLE,
        **kwargs: Any,
    ) -> None:
        """`source`: the export folder (a path, ``file://…`` or ``s3://…``); `storage`: how to
        reach it (an S3 endpoint, region, …; default: plain local / AWS access); `table`: the
        split table to evaluate (``cpr-eval``). Nothing is read until MTEB loads the data."""
        if not source:
            raise ValueError(f"{type(self).__name__}: source must name a cpr-ray export")
        super().__init__(**kwargs)
        self.source = source
        self.table = table
        self.storage = storage or Storage(StorageConfig())
        # this export's revision, not the class's: MTEB's cache records it with each result
        revision = export_revision(self.storage, source, table)
        dataset = {**self.metadata.dataset, "revision": revision}
        self.metadata = self.metadata.model_copy(update={"dataset": dataset})
        self.benchmark: Benchmark | None = None  # what load_cpr returned, once loaded
        self._excluded: dict[str, frozenset[str]] = {}

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        if self.data_loaded:
            return
        bench = load_cpr(self.storage, self.source, split=self.table, full=self.full)
        self.benchmark = bench
        if bench.rejects:
            logger.warning(
                "%s: %d record(s) of %s break the export format and are not evaluated "
                "(task.benchmark.rejects lists them)",
                self.metadata.name,
                len(bench.rejects),
                self.source,
            )
        self.dataset = {SUBSET: {SPLIT: split_data(bench)}}
        self._excluded = excluded_ids(bench)
        self.data_loaded = True

    def unload_data(self) -> None:
        self.benchmark, self._excluded = None, {}
        super().unload_data()

    def _evaluate_subset(self, model: Any, data_split: RetrievalSplitData, **kwargs: Any):
        if self._excluded:
            model = WithoutExcluded(search_model(model), self._excluded)
        return super()._evaluate_subset(model, data_split, **kwargs)


class CPREval(_CPRTask):
    """CPR-eval as the method evaluates it: each query ranks its own candidate pool."""

    metadata = TaskMetadata(
        name=TASK_NAMES["cpr"],
        description="Cross-Pollination Retrieval: for a research problem written as a 'How to "
        "...' query, rank its candidate papers (one positive from another field whose idea "
        "carries over, and its LLM-judged hard negatives) by how useful they are.",
        type="Reranking",
        task_subtypes=["Scientific Reranking"],
        **_METADATA,
    )


class CPREvalFull(_CPRTask):
    """CPR-eval over the whole exported corpus; a query's own base paper is never returned."""

    full = True
    metadata = TaskMetadata(
        name=TASK_NAMES["cpr-full"],
        description="Cross-Pollination Retrieval over the whole corpus: for a research problem "
        "written as a 'How to ...' query, retrieve the paper from another field whose idea "
        "carries over; the paper the query was written from is never returned.",
        type="Retrieval",
        task_subtypes=["Article retrieval"],
        **_METADATA,
    )


def split_data(bench: Benchmark) -> RetrievalSplitData:
    """A loaded benchmark in MTEB's form: corpus, queries, qrels and (with pools) top_ranked."""
    ids = bench.doc_ids
    corpus = Dataset.from_dict({"id": list(ids), "text": list(bench.doc_texts)})
    queries = Dataset.from_dict({"id": list(bench.query_ids), "text": list(bench.queries)})
    qrels = {
        q: {ids[pos]: int(grade) for pos, grade in rel.items()}
        for q, rel in zip(bench.query_ids, bench.qrels)
    }
    top_ranked = None
    if bench.pools is not None:
        top_ranked = {
            q: [ids[p] for p in row if p != PAD] for q, row in zip(bench.query_ids, bench.pools)
        }
    return RetrievalSplitData(
        corpus=corpus, queries=queries, relevant_docs=qrels, top_ranked=top_ranked
    )


def excluded_ids(bench: Benchmark) -> dict[str, frozenset[str]]:
    """Per query, the ids of the documents it must never be shown (cpr-full: its base paper)."""
    if bench.excluded is None:
        return {}
    return {
        q: frozenset(bench.doc_ids[p] for p in ex)
        for q, ex in zip(bench.query_ids, bench.excluded)
        if len(ex)
    }


def search_model(model: Any) -> Any:
    """The search model MTEB's retrieval task makes of `model` (its own dispatch, in order)."""
    if isinstance(model, EncoderProtocol) and not isinstance(model, SearchProtocol):
        return SearchEncoderWrapper(model)
    if isinstance(model, CrossEncoderProtocol):
        return SearchCrossEncoderWrapper(model)
    if isinstance(model, SearchProtocol):
        return model
    raise TypeError(f"MTEB cannot search with a {type(model).__name__}")


class WithoutExcluded:
    """An MTEB search model that never returns a query's excluded documents.

    It asks `inner` for as many more hits as a query has excluded documents at most, drops the
    excluded ones and keeps the best `top_k` of the rest, as `cpr_ray.retrieval.ranking.
    drop_excluded` does for `cpr eval`.
    """

    def __init__(self, inner: Any, excluded: Mapping[str, frozenset[str]]) -> None:
        self.inner = inner
        self.excluded = excluded
        self.extra = max((len(e) for e in excluded.values()), default=0)

    @property
    def mteb_model_meta(self) -> Any:
        return self.inner.mteb_model_meta

    def index(self, corpus: Any, **kwargs: Any) -> None:
        self.inner.index(corpus, **kwargs)

    def search(self, queries: Any, *, top_k: int, **kwargs: Any) -> dict[str, dict[str, float]]:
        found = self.inner.search(queries, top_k=top_k + self.extra, **kwargs)
        out: dict[str, dict[str, float]] = {}
        for qid, hits in found.items():
            drop = self.excluded.get(qid, frozenset())
            # best first, ties as pytrec_eval orders them (larger id first)
            kept = sorted(((s, d) for d, s in hits.items() if d not in drop), reverse=True)
            out[qid] = {d: s for s, d in kept[:top_k]}
        return out
