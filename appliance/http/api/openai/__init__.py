"""OpenAI's API: chat completions, completions, the Responses API and embeddings (routes.py
lists them with what each declares)."""
