"""The payment service of the payments lesson: POST /payments with an Idempotency-Key.

THE STARTER: it charges, but nothing stops a retry from charging again. The four TODOs below
are the lesson; `lab exercise check charge-once` says which of its checks each one fixes.

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

# TODO(redis-blip): a connection the server (or the network) dropped is not noticed until the
# next command fails on it, and the kit then runs that payment unprotected. Make the client
# send such a command once more on a fresh connection (redis-py's retry_on_error, with a
# bounded Retry), and keep its timeouts short: an outage must not hold a payment for seconds.
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
        # TODO(lost-answer, redis-down, slow-provider, redis-lost, crash): give the provider
        # its own key, headers={"Idempotency-Key": provider_key}, so it can refuse a second
        # charge when Redis could not (its answer was lost, Redis was down or lost before the
        # Charge was stored, the lease ran out, the service crashed mid-charge).
    )
    response.raise_for_status()
    body = response.json()
    return Charge(charge_id=body["charge_id"], order_id=payment.order_id, amount=payment.amount, currency=payment.currency)


async def charge_once(coordinator, charge, payment: Payment, key: str) -> Charge:
    # TODO(replay, changed-payment, in-flight, result-ttl, shared-records): charge through the
    # coordinator, which keeps its records in Redis, where every instance of the service sees
    # them. The operation names the tenant (payment.charge.<tenant hex>), so tenants never
    # share keys; the fingerprint covers what must not change between retries (order_id,
    # amount, currency); the Charge is kept RESULT_TTL_SECONDS. The provider's key is made of the
    # operation and the client's key, the same on every attempt.
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
    # TODO(invalid-keys): refuse an empty key, one with a colon and one longer than 255
    # characters with 400 invalid_idempotency_key, before the coordinator: idempotency-kit
    # 0.4.1 would run the charge unprotected with such a key, and store nothing.
    # IdempotencyIdentifiers(operation=..., idempotency_key=...) raises ValidationError on one.

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
