"""wait-mode-long-timeout: idempotency-kit in its default in_flight="wait" mode.

A duplicate that arrives while the first call is still charging does not get 409: the kit polls
Redis (every 50 ms, for up to one lease) and the duplicate answers with the first call's Charge
once it is stored (200, Idempotent-Replayed); only a wait that runs out answers 409. The
provider's HTTP timeout (25 s) is longer than any hold the lab stages and shorter than the lease
(30 s), so the first call keeps its reservation for as long as it can still charge. A changed
payment gets 422 at once; the provider gets a tenant-scoped key; Redis down: the kit fails open.
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
PROVIDER_TIMEOUT_SECONDS = 25  # longer than the lab's holds, shorter than the lease
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
    in_flight="wait",
    in_flight_lease_seconds=LEASE_SECONDS,
)
provider = httpx.AsyncClient(base_url=os.environ["PROVIDER_URL"], timeout=PROVIDER_TIMEOUT_SECONDS)
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
            headers={"Idempotency-Key": f"{operation}.{idempotency_key}"},
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
    except IdempotencyInProgressError:  # waited a whole lease, and it is still charging
        return error(409, "payment_in_progress", {"Retry-After": "1"})
    except IdempotencyKeyReuseError:
        return error(422, "idempotency_key_reused")
    except httpx.HTTPError:
        return error(502, "provider_outcome_unknown")
    return JSONResponse(result, headers=None if ran else {"Idempotent-Replayed": "true"})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
