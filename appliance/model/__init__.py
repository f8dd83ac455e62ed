"""The model: GGUF files, the llama.cpp wrapper and the chat template. The only package
that imports llama_cpp."""
