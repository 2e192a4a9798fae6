"""Cross-field search: a research problem in, transferable papers from other fields out.

Modules: ``documents`` (what an index is built from), ``sharded_index`` (`cpr index`: encoding on
Ray Data's actor pools into sharded faiss indexes, incrementally), ``engine`` (the search itself,
filters inside the scan, hybrid fusion), ``llm_steps`` (the tournament reranker and explanations
through the LLM layer), ``run`` (one request end to end, shared by the CLI and the service),
``search_commands`` (`cpr index`, `cpr search`, `cpr serve`) and ``serve`` (the Ray Serve
application).
"""
