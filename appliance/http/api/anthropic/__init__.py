"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens), as the `anthropic`
SDK and tools written against it call it."""
