"""One module per front-end (OpenAI chat, completions, llama.cpp, Ollama) and the operator routes."""
