"""The engine: one thread that owns the llama.cpp context and runs every request.

The HTTP side holds a `Handle` per request (events out, cancel in) and reads the published
`Snapshot`; everything else here is the engine thread's own.
"""
