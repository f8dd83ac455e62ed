"""What each `appliance bench` workload sends: the system prompt, the questions, follow-ups,
rewrite texts and burst products, and the filler document that makes a prompt long."""

from __future__ import annotations

import uuid
from typing import Literal

CHARS_PER_TOKEN = 4  # rough English average, good enough to size the long paste


DEFAULT_SYSTEM = (
    "You are a helpful assistant for a small office. Answer clearly and concisely, "
    "use plain language, and say so when you are not sure. Keep answers short unless "
    "the user asks for detail."
)

PROMPTS: tuple[str, ...] = (
    "What is the difference between a list and a tuple in Python?",
    "Write a short polite email declining a meeting invitation.",
    "Explain what DNS does in two sentences.",
    "Give me three tips for writing clear commit messages.",
    "How do I convert Celsius to Fahrenheit?",
    "Summarise the plot of Romeo and Juliet in one paragraph.",
    "What does HTTP status code 404 mean?",
    "Suggest a name for a team wiki page about onboarding.",
    "How can I find the largest files on a Linux disk?",
    "What is a good way to structure a weekly status report?",
    "Explain recursion to a beginner with a small example.",
    "What are the pros and cons of working from home?",
    "Write a SQL query that counts orders per customer.",
    "How do I make a strong password that I can remember?",
    "What is the capital of Australia, and why not Sydney?",
    "Rewrite this sentence to be more formal: we gotta ship it by friday.",
)

# Turns 2..T of a conversation; short, so the growing history is mostly the model's answers.
FOLLOW_UPS: tuple[str, ...] = (
    "Can you say more?",
    "Give me an example.",
    "Summarise that in one line.",
    "Why is that?",
    "What would you do differently?",
    "Explain it to a beginner.",
    "Is there a simpler way?",
    "What are the risks?",
)

# --workload rewrite: the user pastes text and asks for it back with small fixes, so most of
# the answer copies the prompt (what n-gram speculative decoding drafts from). Prose and code
# alternate, so neighbouring users differ in kind as well as in text. Paragraphs are 60-120
# words with a few typos, snippets 8-15 lines with one small bug: one answer fits in ~160 tokens.
_PROSE: tuple[str, ...] = (
    "Next monday the finance team will move from the third floor to the new offices on the "
    "ground floor. Please pack your desks by Friday afternoon and label every box with your "
    "name and teh room number. The movers will arrive at seven in the morning, so the lifts "
    "will be busy untill about ten. If you have equipment that needs special handling, such as "
    "monitors or the shared scanner, tell Maria before Thursday so she can arange extra help. "
    "Thank you for your patience during the move.",
    "From the first of next month, all staff accounts will require a password of at least "
    "twelve characters. The IT team recomends using a short sentence that is easy to remember "
    "but hard to guess, rather than a single word with numbers added at the end. Passwords will "
    "no longer expire every ninety days, but you must change yours immediatly if you think "
    "someone else has seen it. Never share your password by email or chat, even with colleages "
    "from IT, who will never ask for it.",
    "Thank you for contacting us about the late delivery of your order. We are sorry that the "
    "parcel arrived four days after the date we promised, and we understand how frustating this "
    "must have been. The delay was caused by a problem at our regional warehouse, which has now "
    "been resolved. As an apology, we have refunded the delivery charge to your orginal payment "
    "method; it should apear within five working days. Please do not hesitate to get in touch "
    "if there is anything else we can do for you.",
    "In this week's planning meeting the team aggreed to postpone the website redesign until "
    "the new brand guidelines are finished. Sam will complete the accessibility audit of the "
    "current site by the end of the month, and the results will decide which pages we fix "
    "first. Priya raised concerns about the hosting costs, wich have risen by almost a third "
    "since last year. We will compare at least two other providers before the contract renews "
    "in Febuary. The next meeting is on Tuesday at half past ten in the small conference room.",
    "The new standing desk adjusts smoothly from 65 to 125 centimetres at the touch of a "
    "button, and it remembers up to four height settings. Its steel frame supports loads of up "
    "to eighty kilograms, which is enough for two large monitors and a laptop. The desktop is "
    "made from recycled wood with a scratch-resistent finish that is easy to clean. Assembly "
    "takes about thirty minutes with the tools included in the box. Every desk comes with a "
    "five year waranty on the frame and the motor, and a two year waranty on the controls.",
    "Our spring clean-up day was a great sucess thanks to the forty volunteers who joined us in "
    "the park on Saturday. Together we collected more than sixty bags of litter, cleared the "
    "overgrown path by the pond and planted two hundred bulbs along the main entrance. The local "
    "bakery kindly donated coffee and pastries for everyone, and several children made posters "
    "asking visitors to take there rubbish home. We will definately organise another event in "
    "the autumn, so keep an eye on the noticeboard and our website for the date.",
    "Employees who wish to take annual leave should submit a request through the HR portal at "
    "least two weeks in advance. Requests for more then five consecutive days need approvel "
    "from both your manager and the head of department. Unused leave of up to five days can be "
    "carryed over into the next year, but it must be taken before the end of March or it will "
    "be lost. If you are unsure how many days you have left, the portal shows your current "
    "balance on the home page under the heading 'My Absences'.",
    "Version 2.4 of the reporting tool introduces sheduled exports, so you can have any saved "
    "report emailed to you every morning as a spreadsheet. We have also rewritten the search "
    "page, which now returns results about three times faster on large acounts. Charts can be "
    "copied directly into presentations with thier colours and labels intact. This release "
    "fixes a bug that caused some dates to be shown in the wrong time zone after the clocks "
    "changed. As always, please report any problems through the feedback button in the top "
    "right corner of the screen.",
)

