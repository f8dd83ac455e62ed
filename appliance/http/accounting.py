"""The HTTP side of usage accounting: who a caller is for the counts (the key's label with
keys on, else the client address), the daily generated-token quota checked before a request
is submitted, and what each request's end or refusal adds to the ledger and the minute ring.
Counts only: nothing of a request's content reaches here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

from appliance.engine.events import Done
from appliance.errors import ApplianceError, QueueFull
from appliance.http.guard import Caller
from appliance.usage.ledger import Ledger, next_midnight
from appliance.usage.minutes import Minutes, TokenRate
from appliance.usage.store import Tally

REFUSALS = (429, 503)  # busy, over quota, rate limited, no slot in time, loading or draining


def identity(caller: Caller) -> str:
    """Whose usage a request is: the person signed in (by cookie or their own key), the person
    a trusted front-end names, else the key's label (a person), else the key's digest name,
    else the client's address."""
    if caller.account is not None:
        return caller.account.name
    if caller.person is not None:
        return caller.person.label
    if caller.key is not None:
        return caller.key.label or caller.key.identity
    return caller.address


class Accounting:
    def __init__(self, ledger: Ledger | None = None, quota_tokens_per_day: int = 0,
                 minutes: Minutes | None = None, clock: Callable[[], float] = time.time) -> None:
        self.ledger = ledger or Ledger()
        self.minutes = minutes or Minutes(clock)
        self.rate = TokenRate()  # tokens/s now, for the admin page
        self.default_quota = quota_tokens_per_day
        self._clock = clock

    def quota(self, caller: Caller) -> int:
        """The caller's daily generated-token quota (0 = none): the signed-in person's, its key's,
        else the default."""
        if caller.account is not None and caller.account.quota is not None:
            return caller.account.quota
        if caller.key is not None and caller.key.quota is not None:
            return caller.key.quota
        return self.default_quota

    def check(self, caller: Caller) -> None:
        """Refuse (429 quota_exceeded) a caller who has generated its quota today. Requests
        already running finish, so a day's total can pass the quota by what they generate."""
        quota = self.quota(caller)
        if not quota:
            return
        used = self.ledger.today(identity(caller)).generated_tokens
        if used < quota:
            return
        now = self._clock()
        reset = next_midnight(now)
        wait = max(1, math.ceil(reset - now))
        raise QueueFull(
            f"daily quota reached: {quota:,} generated tokens a day ({used:,} used today); "
            f"it resets at midnight, {time.strftime('%H:%M', time.localtime(reset))} local time "
            f"(in {_duration(wait)})", retry_after=wait, code="quota_exceeded")

    def ended(self, caller: Caller, ends: Sequence[Done], ttft_s: float | None) -> None:
        """A request answered: its choices' tokens as the engine counted them."""
        who = identity(caller)
        tally = Tally(requests=1, prompt_tokens=sum(d.prompt_tokens for d in ends),
                      cached_tokens=sum(d.cached_tokens for d in ends),
                      generated_tokens=sum(d.completion_tokens for d in ends))
        self.ledger.record(who, tally)
        self.minutes.ended(who, tally.generated_tokens, ttft_s)

    def refused(self, caller: Caller, err: ApplianceError) -> None:
        """A request refused (429/503) or failed; other errors (400s) are the client's own."""
        who = identity(caller)
        if err.status in REFUSALS:
            self.ledger.record(who, Tally(refusals=1))
            self.minutes.refused(who)
        elif err.status >= 500:
            self.minutes.failed(who)


def _duration(s: int) -> str:
    h, m = divmod(math.ceil(s / 60), 60)
    return f"{h} h {m} min" if h else f"{m} min"
