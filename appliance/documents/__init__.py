"""Documents: a file's bytes (PDF, DOCX or UTF-8 text) turned into text, in a worker process
with CPU, memory and wall-clock limits, so a hostile file costs a bounded few seconds.

`reader.DocumentReader` is what the server holds; `failures` lists every error code.
"""
