"""process-local-lock (BROKEN): the Charge is stored in Redis, the payment in flight is not.

The record of a finished payment is in Redis for the retry window (the fingerprint and the
Charge), so any instance replays it. THE FLAW: a payment in flight is guarded by an asyncio.Lock
per tenant and key, in this process's memory: a duplicate sent to this process while the first
call charges gets 409, but a second instance of the service on the same Redis sees no record,
and charges again. Redis unreachable: 503 (fail closed).
"""

import asyncio

import hashlib
import json
import os
from uuid import UUID

import httpx
import uvicorn
from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

KEY_PREFIX = os.environ.get("KEY_PREFIX", "payments:")
LEASE_SECONDS = int(os.environ.get("LEASE_SECONDS", "30"))
RETRY_WINDOW_SECONDS = 3600

redis = Redis.from_url(
    os.environ["REDIS_URL"],
    decode_responses=True,
    socket_timeout=1,
    socket_connect_timeout=1,
    retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), 2),
    retry_on_error=[RedisConnectionError, RedisTimeoutError],
)
provider = httpx.AsyncClient(base_url=os.environ["PROVIDER_URL"], timeout=10)
app = FastAPI()

# The payments in flight in this process, by tenant and key.
in_flight: dict[str, asyncio.Lock] = {}


class Payment(BaseModel):
    tenant_id: UUID
    order_id: UUID
    amount: int = Field(gt=0)
    currency: str = Field(pattern=r"^[A-Z]{3}$")


def error(status: int, code: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": code}, status_code=status, headers=headers)


def fingerprint(p: Payment) -> str:
    text = json.dumps([str(p.tenant_id), str(p.order_id), p.amount, p.currency])
    return hashlib.sha256(text.encode()).hexdigest()


async def charge(p: Payment, provider_key: str) -> dict:
    response = await provider.post(
        "/charges",
        json={"order_id": str(p.order_id), "amount": p.amount, "currency": p.currency},
        headers={"Idempotency-Key": provider_key},
    )
    response.raise_for_status()
    body = response.json()
    return {k: body[k] for k in ("charge_id", "order_id", "amount", "currency")}


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.post("/payments")
async def pay(payment: Payment, idempotency_key: str | None = Header(default=None)):
    key = idempotency_key
    if key is None or not 1 <= len(key) <= 255 or ":" in key:
        return error(400, "invalid_idempotency_key")
    scope = f"{payment.tenant_id}:{key}"
    record_key = f"{KEY_PREFIX}payment:{scope}"
    fp = fingerprint(payment)
    lock = in_flight.setdefault(scope, asyncio.Lock())
    if lock.locked():
        return error(409, "payment_in_progress", {"Retry-After": "1"})
    async with lock:
        try:
            stored = await redis.get(record_key)
        except RedisError:
            return error(503, "idempotency_store_unavailable", {"Retry-After": "1"})
        if stored is not None:
            record = json.loads(stored)
            if record["fp"] != fp:
                return error(422, "idempotency_key_reused")
            return JSONResponse(record["charge"], headers={"Idempotent-Replayed": "true"})
        try:
            result = await charge(payment, provider_key=f"payment.{payment.tenant_id}.{key}")
        except httpx.HTTPError:
            return error(502, "provider_outcome_unknown")
        try:
            await redis.set(record_key, json.dumps({"fp": fp, "charge": result}), ex=RETRY_WINDOW_SECONDS)
        except RedisError:
            pass  # the charge stands; a retry is answered by the provider's key
        return JSONResponse(result)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
