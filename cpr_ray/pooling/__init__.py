"""The N1 candidate-pooling stage (§3.3): hard-negative candidates for every positive's query.

Modules: ``pool_schemas`` (the published ``queries``/``candidates`` contract and the internal
tables), ``pool_rules`` (pure functions: the date rule, topic groups, rejected citations, the
round-robin fill order), ``pooler_search`` (one pooler's per-group ranked lists with the date and
topic filters inside the search), ``universe_shards`` (the universe in shards: a paper's shard, the
memory a shard asks of Ray, the exact merge of the shards' lists), ``poolers`` (the
per-pooler plan and its search actor),
``embeddings`` (the cross-run embedding store, encoding what it lacks on an actor pool, and a
run's index), ``pool_stage`` (the `pool` stage: wiring, phases, publishing). Encoders, faiss, SPLADE
and BM25 are ``cpr_ray.retrieval``'s.
"""
