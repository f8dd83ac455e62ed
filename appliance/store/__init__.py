"""The store: every table the appliance keeps (people, chats, usage, the library) goes through
one Database (database.py) on SQLite (sqlite.py) or PostgreSQL (postgres.py), each owner's
tables made by its own numbered migrations (migrations.py). The only importer of sqlite3 and
psycopg; its failures are one error type (errors.py) that the HTTP side renders as it is."""
