"""fingerprint-without-amount (BROKEN): plain redis-py, the amount left out of the fingerprint.

Otherwise the plain-redis design: SET NX reservation with a lease, the Charge kept for the retry
window, 409 while in progress, 422 on another fingerprint, a tenant-scoped provider key, 503 when
Redis is down. THE FLAW is `fingerprint()`: it hashes tenant, order and currency but not the
amount, so the same key with 29.90 after 19.90 replays the 19.90 Charge (200,
Idempotent-Replayed) instead of answering 422.
"""

import hashlib
import json
import os
import secrets
from uuid import UUID

import httpx
import uvicorn
from fastapi import FastAPI, Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from redis.asyncio import Redis
from redis.exceptions import RedisError

KEY_PREFIX = os.environ.get("KEY_PREFIX", "payments:")
LEASE_SECONDS = int(os.environ.get("LEASE_SECONDS", "30"))
RETRY_WINDOW_SECONDS = 3600

redis = Redis.from_url(
    os.environ["REDIS_URL"], decode_responses=True, socket_timeout=1, socket_connect_timeout=1
)
provider = httpx.AsyncClient(base_url=os.environ["PROVIDER_URL"], timeout=10)
app = FastAPI()

# Deletes the reservation only while it is still ours (a late failure must not free another's).
RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class Payment(BaseModel):
    tenant_id: UUID
    order_id: UUID
    amount: int = Field(gt=0)
    currency: str = Field(pattern=r"^[A-Z]{3}$")


def error(status: int, code: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": code}, status_code=status, headers=headers)


def fingerprint(p: Payment) -> str:
    text = json.dumps([str(p.tenant_id), str(p.order_id), p.currency])
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
    record_key = f"{KEY_PREFIX}payment:{payment.tenant_id}:{key}"
    fp = fingerprint(payment)
    pending = json.dumps({"state": "pending", "fp": fp, "owner": secrets.token_hex(8)})

    try:
        for _ in range(3):  # a record may vanish between SET NX and GET (released, expired)
            if await redis.set(record_key, pending, nx=True, ex=LEASE_SECONDS):
                break
            stored = await redis.get(record_key)
            if stored is None:
                continue
            record = json.loads(stored)
            if record["fp"] != fp:
                return error(422, "idempotency_key_reused")
            if record["state"] == "pending":
                return error(409, "payment_in_progress", {"Retry-After": "1"})
            return JSONResponse(record["charge"], headers={"Idempotent-Replayed": "true"})
        else:
            return error(409, "payment_in_progress", {"Retry-After": "1"})
    except RedisError:
        return error(503, "idempotency_store_unavailable", {"Retry-After": "1"})

    try:
        result = await charge(payment, provider_key=f"payment.{payment.tenant_id}.{key}")
    except httpx.HTTPError:
        # The money may have moved: free the key; the retry sends the same provider key.
        try:
            await redis.eval(RELEASE, 1, record_key, pending)
        except RedisError:
            pass
        return error(502, "provider_outcome_unknown")

    done = json.dumps({"state": "done", "fp": fp, "charge": result})
    try:
        await redis.set(record_key, done, ex=RETRY_WINDOW_SECONDS)
    except RedisError:
        pass  # the charge stands; a retry is answered by the provider's key
    return JSONResponse(result)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
