"""The office library: documents split into passages, searched by words and by meaning, cited in chats."""
