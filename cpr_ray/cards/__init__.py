"""The cards cpr-ray writes: the dataset card of an export (`dataset_card.py`) and the model card
of a trained retriever (`model_card.py`), each rendered from plain values; and the model's
evaluation ledger beside its card (`evaluations.py`). Gathering what a card says is its writer's
job (the export stage, `cpr_ray.train.card_facts`), so this package imports no stage package."""
