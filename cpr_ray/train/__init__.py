"""Contrastive fine-tuning of the one encoder (§4.1, App. I–M) on Ray Train.

``data``: readers of every training format into one table of examples; ``cw``: content-word
counts; ``loss``: InfoNCE over the global batch; ``step``: one optimiser step (gradient cache
included), testable without Ray; ``trainer``: the Ray Train run (workers, checkpoints, resume,
metrics, the final sentence-transformers model); ``commands``: ``cpr train``.
"""
