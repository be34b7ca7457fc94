"""The payment service of the payments lesson: POST /payments with an Idempotency-Key.

THE STARTER: it charges, but nothing stops a retry from charging again. The four TODOs below
are the lesson; each names the checks of `lab exercise check charge-once` that attack it.

One key is one payment, charged once, whatever fails:

    a new key                          200, the Charge (the provider charged)
    the same key, the same payment     200, the same Charge, Idempotent-Replayed: true
    the same key, the first call runs  409 {"error": "payment_in_progress"}, Retry-After: 1
    the same key, another payment      422 {"error": "idempotency_key_reused"}
    an empty key, a colon, > 255       400 {"error": "invalid_idempotency_key"}, before anything

idempotency-kit reserves the key in Redis before the charge (in_flight="raise"), compares the
fingerprint of what must not change between retries, and stores the Charge for an hour. Redis is
not enough on its own: the provider also gets a key of its own, made of tenant, operation and
the client's key, so it can refuse a second charge when Redis could not (the provider's answer
was lost, Redis was down and the kit failed open, the lease ran out under a slow provider).

Run it alone:  PORT=8000 REDIS_URL=redis://127.0.0.1:6379/0 KEY_PREFIX=dev:idempotency: \\
               PROVIDER_URL=http://127.0.0.1:9000 .venv/bin/python app.py
"""

import os
from uuid import UUID

import httpx
import uvicorn
from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse
from idempotency_kit import (
    AsyncIdempotencyCoordinator,
    IdempotencyDomainService,
    IdempotencyIdentifiers,
    IdempotencyInProgressError,
    IdempotencyKeyReuseError,
    PydanticResultAdapter,
    fingerprint_of,
)
from idempotency_kit.infra.storage.redis.aio import RedisAsyncIdempotencyRepository
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from redis.asyncio import Redis

# Every key this service writes starts with KEY_PREFIX: the lab gives each run its own.
KEY_PREFIX = os.environ.get("KEY_PREFIX", "idempotency:")
# The reservation: longer than the worst charge, the provider's timeout included (the lesson's
# 30 s; the lab shortens it to see what a provider slower than the lease does).
LEASE_SECONDS = int(os.environ.get("LEASE_SECONDS", "30"))
# The result is kept an hour: the longest a client retries one payment.
RESULT_TTL_SECONDS = 3600

# TODO(redis-blip): a payment made after a short Redis outage has healed is as protected as
# one made before it, and an outage never holds a payment for seconds. As written, the first
# command after the blip fails on a connection Redis has dropped, and that payment runs
# unprotected. Attacked by: redis-blip.
redis = Redis.from_url(os.environ["REDIS_URL"], socket_timeout=1, socket_connect_timeout=1)

provider = httpx.AsyncClient(base_url=os.environ["PROVIDER_URL"], timeout=10)

app = FastAPI()


class Payment(BaseModel):
    """The payment command, as the service receives it after authentication."""

    # An unknown field is refused (422): the fingerprint would not cover it.
    model_config = ConfigDict(extra="forbid")
    tenant_id: UUID
    order_id: UUID
    amount: int = Field(gt=0, le=10**12)  # kopecks
    currency: str = Field(pattern=r"^[A-Z]{3}$")


class Charge(BaseModel):
    """What a charge returns, stored and replayed as it is."""

    charge_id: str
    order_id: UUID
    amount: int
    currency: str


def make_coordinator(redis: Redis) -> AsyncIdempotencyCoordinator:
    return AsyncIdempotencyCoordinator(
        RedisAsyncIdempotencyRepository(redis, key_prefix=KEY_PREFIX),
        IdempotencyDomainService(),
        in_flight="raise",
        in_flight_lease_seconds=LEASE_SECONDS,
    )


coordinator = make_coordinator(redis)


async def charge(payment: Payment, provider_key: str) -> Charge:
    """Moves the money: one call to the provider, with the provider's own key."""
    response = await provider.post(
        "/charges",
        json={"order_id": str(payment.order_id), "amount": payment.amount, "currency": payment.currency},
        # TODO(lost-answer, redis-down, slow-provider, redis-lost, crash): the provider charges
        # a payment once even when Redis cannot stop the second attempt (the provider's answer
        # was lost, Redis was down or lost before the Charge was stored, the reservation ran
        # out, the service crashed mid-charge). As written, every call to the provider is a new
        # charge to it.
    )
    response.raise_for_status()
    body = response.json()
    return Charge(charge_id=body["charge_id"], order_id=payment.order_id, amount=payment.amount, currency=payment.currency)


async def charge_once(coordinator, charge, payment: Payment, key: str) -> Charge:
    # TODO(replay, changed-payment, in-flight, result-ttl, shared-records): one key is one
    # payment of one tenant, charged once: a retry gets the stored Charge for as long as a
    # client retries (RESULT_TTL_SECONDS), at any instance of the service; a duplicate that
    # comes while the first call runs is refused (409, Retry-After) or waits for its Charge;
    # the same key with another order, amount or currency is refused (422). As written, every
    # request charges. The provider's key is made of the operation and the client's key, the
    # same on every attempt.
    provider_key = f"payment.charge.{payment.tenant_id.hex}.{key}"
    return await charge(payment, provider_key)


def error(status: int, code: str, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": code, "message": message}, headers=headers)


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.post("/payments")
async def pay(payment: Payment, idempotency_key: str | None = Header(default=None)):
    if idempotency_key is None:
        return error(400, "missing_idempotency_key", "a payment needs an Idempotency-Key")
    # TODO(invalid-keys): an empty key, a key with a colon and a key longer than 255 characters
    # are refused with 400 invalid_idempotency_key before anything is charged or stored: with
    # such a key idempotency-kit 0.4.1 runs the charge unprotected and stores nothing.
    # Attacked by: invalid-keys. (`lab exercise hint charge-once` when you are stuck.)

    # Whether this call ran the charge, or got the stored Charge back.
    ran = False

    async def charge_now(payment: Payment, provider_key: str) -> Charge:
        nonlocal ran
        ran = True
        return await charge(payment, provider_key)

    try:
        result = await charge_once(coordinator, charge_now, payment, idempotency_key)
    except IdempotencyInProgressError:
        return error(409, "payment_in_progress", "this payment is being charged; retry in a second", {"Retry-After": "1"})
    except IdempotencyKeyReuseError:
        return error(422, "idempotency_key_reused", "this Idempotency-Key was used for another payment")
    except httpx.HTTPError as e:
        # No answer from the provider: the money may or may not have moved. The kit released
        # the reservation; a retry with the same key asks the provider again, with the same
        # provider key, and the provider answers with the charge it made.
        return error(502, "provider_outcome_unknown", f"no answer from the payment provider: {type(e).__name__}")
    headers = {} if ran else {"Idempotent-Replayed": "true"}
    return JSONResponse(status_code=200, content=result.model_dump(mode="json"), headers=headers)


if __name__ == "__main__":
    # Loopback only, on the port the lab (or you) gives; no access log.
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")), access_log=False)
