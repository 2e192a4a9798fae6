"""`cpr judge-check`: measure each LLM judge on a shipped gold set before a build pays for it.

A build spends most of its LLM budget on four judges (the analogy judgment, the transfer check,
the usefulness of positives, the grading of negatives). Whether a model is good enough for them
is known only after the build, unless it is measured first: this package runs the real task
classes on hand-labelled cases (`gold/`), reports agreement and Cohen's κ with the labels, and
projects what a full build would cost with that model (`projection.py`).
"""
