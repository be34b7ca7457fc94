"""The invoice consumer of the payments lesson: one email per invoice version, however often the
job is delivered.

THE STARTER: it sends every job it reads, and acks it first. The three TODOs below are the
lesson: each says what must hold and names the checks of `lab exercise check invoice-consumer`
that attack it; `lab exercise hint invoice-consumer` says how, a level at a time.

It reads InvoiceJobs from a Redis Stream in a consumer group and sends each invoice through the
mailer. A queue delivers at least once: the same invoice comes again after a lost ack, after a
consumer died, or as a new job with a new delivery_id. send_invoice_once below is the lesson's
coordinator around the send, with the key and the fingerprint the README's contract names.

Run it alone:  REDIS_URL=redis://127.0.0.1:6379/0 KEY_PREFIX=dev:idempotency: STREAM=invoices \\
               GROUP=invoicing CONSUMER=a MAILER_URL=http://127.0.0.1:9000 .venv/bin/python consumer.py
"""

import asyncio
import logging
import os
import signal
from uuid import UUID

import httpx
from idempotency_kit import (
    AsyncIdempotencyCoordinator,
    IdempotencyDomainService,
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
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

STREAM = os.environ["STREAM"]
GROUP = os.environ.get("GROUP", "invoicing")
CONSUMER = os.environ.get("CONSUMER", "consumer-1")
KEY_PREFIX = os.environ.get("KEY_PREFIX", "idempotency:")
CLAIM_IDLE_MS = int(os.environ.get("CLAIM_IDLE_MS", "30000"))
LEASE_SECONDS = int(os.environ.get("LEASE_SECONDS", "30"))
# An invoice's result is kept a day: the longest the queue redelivers a job.
RESULT_TTL_SECONDS = 86400

log = logging.getLogger("invoice-consumer")

# A command on a connection that was dropped is sent once more on a fresh one.
redis = Redis.from_url(
    os.environ["REDIS_URL"],
    socket_timeout=2,
    socket_connect_timeout=1,
    retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), 2),
    retry_on_error=[RedisConnectionError, RedisTimeoutError],
)
mailer = httpx.AsyncClient(base_url=os.environ["MAILER_URL"], timeout=10)

coordinator = AsyncIdempotencyCoordinator(
    RedisAsyncIdempotencyRepository(redis, key_prefix=KEY_PREFIX),
    IdempotencyDomainService(),
    in_flight="raise",
    in_flight_lease_seconds=LEASE_SECONDS,
)


class InvoiceJob(BaseModel):
    delivery_id: UUID
    tenant_id: UUID
    order_id: UUID
    invoice_version: int = Field(ge=1)
    email: str


async def send(job: InvoiceJob, mail_key: str) -> dict:
    """Sends the invoice: one call to the mailer. Returns {"email_id": ...}."""
    response = await mailer.post(
        "/emails",
        json={"to": job.email, "subject": f"Invoice {job.order_id} v{job.invoice_version}"},
        headers={"Idempotency-Key": mail_key} if mail_key else {},
    )
    response.raise_for_status()
    return {"email_id": response.json()["email_id"]}


async def send_invoice_once(coordinator, send, job: InvoiceJob):
    operation = f"mail.invoice.{job.tenant_id.hex}"
    key = f"{job.order_id.hex}.v{job.invoice_version}"
    return await coordinator.coordinate(
        operation, key, RESULT_TTL_SECONDS, JsonResultAdapter(),
        send, job, f"{operation}.{key}",
        idempotency_fingerprint=fingerprint_of(email=job.email),
    )


async def handle(entry_id, fields) -> None:
    """Processes one entry; acks it once it is settled."""
    try:
        job = InvoiceJob(**{k.decode(): v.decode() for k, v in fields.items()})
    except ValidationError:
        log.error("entry %s is not an InvoiceJob; acked, never sent", entry_id)
        await redis.xack(STREAM, GROUP, entry_id)
        return
    # TODO(ack-after-send, in-progress-duplicate): an ack says "settled": the email sent and its
    # id stored, or the entry refused for good. An entry acked before that is lost if this
    # consumer dies in between; a duplicate that meets another consumer's send still in
    # progress is not settled either (that consumer may hold this very entry). As written,
    # every entry is acked before anything else happens.
    await redis.xack(STREAM, GROUP, entry_id)
    # TODO(redelivered, changed-recipient, ack-lost): one email per invoice version, however
    # often and under whatever delivery_id its job comes: a job delivered again gets the email
    # already sent, and an old version for another address is refused, never sent. As
    # written, every delivery sends a new email.
    try:
        result = await send(job, "")
    except httpx.HTTPError as e:
        log.warning("the mailer failed (%s)", e)
        return
    log.info("invoice %s v%s: %s", job.order_id, job.invoice_version, result["email_id"])


async def consume(stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            # TODO(ack-lost, in-progress-duplicate): an entry whose consumer died before
            # acking it is handled again by a live consumer once it has been idle for
            # CLAIM_IDLE_MS. As written, this loop reads only new entries, and an entry left
            # pending waits for ever.
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
