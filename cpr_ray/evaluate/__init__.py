"""Evaluation of retrievers, rerankers and query rewriters (paper §4, App. G–H, K).

Every benchmark loads into one internal form (:class:`~cpr_ray.evaluate.benchmark.Benchmark`);
a retriever ranks each query's candidate pool or the whole corpus; metrics are pure NumPy with
seeded bootstrap intervals and the expectation under random ranking. The tournament reranker
and fusion are `cpr_ray.retrieval`'s (search shares them); the query rewriters are
``rewriters.py``, behind the protocol in ``protocols.py``.
"""

from cpr_ray.evaluate.benchmark import Benchmark
from cpr_ray.evaluate.ir_metrics import METRICS

__all__ = ["METRICS", "Benchmark"]
