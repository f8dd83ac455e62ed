"""Ollama's API: /api/chat, /api/generate and its model routes."""