# (fence tag, language name, snippet); each has exactly one small bug or typo.
_CODE: tuple[tuple[str, str, str], ...] = (
    ("python", "Python", '''\
def average_order_value(orders):
    """Return the mean total of the given orders, or 0.0 if there are none."""
    if not orders:
        return 0.0
    total = 0
    for order in orders:
        total += order["total"]
    return total / len(order)'''),
    ("javascript", "JavaScript", '''\
function formatPrice(cents, currency = "EUR") {
  if (!Number.isInteger(cents)) {
    throw new TypeError("cents must be an integer");
  }
  const amount = cents / 100;
  return new Intl.NumberFormat("en-GB", {
    style: "currency",
    currency: currency,
  }).format(amout);
}

console.log(formatPrice(1999));'''),
    ("sql", "SQL", '''\
SELECT c.customer_id,
       c.name,
       COUNT(o.order_id) AS orders,
       SUM(o.total) AS revenue
FROM customers c
JOIN orders o ON o.customer_id = c.customer_id
WHERE o.created_at >= DATE '2024-01-01'
GROUP BY c.customer_id, c.name
ORDER BY revenu DESC
LIMIT 10;'''),
    ("python", "Python", '''\
import csv


def load_prices(path):
    prices = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            name = row["product"].strip()
            price = float(row["price"])
            if price < 0:
                raise ValueError(f"negative price for {name}")
            prices[name] = price
    retrun prices'''),
    ("javascript", "JavaScript", '''\
async function fetchUsers(baseUrl) {
  const response = await fetch(`${baseUrl}/api/users`);
  if (!response.ok) {
    throw new Error(`request failed: ${response.status}`);
  }
  const users = response.json();
  return users
    .filter((user) => user.active)
    .map((user) => ({ id: user.id, name: user.name }));
}'''),
    ("python", "Python", '''\
def chunk(items, size):
    """Split items into lists of at most `size` elements."""
    if size < 1:
        raise ValueError("size must be at least 1")
    chunks = []
    for start in range(0, len(items), size):
        chunks.append(items[start:start + size - 1])
    return chunks


print(chunk([1, 2, 3, 4, 5], 2))'''),
    ("sql", "SQL", '''\
UPDATE employees
SET salary = salary * 1.05,
    updated_at = CURRENT_TIMESTAMP,
WHERE department_id = (
    SELECT department_id
    FROM departments
    WHERE name = 'Support'
)
AND hired_on < DATE '2023-01-01';'''),
    ("python", "Python", '''\
from datetime import date


def age_on(birthday: date, today: date) -> int:
    """Whole years between birthday and today."""
    years = today.year - birthday.year
    if (today.month, today.day) > (birthday.month, birthday.day):
        years -= 1
    return years


assert age_on(date(2000, 6, 15), date(2024, 6, 14)) == 23'''),
)

# Later turns ask for the whole text again, so they copy too (from the previous answer).
_PROSE_FOLLOW_UPS: tuple[str, ...] = (
    "Now also make it more formal and return the whole text again.",
    "Now split the longest sentence in two and return the whole text again.",
    "Now use British spelling throughout and return the whole text again.",
    "Now replace any informal words and return the whole text again.",
)
_CODE_FOLLOW_UPS: tuple[str, ...] = (
    "Now also add a short comment explaining the fix and return the whole code again.",
    "Now rename any unclear variable and return the whole code again.",
    "Now format it consistently and return the whole code again.",
    "Now add a one-line comment at the top saying what it does and return the whole code again.",
)


