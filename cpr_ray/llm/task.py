"""The contract of one LLM step: which inputs key a request, what it asks, what it returns."""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cpr_ray.llm.client import LLMClient, Status, Usage
from cpr_ray.llm.prompts import Prompt

KEY = "request_key"


# what every answered row carries beside the task's own columns
ANSWER_COLUMNS = (
    KEY,
    "status",
    "error",
    "model",
    "prompt_version",
    "prompt_tokens",
    "completion_tokens",
)


def without_answer_columns(table: pa.Table) -> pa.Table:
    """A stage's output ready to be the next stage's input (its own answer columns dropped)."""
    return table.drop_columns([c for c in ANSWER_COLUMNS if c in table.column_names])


class LLMTask(ABC):
    """One LLM step: which inputs define a request, what it asks, what columns it returns.

    `output_schema` holds what the model answered (that is what the cache keeps); `derive` turns
    answers into decisions after every cache read, so a changed rule applies to old answers
    without re-asking and can never be served stale from the cache.
    """

    stage: str
    prompts: tuple[Prompt, ...]
    key_columns: tuple[str, ...]
    output_schema: pa.Schema
    # The inputs whose text comes first in the prompt's data, right after the fixed text: rows
    # that share them share the prompt's start up to the first value of the row's own (the query
    # paper a judge reads before each of its cited papers, the question a grader reads before
    # each passage). The runner asks such rows one after another (`in_ask_order`), so a prefix
    # cache (vLLM's, a provider's) still holds that start when the next of them comes.
    prefix_columns: tuple[str, ...] = ()

    @property
    def input_columns(self) -> tuple[str, ...]:
        """Columns `run` reads from a row: checked before any call."""
        return self.key_columns

    def derive(self, table: pa.Table) -> pa.Table:
        """Decision columns computed from the answer columns (none by default)."""
        return table

    @staticmethod
    def gold_label(row: dict[str, Any]) -> Any:
        """The label a derived row with a usable answer reached, in the terms of the gold set
        `cpr judge-check` measures this task against (None: no usable label). A task measured
        against one (`cpr_ray.stages`: its `gold`) says how."""
        raise NotImplementedError(f"no gold set measures this task: {row.get('status')}")

    @abstractmethod
    async def run(
        self, client: LLMClient, row: dict[str, Any], usage: Usage
    ) -> tuple[dict[str, Any], Status, str | None]:
        """Ask, check, decide: (output columns, status, reason when not ok)."""

    def in_ask_order(self, rows: pa.Table) -> pa.Table:
        """`rows` with those sharing their `prefix_columns` next to each other (a stable sort:
        otherwise in their order), the order the runner asks them in."""
        if not self.prefix_columns or rows.num_rows < 2:
            return rows
        order = pc.sort_indices(
            rows.select(list(self.prefix_columns)),
            sort_keys=[(c, "ascending") for c in self.prefix_columns],
        )
        return rows.take(order)

    @property
    def prompt_version(self) -> str:
        return "+".join(p.id for p in self.prompts)

    def empty_output(self) -> dict[str, Any]:
        return {f.name: None for f in self.output_schema}

    @property
    def schema_version(self) -> str:
        """A fingerprint of the answer's shape: an answer of another shape is another question.
        Kept with the schema it was computed from: every row's key reads it, and rendering a
        schema costs more than the rest of a key."""
        kept = self.__dict__.get("_schema_version")
        if kept is None or kept[0] is not self.output_schema:
            digest = hashlib.sha256(str(self.output_schema).encode()).hexdigest()[:12]
            kept = self.__dict__["_schema_version"] = (self.output_schema, digest)
        return kept[1]

    def request_key(
        self, model: str, row: dict[str, Any], pin: Mapping[str, Any] | None = None
    ) -> str:
        payload = {
            "stage": self.stage,
            "model": model,
            "prompts": self.prompt_version,
            "schema": self.schema_version,
            "inputs": {c: row.get(c) for c in self.key_columns},
        }
        if pin:  # a pinned answer is another question (absent otherwise: keys stay as they were)
            payload["pin"] = dict(pin)
        blob = json.dumps(payload, sort_keys=True, default=str, ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()
