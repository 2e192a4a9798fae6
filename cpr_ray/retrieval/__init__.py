"""Encoders, indexes and lexical search: the one implementation every stage retrieves with.

Candidate pooling, training, evaluation and search all build on this package, so one model is
encoded, pooled and searched the same way everywhere. It takes plain dataclasses
(:class:`EncoderSpec`, :class:`RetrieverOptions`); `EncoderSpec.from_config` is the one mapping
from the config tree.

Modules: ``spec`` (the dataclasses, presets by model name), ``base`` (the retriever interface,
``PAD``, ``top_k_rows``), ``factory`` (retrievers by name), ``token_pooling`` (token states -> one
vector), ``encoder`` (the ``Encoder`` module and the text encoders over it), ``index`` (faiss with
int64 ids, saved as Parquet), ``bm25``, ``neural`` (dense and SPLADE retrievers), ``ray_encode``
(a corpus encoded on a Ray Data actor pool). This module imports no torch.
"""

from cpr_ray.retrieval.base import PAD, Retriever, top_k_rows
from cpr_ray.retrieval.factory import RETRIEVERS, make_retriever
from cpr_ray.retrieval.spec import EncoderSpec, RetrieverOptions

__all__ = [
    "PAD",
    "RETRIEVERS",
    "EncoderSpec",
    "Retriever",
    "RetrieverOptions",
    "make_retriever",
    "top_k_rows",
]
