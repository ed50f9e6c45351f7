"""Django's Redis cache, keeping one client per connection pool.

Django's ``RedisCacheClient.get_client`` builds a new ``redis.Redis`` for every cache call,
and building one fills its table of some 170 response callbacks: about 0.2 ms of CPU per
call, as much as the call itself. Every page served from the page cache and every webhook
acknowledgement makes such a call. A ``redis.Redis`` is safe to share between threads (it
takes a connection from its pool per command), so one per pool is enough.
"""

from __future__ import annotations

from typing import Any

from django.core.cache.backends import redis as django_redis


class RedisCacheClient(django_redis.RedisCacheClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[bool, Any] = {}

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        # One for writes (the first server) and one for reads: with replicas listed in
        # CACHE_URL, each process keeps reading from the replica it first picked.
        client = self._clients.get(write)
        if client is None:
            client = self._clients[write] = super().get_client(key, write=write)
        return client


class RedisCache(django_redis.RedisCache):
    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = RedisCacheClient
