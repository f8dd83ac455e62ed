"""Usage accounting: daily counts per person (never content), kept across restarts, and the last day per minute."""
