"""no-provider-key (BROKEN): idempotency-kit as the lesson uses it, but the provider gets no key.

The kit reserves the key in Redis (in_flight="raise": 409 with Retry-After while the first call
runs), compares a fingerprint of order, amount and currency (422), keeps the Charge an hour, and,
as it does by default, fails open when Redis is down. THE FLAW is in `charge()`: the POST to the
provider carries no Idempotency-Key, so wherever Redis could not stop a second attempt (the
provider's answer lost, Redis down, the lease run out under a slow provider) the provider cannot
either, and the money moves twice.
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
    JsonResultAdapter,
    fingerprint_of,
)
from idempotency_kit.infra.storage.redis.aio import RedisAsyncIdempotencyRepository
from pydantic import BaseModel, Field, ValidationError
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

LEASE_SECONDS = int(os.environ.get("LEASE_SECONDS", "30"))
RESULT_TTL_SECONDS = 3600

redis = Redis.from_url(
    os.environ["REDIS_URL"],
    socket_timeout=1,
    socket_connect_timeout=1,
    retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), 2),
    retry_on_error=[RedisConnectionError, RedisTimeoutError],
)
coordinator = AsyncIdempotencyCoordinator(
    RedisAsyncIdempotencyRepository(redis, key_prefix=os.environ.get("KEY_PREFIX", "idempotency:")),
    IdempotencyDomainService(),
    in_flight="raise",
    in_flight_lease_seconds=LEASE_SECONDS,
)
provider = httpx.AsyncClient(base_url=os.environ["PROVIDER_URL"], timeout=10)
app = FastAPI()


class Payment(BaseModel):
    tenant_id: UUID
    order_id: UUID
    amount: int = Field(gt=0)
    currency: str = Field(pattern=r"^[A-Z]{3}$")


def error(status: int, code: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": code}, status_code=status, headers=headers)


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.post("/payments")
async def pay(payment: Payment, idempotency_key: str | None = Header(default=None)):
    operation = f"payment.{payment.tenant_id.hex}"
    try:  # idempotency-kit 0.4.1 runs a bad key unprotected: refuse it first
        IdempotencyIdentifiers(operation=operation, idempotency_key=idempotency_key or "")
    except ValidationError:
        return error(400, "invalid_idempotency_key")

    ran = False

    async def charge() -> dict:
        nonlocal ran
        ran = True
        response = await provider.post(
            "/charges",
            json={"order_id": str(payment.order_id), "amount": payment.amount, "currency": payment.currency},
        )
        response.raise_for_status()
        body = response.json()
        return {k: body[k] for k in ("charge_id", "order_id", "amount", "currency")}

    try:
        result = await coordinator.coordinate(
            operation, idempotency_key, RESULT_TTL_SECONDS, JsonResultAdapter(), charge,
            idempotency_fingerprint=fingerprint_of(
                order_id=payment.order_id, amount=payment.amount, currency=payment.currency
            ),
        )
    except IdempotencyInProgressError:
        return error(409, "payment_in_progress", {"Retry-After": "1"})
    except IdempotencyKeyReuseError:
        return error(422, "idempotency_key_reused")
    except httpx.HTTPError:
        return error(502, "provider_outcome_unknown")
    return JSONResponse(result, headers=None if ran else {"Idempotent-Replayed": "true"})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
