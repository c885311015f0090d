"""The fanout worker: takes jobs from Redis, calls providers, normalizes and appends their events."""
