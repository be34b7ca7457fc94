"""The Python side of idem's compatibility test: idempotency-kit 0.4.1 itself, driven from Rust.

crates/idem/tests/it/python.rs runs this file with the interpreter of a venv that has
`idempotency-kit[redis]==0.4.1` (see .ci/run). Each subcommand prints one JSON document:

  coordinate URL PREFIX OPERATION KEY TTL FINGERPRINT RESULT_JSON
      AsyncIdempotencyCoordinator.coordinate in "raise" mode (the payments lesson's setup) with an
      action that returns RESULT_JSON. Prints {"value": ..., "action_runs": n}, or
      {"error": "<exception class name>", "action_runs": n}.
  reserve URL PREFIX OPERATION KEY LEASE_SECONDS FINGERPRINT
      Writes a pending reservation exactly as the coordinator does before running an action, and
      leaves it there (a holder that is still running, or crashed).
  fingerprints
      {name: fingerprint_of(**values)} for the shared vectors below.
  identifiers
      Reads [[operation, key], ...] (JSON) on stdin; prints, for each pair, what
      IdempotencyIdentifiers makes of it ([operation, key], trimmed) or null if it refuses it.

FINGERPRINT "-" means None.
"""

import asyncio
import json
import logging
import sys
from decimal import Decimal
from uuid import UUID

from idempotency_kit import (
    AsyncIdempotencyCoordinator,
    IdempotencyDomainService,
    IdempotencyIdentifiers,
    JsonResultAdapter,
    fingerprint_of,
)
from idempotency_kit.infra.storage.redis.aio import RedisAsyncIdempotencyRepository
from pydantic import ValidationError
from redis.asyncio import Redis

# The library logs every degraded path at ERROR with a traceback; the test reads our JSON only.
logging.disable(logging.CRITICAL)

# The fingerprint vectors. python.rs holds the same values as JSON under the same names; keep the
# two lists in step.
VECTORS = {
    "empty": {},
    "payment": dict(
        order_id=UUID("0b5e6a2c-1f0e-4d55-9a43-5d6a1c1f0e2b"), amount=1990, currency="RUB"
    ),
    "int": dict(a=1),
    "float": dict(a=1.0),
    "floats": dict(
        tiny=1e-05,
        small=0.0001,
        third=0.1 + 0.2,
        big=1e16,
        bigger=1.5e300,
        whole=1e15,
        neg_zero=-0.0,
        subnormal=5e-324,
        neg=-2.5e-07,
    ),
    "nested": dict(
        outer={"z": {"b": 2, "a": [1, {"y": None, "x": True}]}, "a": False},
        list_of_maps=[{"b": 1, "a": 2}],
    ),
    "unicode": dict(
        name='Ёжик "в" тумане\n😀\\',
        labels={"ключ": "значение", "é": "e\u0301", "\u2028": "\x00\x1f\x7f\t"},
    ),
    "list_and_tuple": dict(items=[1, 2, 3], pair=(1, "two"), empty_list=[], empty_map={}),
    "decimal": dict(total=Decimal("19.90"), one=Decimal("1.0")),
    "big": dict(n=2**63, neg=-(2**63)),
    "email": dict(email="a@example.com"),
}


def fingerprint_or_none(text):
    return None if text == "-" else text


async def coordinate(url, prefix, operation, key, ttl, fingerprint, result_json):
    redis = Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    coordinator = AsyncIdempotencyCoordinator(
        RedisAsyncIdempotencyRepository(redis, key_prefix=prefix),
        IdempotencyDomainService(),
        in_flight="raise",
        in_flight_lease_seconds=30,
    )
    runs = 0

    async def action():
        nonlocal runs
        runs += 1
        return json.loads(result_json)

    try:
        value = await coordinator.coordinate(
            operation,
            key,
            int(ttl),
            JsonResultAdapter(),
            action,
            idempotency_fingerprint=fingerprint_or_none(fingerprint),
        )
        return {"value": value, "action_runs": runs}
    except Exception as error:  # the test asserts on the class name
        return {"error": type(error).__name__, "action_runs": runs}
    finally:
        await redis.aclose()


async def reserve(url, prefix, operation, key, lease, fingerprint):
    redis = Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    try:
        repository = RedisAsyncIdempotencyRepository(redis, key_prefix=prefix)
        pending = IdempotencyDomainService().create_pending_record(
            operation, key, lease_seconds=int(lease), fingerprint=fingerprint_or_none(fingerprint)
        )
        await repository.save(pending)
        return {"reserved": True}
    finally:
        await redis.aclose()


def identifiers(pairs):
    out = []
    for operation, key in pairs:
        try:
            ids = IdempotencyIdentifiers(operation=operation, idempotency_key=key)
            out.append([ids.operation, ids.idempotency_key])
        except ValidationError:
            out.append(None)
    return out


def main(argv):
    command, args = argv[1], argv[2:]
    if command == "coordinate":
        result = asyncio.run(coordinate(*args))
    elif command == "reserve":
        result = asyncio.run(reserve(*args))
    elif command == "fingerprints":
        result = {name: fingerprint_of(**values) for name, values in VECTORS.items()}
    elif command == "identifiers":
        result = identifiers(json.load(sys.stdin))
    else:
        raise SystemExit(f"unknown command {command!r}")
    # ensure_ascii=False: keys with non-ASCII characters come back as themselves.
    json.dump(result, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main(sys.argv)
