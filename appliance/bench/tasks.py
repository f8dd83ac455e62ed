"""A chat front-end's background requests, as Open WebUI sends them after an answer: a title
and tags for the chat, each one user message in its default task templates' shape (`### Task:`
... `<chat_history>`), non-streamed in Open WebUI (streamed here, to time them the same way).
About 300 prompt tokens each with a two-turn history; Open WebUI's first turn of a chat costs
~895 prompt tokens over three such requests (issue 37)."""

from __future__ import annotations

TITLE = """### Task:
Generate a concise, 3-5 word title with an emoji summarizing the chat history.
### Guidelines:
- The title should clearly represent the main theme or subject of the conversation.
- Use emojis that enhance understanding of the topic, but avoid quotation marks or special formatting.
- Write the title in the chat's primary language; default to English if multilingual.
- Prioritize accuracy over excessive creativity; keep it clear and simple.
### Output:
JSON format: { "title": "your concise title here" }
### Examples:
- { "title": "📉 Stock Market Trends" },
- { "title": "🍪 Perfect Chocolate Chip Recipe" },
- { "title": "Evolution of Music Streaming" },
- { "title": "Remote Work Productivity Tips" },
- { "title": "Artificial Intelligence in Healthcare" },
- { "title": "🎮 Video Game Development Insights" }
### Chat History:
<chat_history>
{history}
</chat_history>"""

TAGS = """### Task:
Generate 1-3 broad tags categorizing the main themes of the chat history, along with 1-3 more specific subtopic tags.
### Guidelines:
- Start with high-level domains (e.g. Science, Technology, Philosophy, Arts, Politics, Business, Health, Sports)
- Consider including relevant subfields/subdomains if they are strongly represented throughout the conversation
- If content is too short (less than 3 messages) or too diverse, use only ["General"]
- Use the chat's primary language; default to English if multilingual
- Prioritize accuracy over specificity
### Output:
JSON format: { "tags": ["tag1", "tag2", "tag3"] }
### Chat History:
<chat_history>
{history}
</chat_history>"""

MAX_TOKENS = 40  # a title or a tag list; Open WebUI's own requests generated 79 tokens over three


def task_messages(messages: list[dict[str, str]]) -> list[list[dict[str, str]]]:
    """The title and tags requests' messages after an answer: the chat's last two turns."""
    history = "\n".join(f"{m['role'].upper()}: {m['content']}" for m in messages[-2:])
    return [[{"role": "user", "content": t.replace("{history}", history)}] for t in (TITLE, TAGS)]
