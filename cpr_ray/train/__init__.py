"""Contrastive fine-tuning of the one encoder (§4.1, App. I–M) on Ray Train.

``data`` and ``formats/``: readers of every training format into one table of examples
(``examples``: its schema and options); ``filters``: the method's filters and each query's
content-word count; ``loss``: InfoNCE over the global batch; ``step``: one optimiser step (gradient
cache included), testable without Ray; ``memory_plan``, ``sharding`` and ``lora``: what a model
needs per GPU and how it is split; ``trainer`` and ``checkpoints``: the Ray Train run (workers,
checkpoints, resume, metrics, the final sentence-transformers model); ``card_facts``: what the model
card says; ``train_command``: ``cpr train``.
"""
