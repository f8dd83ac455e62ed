"""People on the box: accounts, sign-in, their API keys and their chats, kept in one store
(SQLite under state_dir). Below http/: nothing here knows a request or a route."""
