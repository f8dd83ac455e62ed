"""`appliance person add NAME [--admin] | invite NAME | list`: the people store from the
terminal, for the first admin on a headless box (over SSH, no browser, no tunnel to /admin).

It opens the store the server uses (state_dir's people.sqlite3, or database_url), also while
the server runs: SQLite in WAL mode lets this write beside the server's readers, and the
server reads invites from the store, not from a copy of its own. An invite prints as a QR
code a phone scans from the terminal and as a plain line to copy, both carrying the box's
name on the LAN (`<box_name>.local`), never a loopback address.
"""

from __future__ import annotations

import argparse
import io
import os
from pathlib import Path

from appliance.config import Config
from appliance.http.people import People
from appliance.http.reach import invite_link, join
from appliance.ops import address
from appliance.people.accounts import AccountError, Accounts, Role
from appliance.store.errors import StoreError

ACTIONS = ("add", "invite", "list")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=ACTIONS,
                   help="add a person and print their invite link; a new invite link for a person; list people")
    p.add_argument("name", nargs="?", default="", help="the person's name (add, invite)")
    p.add_argument("--admin", action="store_true", help="add: an admin (may use /admin and add people)")


def link(cfg: Config, token: str) -> str:
    """The invite link by the box's name and port (how it is served: ops/address.py)."""
    box = address.box(cfg)
    return invite_link(join(box.scheme, box.host, box.port), token)


def qr(url: str) -> str:
    """The link as a QR code for a terminal: half-height blocks, so it fits an 80x24 window."""
    import segno

    out = io.StringIO()
    segno.make(url, error="m").terminal(out=out, compact=True, border=2)
    return out.getvalue()


def listing(accounts: Accounts) -> str:
    rows = accounts.people()
    if not rows:
        return "nobody yet: appliance person add NAME --admin"
    width = max(4, *(len(a.name) for a, _ in rows))
    lines = [f"{'NAME':<{width}}  {'ROLE':<5}  STATE"]
    for a, _ in rows:
        state = "disabled" if a.disabled else "invited (not signed in yet)" if not a.has_password else "active"
        lines.append(f"{a.name:<{width}}  {a.role.value:<5}  {state}")
    return "\n".join(lines)


def invited(cfg: Config, who: str, token: str) -> str:
    url = link(cfg, token)
    return (f"{who}'s invite link (once, within 7 days): scan it with a phone on the office network, "
            f"or copy the line below it.\n{qr(url)}\n{url}")


def act(cfg: Config, accounts: Accounts, action: str, name: str, admin: bool) -> str:
    if action == "list":
        return listing(accounts)
    if not name:
        raise AccountError(f"`appliance person {action}` needs a NAME")
    if action == "add":
        account, token = accounts.add(name, Role.ADMIN if admin else Role.USER)
        return f"added {account.name} ({account.role.value})\n" + invited(cfg, account.name, token)
    found = accounts.named(name)
    if found is None:
        raise AccountError(f"no person named {name!r}, or disabled (appliance person list)")
    return invited(cfg, found.name, accounts.invite(found.id))


def run(cfg: Config, action: str, name: str = "", admin: bool = False) -> tuple[int, str]:
    """(exit code, what to print) for `appliance person`."""
    if not cfg.database_url:
        if not cfg.state_dir:
            return 2, "appliance person: state_dir is empty and no database_url is set: people are kept nowhere"
        state = Path(cfg.state_dir).resolve()
        if not state.is_dir():  # a relative state_dir read from the wrong directory: a store nobody serves
            return 2, (f"appliance person: no state directory at {state}: run this where the server runs (the "
                       f"service's: --state-dir /var/lib/appliance/state)")
        as_owner(state)
    store = _open(cfg)
    try:
        if store.accounts is None:
            return 1, f"appliance person: {store.store_trouble}"
        text = act(cfg, store.accounts, action, name, admin)
    except (AccountError, StoreError) as e:
        return 1, f"appliance person: {e}"
    finally:
        store.close()
    if cfg.auth != "people" and action != "list":
        text = 'note: auth is "open" here: people sign in once the box runs with auth = "people"\n' + text
    return 0, text


def as_owner(state: Path) -> None:
    """Run as root (sudo over SSH), become the state directory's owner (the service's user)
    first: the store refuses a directory another user owns, and a people.sqlite3 made by root
    would lock the service out of it."""
    owner = state.stat()
    if os.geteuid() != 0 or owner.st_uid == 0:
        return
    # Imported before the switch: after it, only what that user may read can be imported.
    import segno  # noqa: F401

    os.setgroups([])
    os.setgid(owner.st_gid)
    os.setuid(owner.st_uid)


def _open(cfg: Config) -> People:
    return People.open(cfg.state_dir, database_url=cfg.database_url)
