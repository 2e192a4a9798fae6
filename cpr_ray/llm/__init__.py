"""The LLM layer: one client for any OpenAI-compatible endpoint, structured answers validated by
pydantic, retries and re-asks, a cache so no identical request is paid twice, a ledger of every
call, and the Ray Data actor that keeps many requests in flight."""
