"""People mode's routes: signing in (auth.py), a person's own chats and keys (chats.py, keys.py)
and the operator's list of people (admin.py)."""
