"""HTTPS without a bought certificate: the box's own certificate authority and its server
certificate (authority.py), the names and addresses it covers (names.py), renewal (renewal.py),
the one listener that speaks TLS and answers plain HTTP with a redirect (listener.py), HSTS
(hsts.py) and which of these a config turns on (mode.py). docs/SECURITY.md argues the design."""
