"""Encoders, indexes, lexical search, fusion and reranking: the one implementation every stage
retrieves with.

Candidate pooling, training, evaluation and search all build on this package, so one model is
encoded, pooled, ranked and reranked the same way everywhere. It takes plain values
(:class:`EncoderSpec` and :class:`RayEncodeOptions`, which extend the `encoder:` section's parts,
and :class:`RetrieverOptions`); their ``from_config`` are the one mapping from the config tree.

Modules: ``spec`` (the encoder's spec, its actor pool, the retrievers' options, presets by
model name), ``base`` (the retriever interface,
``PAD``, ``top_k_rows``), ``factory`` (retrievers by name), ``token_pooling`` (token states -> one
vector), ``encoder`` (the ``Encoder`` module and the text encoders over it), ``index`` (faiss with
int64 ids, saved as Parquet), ``bm25``, ``neural`` (dense and SPLADE retrievers), ``ray_encode``
(a corpus encoded on a Ray Data actor pool), ``fusion`` (reciprocal rank fusion),
``tournament`` and ``rerank`` (the LLM tournament reranker's bookkeeping and its interface),
``llm_judge`` (its two LLM calls). This module imports no torch.
"""

from cpr_ray.retrieval.base import PAD, Retriever, top_k_rows
from cpr_ray.retrieval.factory import RETRIEVERS, make_retriever
from cpr_ray.retrieval.spec import EncoderSpec, RayEncodeOptions, RetrieverOptions

__all__ = [
    "PAD",
    "RETRIEVERS",
    "EncoderSpec",
    "RayEncodeOptions",
    "Retriever",
    "RetrieverOptions",
    "make_retriever",
    "top_k_rows",
]
