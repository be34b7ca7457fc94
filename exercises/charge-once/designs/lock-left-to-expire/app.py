"""lock-left-to-expire: the status-query design, whose lock is not deleted after a charge.

Two keys per payment: a lock (SET NX with the lease, renewed while the provider runs) and a
record (the fingerprint, then the Charge) kept for the retry window; a provider that charges
every request (provider_dedup = false), so an attempt that finds a record without a Charge asks
`GET /charges?key=K` first. After a successful charge the lock is simply left to expire with its
lease (the record answers every retry first); it is deleted only when the charge failed. Redis
unreachable: 503 (fail closed).
"""

import asyncio
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

# Compare-and-set on the lock's token: only its owner extends or frees it.
RENEW = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0"
RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


class Payment(BaseModel):
    tenant_id: UUID
    order_id: UUID
    amount: int = Field(gt=0)
    currency: str = Field(pattern=r"^[A-Z]{3}$")


class Unknown(Exception):
    """The provider's answer never came: the money may or may not have moved."""


def error(status: int, code: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": code}, status_code=status, headers=headers)


def fingerprint(p: Payment) -> str:
    text = json.dumps([str(p.tenant_id), str(p.order_id), p.amount, p.currency])
    return hashlib.sha256(text.encode()).hexdigest()


def charge_of(body: dict) -> dict:
    return {k: body[k] for k in ("charge_id", "order_id", "amount", "currency")}


async def already_charged(provider_key: str) -> dict | None:
    """The status query: the charge the provider made under this key, if any."""
    try:
        response = await provider.get("/charges", params={"key": provider_key})
        response.raise_for_status()
    except httpx.HTTPError as e:
        raise Unknown from e
    charges = response.json()["charges"]
    return charge_of(charges[0]) if charges else None


async def charge(p: Payment, provider_key: str) -> dict:
    try:
        response = await provider.post(
            "/charges",
            json={"order_id": str(p.order_id), "amount": p.amount, "currency": p.currency},
            headers={"Idempotency-Key": provider_key},
        )
        response.raise_for_status()
    except httpx.HTTPError as e:
        raise Unknown from e
    return charge_of(response.json())


async def keep_lock(lock_key: str, token: str) -> None:
    while True:
        await asyncio.sleep(LEASE_SECONDS / 3)
        try:
            await redis.eval(RENEW, 1, lock_key, token, LEASE_SECONDS * 1000)
        except RedisError:
            pass


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.post("/payments")
async def pay(payment: Payment, idempotency_key: str | None = Header(default=None)):
    key = idempotency_key
    if key is None or not 1 <= len(key) <= 255 or ":" in key:
        return error(400, "invalid_idempotency_key")
    scope = f"{payment.tenant_id}:{key}"
    record_key, lock_key = f"{KEY_PREFIX}payment:{scope}", f"{KEY_PREFIX}lock:{scope}"
    provider_key = f"payment.{payment.tenant_id}.{key}"
    fp = fingerprint(payment)
    token = secrets.token_hex(8)

    def answer(record: dict) -> JSONResponse | None:
        if record["fp"] != fp:
            return error(422, "idempotency_key_reused")
        if record["charge"]:
            return JSONResponse(record["charge"], headers={"Idempotent-Replayed": "true"})
        return None

    locked = False
    try:
        stored = await redis.get(record_key)
        if stored and (done := answer(json.loads(stored))):
            return done
        if not await redis.set(lock_key, token, nx=True, ex=LEASE_SECONDS):
            return error(409, "payment_in_progress", {"Retry-After": "1"})
        locked = True
        stored = await redis.get(record_key)  # it may have completed in between
        if stored and (done := answer(json.loads(stored))):
            return done
        # An attempt record without a Charge: an earlier attempt may have charged.
        uncertain = stored is not None
        if not uncertain:
            attempt = json.dumps({"fp": fp, "charge": None})
            await redis.set(record_key, attempt, ex=RETRY_WINDOW_SECONDS)
    except RedisError:
        if locked:
            await release(lock_key, token)
        return error(503, "idempotency_store_unavailable", {"Retry-After": "1"})

    renewal = asyncio.create_task(keep_lock(lock_key, token))
    try:
        found = await already_charged(provider_key) if uncertain else None
        result = found or await charge(payment, provider_key)
    except BaseException as e:  # Unknown, or the request cancelled: free the key at once
        renewal.cancel()
        await release(lock_key, token)
        if isinstance(e, Unknown):
            return error(502, "provider_outcome_unknown")
        raise
    renewal.cancel()  # on success the lock is left to expire with its lease

    try:
        await redis.set(record_key, json.dumps({"fp": fp, "charge": result}), ex=RETRY_WINDOW_SECONDS)
    except RedisError:
        pass  # the attempt record stays: the next attempt asks the provider first
    return JSONResponse(result, headers={"Idempotent-Replayed": "true"} if found else None)


async def release(lock_key: str, token: str) -> None:
    try:
        await redis.eval(RELEASE, 1, lock_key, token)
    except RedisError:
        pass  # it expires with its lease


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")))