def _rewrite_prompt(i: int) -> tuple[str, tuple[str, ...]]:
    """Prompt i of the rewrite pool and its follow-ups: prose at even i, code at odd i."""
    if i % 2 == 0:
        ask = ("Fix the typos in this paragraph and return only the corrected text:"
               if i % 4 == 0 else
               "Correct the spelling and grammar of this paragraph, changing as little as "
               "possible, and return only the corrected text:")
        return f"{ask}\n\n{_PROSE[i // 2]}", _PROSE_FOLLOW_UPS
    tag, language, code = _CODE[i // 2]
    return (f"Fix the bug in this {language} code and return only the corrected code:\n\n"
            f"```{tag}\n{code}\n```", _CODE_FOLLOW_UPS)


_REWRITE = [_rewrite_prompt(i) for i in range(len(_PROSE) + len(_CODE))]
REWRITE_PROMPTS: tuple[str, ...] = tuple(p for p, _ in _REWRITE)
REWRITE_FOLLOW_UPS: tuple[tuple[str, ...], ...] = tuple(f for _, f in _REWRITE)

# --workload burst: one person pastes a list of products and asks for a description of each,
# all at once (a script, or 20 browser tabs); every answer must come back.
PRODUCTS: tuple[str, ...] = (
    "a stainless steel water bottle", "a wireless ergonomic mouse", "a standing desk mat",
    "a noise-cancelling headset", "a recycled paper notebook", "a USB-C docking station",
    "a desk lamp with a dimmer", "a whiteboard with magnetic markers", "a mesh office chair",
    "a 27-inch monitor arm", "a compact label printer", "a ceramic coffee mug",
    "a cable management tray", "a portable projector", "a mechanical keyboard",
    "a filing cabinet with a lock", "a webcam with a privacy shutter", "a shredder for paper and cards",
    "a laptop stand made of bamboo", "a set of reusable sticky notes",
)
BURST_PROMPTS: tuple[str, ...] = tuple(
    f"Write a 2-sentence description for this product in our online shop: {p}." for p in PRODUCTS)
BURST_SIZE = len(PRODUCTS)

# --workload office: one office tool's system prompt (the same text from every PC), short
# questions (PROMPTS), and now and then a pasted document to summarise, then follow-ups.
OFFICE_SYSTEM = (
    "You are the assistant built into the office tools of a small company. Staff ask you about "
    "their work: emails, letters, meeting notes, spreadsheets, reports, schedules and everyday "
    "IT questions. Answer in plain, friendly language and keep answers short: a few sentences, "
    "or a short list when steps are asked for. When a user pastes a document, base your answer "
    "on that document only and say when it does not contain what was asked. Never invent names, "
    "figures or dates. Do not give legal, medical or financial advice; suggest asking the right "
    "colleague instead. If a request is unclear, ask one short question back."
)
# The ask after a pasted document (the document goes first, as a paste does).
DOC_ASKS: tuple[str, ...] = (
    "Summarise this document in three sentences.",
    "What are the main points of this document? Give me a short list.",
    "Summarise these minutes for someone who missed the meeting.",
)
# Follow-ups on a summarised document; questions are followed up with FOLLOW_UPS.
DOC_FOLLOW_UPS: tuple[str, ...] = (
    "What are the action items?",
    "Which of these points is the most urgent?",
    "Write a two-line email to the team about it.",
    "Is anything in it unclear or missing?",
)

WorkloadName = Literal["chat", "rewrite", "burst", "soak", "office"]
# What each --workload sends: prompts[k] opens conversation k, follow_ups[k % len] continues it.
# soak is chat for a fixed time; burst sends one opening each (no follow-ups unless --turns).
PROMPT_SETS: dict[str, tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]] = {
    "chat": (PROMPTS, (FOLLOW_UPS,)),
    "rewrite": (REWRITE_PROMPTS, REWRITE_FOLLOW_UPS),
    "burst": (BURST_PROMPTS, (FOLLOW_UPS,)),
    "soak": (PROMPTS, (FOLLOW_UPS,)),
    "office": (PROMPTS, (FOLLOW_UPS,)),  # drawn at random per user: see schedule.py
}
# Concurrency levels when --concurrency is not given: a burst is its size, a soak one load.
DEFAULT_LEVELS: dict[str, list[int]] = {"chat": [1, 4, 8, 16], "rewrite": [1, 4, 8, 16],
                                        "burst": [BURST_SIZE], "soak": [8], "office": [20]}


_LONG_SENTENCES = (
    "The quarterly report covers revenue, costs and headcount across all regional offices.",
    "Several teams noted that the new ticketing process reduced response times noticeably.",
    "Facilities requested budget for replacing the ageing printers on the second floor.",
    "The security review recommended rotating shared credentials every ninety days.",
    "Customer feedback highlighted slow delivery in the northern region during winter.",
    "Training sessions for the accounting software will continue through next month.",
)


def long_document(n_tokens: int, nonce: str | None = None) -> str:
    # A fresh nonce up front defeats prefix caching, so every round pays the full prefill;
    # the office schedule gives its own (seeded), so two servers get the same document.
    parts = [f"Document {nonce or uuid.uuid4().hex}."]
    size, i = len(parts[0]), 0
    while size < n_tokens * CHARS_PER_TOKEN:
        parts.append(_LONG_SENTENCES[i % len(_LONG_SENTENCES)])
        size += len(parts[-1]) + 1
        i += 1
    return " ".join(parts)
