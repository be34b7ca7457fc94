"""Design `store-send-ack` of the invoice consumer (broken): writes the invoice's record as sent
before the send (no email_id in it), sends, then acks.

Plain redis-py, no idempotency-kit: the consumer keeps a record of its own per invoice under
KEY_PREFIX, keyed by the invoice (tenant, order, version). A record is a reservation
{"state": "sending", "to": ...} while the email goes out (SET NX, with the lease), then the result
{"state": "sent", "to": ..., "email_id": ...}. The recipient in the record is the fingerprint: an
old version for another address is refused, never sent. Entries left pending are claimed with
XPENDING (idle at least CLAIM_IDLE_MS) and XCLAIM, not XAUTOCLAIM.
"""

import asyncio
import json
import logging
import os
import signal

import httpx
from redis.asyncio import Redis
from redis.exceptions import RedisError

STREAM = os.environ["STREAM"]
GROUP = os.environ.get("GROUP", "invoicing")
CONSUMER = os.environ.get("CONSUMER", "consumer-1")
KEY_PREFIX = os.environ.get("KEY_PREFIX", "idempotency:")
CLAIM_IDLE_MS = int(os.environ.get("CLAIM_IDLE_MS", "30000"))
LEASE_SECONDS = int(os.environ.get("LEASE_SECONDS", "30"))
RESULT_TTL_SECONDS = 86400

log = logging.getLogger("invoice-consumer")
redis = Redis.from_url(os.environ["REDIS_URL"], decode_responses=True, socket_timeout=5)
mailer = httpx.AsyncClient(base_url=os.environ["MAILER_URL"], timeout=10)


def record_key(job: dict) -> str:
    tenant = job["tenant_id"].replace("-", "")
    return f"{KEY_PREFIX}invoice:{tenant}:{job['order_id'].replace('-', '')}.v{job['invoice_version']}"


async def send(job: dict) -> str:
    response = await mailer.post(
        "/emails",
        json={"to": job["email"], "subject": f"Invoice {job['order_id']} v{job['invoice_version']}"},
    )
    response.raise_for_status()
    return response.json()["email_id"]


async def ack(entry_id: str) -> None:
    await redis.xack(STREAM, GROUP, entry_id)


async def handle(entry_id: str, job: dict) -> None:
    key = record_key(job)
    # Nothing is acked before the send.
    # THE FLAW: the record says sent before the send, and nothing is stored after it.
    reservation = json.dumps({"state": "sent", "to": job["email"]})
    if not await redis.set(key, reservation, nx=True, ex=LEASE_SECONDS):
        raw = await redis.get(key)
        if raw is None:
            return  # the reservation ran out just now: the next claim tries again
        record = json.loads(raw)
        if record["state"] == "sending":
            return  # another consumer is sending it right now: left pending, claimed again later
        if record["to"] != job["email"]:
            log.warning("invoice %s v%s was sent to another address; refused", job["order_id"], job["invoice_version"])
            await ack(entry_id)
            return
        await ack(entry_id)  # sent before: replayed
        return
    try:
        email_id = await send(job)
    except httpx.HTTPError as e:
        log.warning("the mailer failed (%s); the entry will be claimed again", e)
        await redis.delete(key)
        return
    log.info("invoice %s v%s: %s", job["order_id"], job["invoice_version"], email_id)
    result = json.dumps({"state": "sent", "to": job["email"], "email_id": email_id})
    await ack(entry_id)  # nothing stored after the send


async def claim() -> None:
    """Entries idle for longer than CLAIM_IDLE_MS: ours after a crash, or a dead consumer's."""
    pending = await redis.xpending_range(STREAM, GROUP, min="-", max="+", count=10, idle=CLAIM_IDLE_MS)
    ids = [p["message_id"] for p in pending]
    if not ids:
        return
    claimed = await redis.xclaim(STREAM, GROUP, CONSUMER, min_idle_time=CLAIM_IDLE_MS, message_ids=ids)
    for entry_id, fields in claimed:
        if fields:
            await handle(entry_id, fields)


async def consume(stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            await claim()
            read = await redis.xreadgroup(GROUP, CONSUMER, {STREAM: ">"}, count=10, block=200)
            for _, entries in read:
                for entry_id, fields in entries:
                    await handle(entry_id, fields)
        except RedisError as e:
            log.warning("Redis: %s; trying again", e)
            await asyncio.sleep(0.2)


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await consume(stop)


if __name__ == "__main__":
    asyncio.run(main())
