"""The KV cache's bookkeeping: the session table (cache), the engine's KV decisions (store)
and sessions kept across restarts (persist)."""
