"""The HTTP side: the Starlette app, the front door, the one request path and the API
front-ends. It talks to the engine through handles and the snapshot, never to llama.cpp."""
