"""OpenAI's API: chat completions, completions and the Responses API."""
