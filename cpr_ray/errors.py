"""The one error contract: what a user can cause and fix, as opposed to a bug.

Every error a user can fix derives from `UserError`. The CLI and every `jobs/*.py` catch exactly
this class, print its one-line message and exit 2; anything else is a bug and shows its traceback
(exit 1). Catching `ValueError` there instead would hide real bugs behind a "user mistake".
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix; the message names the thing to fix."""

    exit_code = 2  # what the CLI and a job exit with after its one line


class ConfigError(UserError):
    """A config key or value that cannot be used; the message names the key."""


class StorageError(UserError):
    """Storage that cannot be reached or used; the message says what to check."""


class InputError(UserError):
    """Input data (shards, benchmark files, training files) that cannot be read as given."""


class LLMConfigError(UserError):
    """An LLM endpoint that refuses us as configured (bad key, model or URL): fix the config."""


class LLMStageError(UserError):
    """An LLM stage stopped because its calls failed; nothing was published."""


class SpendCapError(UserError):
    """An LLM stage stopped at a spend cap (llm.max_usd); nothing was published."""


class LocalServerError(UserError):
    """The embedded local LLM server could not be built or started."""
