"""The appliance's own routes: health, metrics, models, sessions, the page, admin, documents, the library."""
