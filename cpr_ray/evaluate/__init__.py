"""Evaluation of retrievers, rerankers and query rewriters (paper §4, App. G–H, K).

Every benchmark loads into one internal form (:class:`~cpr_ray.evaluate.benchmark.Benchmark`);
a retriever ranks each query's candidate pool or the whole corpus; metrics are pure NumPy with
seeded bootstrap intervals and the expectation under random ranking. The LLM parts (tournament
reranker, query rewriters) are reached through the small protocols in ``protocols.py``.
"""

from cpr_ray.evaluate.benchmark import Benchmark
from cpr_ray.evaluate.metrics import METRICS

__all__ = ["METRICS", "Benchmark"]
