"""The orders service of the payments lesson: the hop between the gateway and the payment service.

THE STARTER: it relays each payment once, and loses what the answer's headers say. The two
TODOs below are the lesson; each names the checks of `lab exercise check relay` that attack it.

POST /orders/pay takes the client's payment with its Idempotency-Key and relays it to the payment
service's POST /payments. What a hop in the middle of a chain must get right:

- the client's key goes down unchanged on every attempt: a key minted per attempt turns each
  retry into a new payment further down;
- an answer from below (200, 409, 422, any 4xx) goes up unchanged, status, body, Retry-After
  and Idempotent-Replayed included: the relay has no business second-guessing it;
- what gets no answer (a timeout, a dropped connection) or a 502, 503, 504 has an unknown or
  temporary outcome, and is retried: at most ATTEMPTS calls, each with its own timeout, all
  within one DEADLINE, with exponential backoff and jitter between them. When they run out,
  the client gets 504: the outcome is still unknown, and it may retry with the same key.

Run it alone:  PORT=8000 PAYMENTS_URL=http://127.0.0.1:9000 .venv/bin/python app.py
"""

import asyncio
import os
import random
import time

import httpx
import uvicorn
from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse, Response

PAYMENTS_URL = os.environ["PAYMENTS_URL"].rstrip("/")

# The bounds of the retries: a charge takes milliseconds here; a second is a slow callee.
ATTEMPTS = 3
PER_CALL_SECONDS = 1.0
DEADLINE_SECONDS = 3.0  # the manifest's deadline_ms says the same
BACKOFF_BASE_SECONDS = 0.1
BACKOFF_CAP_SECONDS = 1.0

# Temporary refusals: retried like no answer at all.
RETRYABLE = {502, 503, 504}
# The headers of an answer from below that go up with it.
KEPT_HEADERS = ("retry-after", "idempotent-replayed")

payments = httpx.AsyncClient()

app = FastAPI()


def backoff(attempt: int) -> float:
    """The pause after failed attempt `attempt`: between half and all of base * 2^(attempt-1),
    capped. The random half spreads the retries of many clients apart (jitter)."""
    ceiling = min(BACKOFF_BASE_SECONDS * 2 ** (attempt - 1), BACKOFF_CAP_SECONDS)
    return random.uniform(ceiling / 2, ceiling)


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.post("/orders/pay")
async def pay(request: Request, idempotency_key: str | None = Header(default=None)):
    if idempotency_key is None:
        return JSONResponse(status_code=400, content={"error": "missing_idempotency_key", "message": "a payment needs an Idempotency-Key"})
    # The payment goes down as it came; the payment service judges it.
    body = await request.body()
    # TODO(key-unchanged, lost-both, gateway-errors-retried, timeout-retried, deadline, backoff):
    # a payment whose outcome is unknown or temporary (no answer, a timeout, a dropped
    # connection, a 502, 503 or 504) is tried again, and the payment service must see every
    # try as the same payment; the client gets an answer within the deadline, the tries are
    # bounded in number, and the pauses between them grow and differ from payment to payment.
    # An answer from the payment service (200, 409, 422, any 4xx) is final. As written, each
    # payment is sent once, and a lost answer becomes 504. (httpx gives this one attempt its
    # default timeout, 5 s.) (`lab exercise hint relay` when you are stuck.)
    try:
        answer = await payments.post(
            f"{PAYMENTS_URL}/payments",
            content=body,
            headers={"Idempotency-Key": idempotency_key, "Content-Type": "application/json"},
        )
    except httpx.HTTPError:
        answer = None
    if answer is not None and answer.status_code not in RETRYABLE:
        # TODO(pass-through, conflict-passed-up): the client gets the payment service's answer
        # as it was given, the headers it acts on included (a 409's Retry-After, a replay's
        # Idempotent-Replayed). As written, only the status and the body go up.
        return Response(content=answer.content, status_code=answer.status_code, media_type="application/json")
    return JSONResponse(
        status_code=504,
        content={"error": "upstream_unavailable", "message": "no answer from the payment service: the payment may or may not have happened; retry with the same key"},
    )


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")), access_log=False)
