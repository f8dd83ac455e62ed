"""llama-server's own routes: /completion, /infill, /tokenize, /detokenize, /props, /slots."""
