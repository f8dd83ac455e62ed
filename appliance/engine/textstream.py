"""Token bytes -> text deltas that are safe to send: never half a UTF-8 character, never
the start of a stop string that might still complete."""

from __future__ import annotations

import codecs


class TextStream:
    def __init__(self, stop: tuple[str, ...] = ()) -> None:
        # The incremental decoder keeps an incomplete multi-byte character until its last
        # byte arrives (a Chinese character is often split over two tokens).
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._held = ""  # decoded text not yet sent: it may be the start of a stop string
        self.text = ""  # everything sent so far
        self.stopped = False

    def push(self, data: bytes) -> str:
        """Add a token's bytes; return the text that can be sent now."""
        if self.stopped:
            return ""
        self._held += self._utf8.decode(data)
        if not self._stop:
            out, self._held = self._held, ""
            self.text += out
            return out
        cut = -1
        for s in self._stop:
            i = self._held.find(s)
            if i != -1 and (cut == -1 or i < cut):
                cut = i
        if cut != -1:
            out = self._held[:cut]
            self._held = ""
            self.stopped = True
            self.text += out
            return out
        # Hold back the longest tail that is a prefix of some stop string.
        keep = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(self._held)), keep, -1):
                if self._held.endswith(s[:n]):
                    keep = n
                    break
        out = self._held[: len(self._held) - keep]
        self._held = self._held[len(self._held) - keep:]
        self.text += out
        return out

    def flush(self) -> str:
        """End of generation: whatever is held is final text."""
        if self.stopped:
            return ""
        out = self._held + self._utf8.decode(b"", final=True)
        self._held = ""
        self.text += out
        return out
