"""idempotency-kit 0.4.1's side of `lab bench coordinator --python PATH`.

The reference bench (docs: idempotency-kit.md §16), made to print rows that `lab bench
coordinator` adds to its own: `coordinate()` with `JsonResultAdapter`, a trivial async action,
`ttl_seconds=3600`, the default in-flight mode ("wait"), asyncio workers pulling call numbers from
a shared counter, after a warm-up that is not counted. Beside it, raw redis-py sending the round
trips idempotency-kit sends on that path (`SET NX EX` + `SET EX` for a new key, a failed `SET NX`
+ `GET` for a replay), as the limit it can approach.

    python bench.py --url redis://127.0.0.1:6379 --prefix lab:bench:1a2b3c4d:py: \
        --ops 2000 --warm-up 200 --concurrency 1,50

Prints one JSON object per row on stdout:
{"bench": "idempotency-kit", "path": "new"|"replay", "policy": "0.4.1 wait", "concurrency": C,
 "ops": N, "ops_per_sec": …, "p50_us": …, "p99_us": …, "raw_ops_per_sec": …}

Every key it writes starts with --prefix; `lab` deletes them afterwards (SCAN of its prefix).
"""

import argparse
import asyncio
import json
import logging
import math
import time

from idempotency_kit import (
    AsyncIdempotencyCoordinator,
    IdempotencyDomainService,
    JsonResultAdapter,
)
from idempotency_kit.infra.storage.redis.aio import RedisAsyncIdempotencyRepository
from redis.asyncio import Redis, RedisCluster

# The library logs degraded paths at ERROR; a bench prints rows only.
logging.disable(logging.CRITICAL)

TTL_SECONDS = 3600
LEASE_SECONDS = 30


async def measure(first, count, concurrency, call):
    """Calls first..first+count with `concurrency` workers; (ops/s, sorted latencies in s)."""
    next_call = 0
    latencies = []

    async def worker():
        nonlocal next_call
        while next_call < count:
            n = next_call
            next_call += 1
            started = time.perf_counter()
            await call(first + n)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    latencies.sort()
    return count / elapsed, latencies


def percentile_us(latencies, percent):
    """Nearest rank, as lab's own rows."""
    if not latencies:
        return 0.0
    rank = math.ceil(percent / 100 * len(latencies))
    return latencies[min(max(rank, 1), len(latencies)) - 1] * 1e6


async def connect(url):
    """A client for the server at `url`, or for its cluster (idempotency-kit takes either)."""
    probe = Redis.from_url(url)
    try:
        cluster = (await probe.info("cluster")).get("cluster_enabled") == 1
    finally:
        await probe.aclose()
    return RedisCluster.from_url(url) if cluster else Redis.from_url(url)


async def rows(url, prefix, ops, warm_up, concurrencies):
    redis = await connect(url)
    coordinator = AsyncIdempotencyCoordinator(
        RedisAsyncIdempotencyRepository(redis, key_prefix=prefix),
        IdempotencyDomainService(),
        in_flight="wait",
        in_flight_lease_seconds=LEASE_SECONDS,
    )
    adapter = JsonResultAdapter()
    domain = IdempotencyDomainService()
    out = []
    try:
        for path in ("new", "replay"):
            for concurrency in concurrencies:
                operation = f"bench.{path}.{concurrency}"

                async def action(n):
                    return {"n": n}

                async def kit(n, operation=operation, path=path):
                    key = str(n) if path == "new" else "stored"
                    await coordinator.coordinate(
                        operation, key, TTL_SECONDS, adapter, action, n
                    )

                raw_operation = f"raw.{path}.{concurrency}"
                # The same record shapes the library writes, built once: raw sends bytes only.
                pending = json.dumps(
                    domain.create_pending_record(
                        raw_operation, "k", lease_seconds=LEASE_SECONDS
                    ).model_dump(mode="json"),
                    separators=(",", ":"),
                )
                completed = json.dumps(
                    domain.create_record(raw_operation, "k", {"n": 1}).model_dump(
                        mode="json"
                    ),
                    separators=(",", ":"),
                )

                async def raw(n, raw_operation=raw_operation, path=path,
                              pending=pending, completed=completed):
                    key = f"{prefix}{raw_operation}:{n if path == 'new' else 'stored'}"
                    if await redis.set(key, pending, ex=LEASE_SECONDS, nx=True):
                        await redis.set(key, completed, ex=TTL_SECONDS)
                    else:
                        await redis.get(key)

                if path == "replay":
                    await kit(0)
                    await raw(0)
                await measure(ops, warm_up, concurrency, kit)
                kit_rate, kit_latencies = await measure(0, ops, concurrency, kit)
                await measure(ops, warm_up, concurrency, raw)
                raw_rate, _ = await measure(0, ops, concurrency, raw)
                out.append(
                    {
                        "bench": "idempotency-kit",
                        "path": path,
                        "policy": "0.4.1 wait",
                        "concurrency": concurrency,
                        "ops": ops,
                        "ops_per_sec": kit_rate,
                        "p50_us": percentile_us(kit_latencies, 50),
                        "p99_us": percentile_us(kit_latencies, 99),
                        "raw_ops_per_sec": raw_rate,
                    }
                )
    finally:
        await redis.aclose()
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--ops", type=int, default=2000)
    parser.add_argument("--warm-up", type=int, default=200)
    parser.add_argument("--concurrency", default="1,50")
    args = parser.parse_args()
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    for row in asyncio.run(
        rows(args.url, args.prefix, args.ops, args.warm_up, concurrencies)
    ):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
