"""The GitHub issue sync: an outbox for writes, verified webhooks for reads, slash commands."""
