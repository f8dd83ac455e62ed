"""The scheduler's policies, one object each (as mini-sglang splits its scheduler): the
admission window, fair shares between clients, the background lane, prompt chunking.
Pure: no llama.cpp, an injected clock; the Scheduler composes them."""
