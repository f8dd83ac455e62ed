"""The front-ends, one folder per API they speak: openai/ (chat, completions, responses),
llama/ (llama-server's own routes), ollama/, and appliance/ (health, metrics, sessions, the
page, admin, documents). A module here imports only the shared modules of http/, never
another folder's (tests/project/test_layout.py)."""
