"""A test-only fault hook: APPLIANCE_FAULT, read once at start-up, makes the model's decode
block or fail once the engine is ready, or the sessions saved at shutdown slow, so tests
(ours and the reliability suite's) can watch what the watchdog, /health and the streams do
when llama_decode hangs or errors, and what a restart finds after a kill mid-save.
Never set it in production; unset, nothing here runs.

    APPLIANCE_FAULT=decode-block[:SECONDS][@N]   the first decode after N good ones blocks
                                                 SECONDS (default: until the process ends)
    APPLIANCE_FAULT=decode-fail[:COUNT][@N]      COUNT decodes after N good ones raise (default 1)
    APPLIANCE_FAULT=save-slow[:SECONDS][@N]      each session file saved after the first N
                                                 waits SECONDS (default 10) between being
                                                 written under its temporary name and being
                                                 renamed into place
"""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from appliance.config import ConfigError
from appliance.engine.kv import persist

log = logging.getLogger(__name__)
ENV = "APPLIANCE_FAULT"
_SPEC = re.compile(r"(decode-block|decode-fail|save-slow)(?::([0-9.]+))?(?:@([0-9]+))?")
_DEFAULT = {"decode-block": math.inf, "decode-fail": 1.0, "save-slow": 10.0}


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str  # decode-block | decode-fail | save-slow
    amount: float  # decode-block, save-slow: seconds (inf = until the process ends); decode-fail: decodes
    after: int = 0  # decodes (files for save-slow) that go through first, counted from the engine being ready


def parse(text: str) -> Fault:
    m = _SPEC.fullmatch(text.strip())
    if m is None:
        raise ConfigError(f"environment variable {ENV}: expected decode-block[:SECONDS][@N], "
                          f"decode-fail[:COUNT][@N] or save-slow[:SECONDS][@N], got {text!r}")
    kind, amount, after = m[1], m[2], m[3]
    try:
        value = float(amount) if amount else _DEFAULT[kind]
    except ValueError:
        raise ConfigError(f"environment variable {ENV}: bad number in {text!r}") from None
    return Fault(kind, value, int(after or 0))


def from_env(environ: Mapping[str, str]) -> Fault | None:
    text = environ.get(ENV, "")
    return parse(text) if text else None


def inject(model: Any, fault: Fault) -> None:
    """Arm the fault: wrap model.decode (an instance attribute shadows the method), or
    pause persist's saves."""
    if fault.kind == "save-slow":
        _slow_saves(fault)
    else:
        _wrap_decode(model, fault)
    log.warning("%s=%s is set: a test-only fault is armed (%s)", ENV, fault.kind, fault)


def _slow_saves(fault: Fault) -> None:
    files = 0

    def pause(tmp_name: str) -> None:
        nonlocal files
        files += 1
        if files > fault.after:
            log.warning("%s: session file %d waits %s s before its rename (%s)", ENV, files, fault.amount, tmp_name)
            threading.Event().wait(None if math.isinf(fault.amount) else fault.amount)

    persist.before_rename = pause


def _wrap_decode(model: Any, fault: Fault) -> None:
    real: Callable[..., None] = model.decode
    seen = 0
    left = fault.amount

    def decode(*args: Any, **kw: Any) -> None:
        nonlocal seen, left
        seen += 1
        if seen > fault.after and left > 0:
            if fault.kind == "decode-block":
                left = 0  # once
                log.warning("%s: decode %d blocks for %s s", ENV, seen, fault.amount)
                threading.Event().wait(None if math.isinf(fault.amount) else fault.amount)
            else:
                left -= 1
                raise RuntimeError(f"{ENV}: injected decode failure")
        real(*args, **kw)

    setattr(model, "decode", decode)  # noqa: B010 - mypy refuses assigning to a method
