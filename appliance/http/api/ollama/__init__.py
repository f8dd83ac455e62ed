"""Ollama's API: /api/chat, /api/generate, its model routes and /api/embed (routes.py lists
them with what each declares)."""
