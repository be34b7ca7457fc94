"""Orders relay, design `retries-409` (BROKEN): a 409 from below is retried, not passed up.

The client's key goes down unchanged, 502/503/504 and no answer are retried with equal-jitter
backoff within one 3 s deadline, and the last answer goes up whole. THE FLAW is in
`RETRY_LATER`: 409 `payment_in_progress` is taken for a temporary refusal, so the relay waits
its Retry-After and sends the payment down again instead of handing the 409 to the client.
"""

import asyncio
import os
import random
import time

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

PAYMENTS_URL = os.environ["PAYMENTS_URL"].rstrip("/")
ATTEMPTS, PER_CALL, DEADLINE, BASE = 5, 1.0, 3.0, 0.1
RETRY_LATER = {409, 502, 503, 504}  # THE FLAW: 409 is the payment service's answer, not a blip
KEEP = ("retry-after", "idempotent-replayed")

app = FastAPI()
http = httpx.AsyncClient()


def pause_before(n: int, answer: httpx.Response | None) -> float:
    if answer is not None and answer.headers.get("retry-after", "").isdigit():
        return float(answer.headers["retry-after"])
    c = BASE * 2 ** (n - 1)
    return random.uniform(c / 2, c)


def passed_up(answer: httpx.Response) -> Response:
    kept = {h: answer.headers[h] for h in KEEP if h in answer.headers}
    return Response(answer.content, answer.status_code, headers=kept, media_type="application/json")


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.post("/orders/pay")
async def pay(request: Request):
    key = request.headers["idempotency-key"]
    body = await request.body()
    give_up_at = time.monotonic() + DEADLINE
    last = None
    for n in range(1, ATTEMPTS + 1):
        try:
            last = await http.post(
                f"{PAYMENTS_URL}/payments", content=body,
                headers={"Idempotency-Key": key, "Content-Type": "application/json"},
                timeout=max(0.01, min(PER_CALL, give_up_at - time.monotonic())),
            )
        except httpx.TransportError:
            last = None
        if last is not None and last.status_code not in RETRY_LATER:
            return passed_up(last)
        pause = pause_before(n, last)
        if n == ATTEMPTS or time.monotonic() + pause >= give_up_at:
            break
        await asyncio.sleep(pause)
    if last is not None and last.status_code == 409:
        return passed_up(last)  # still in progress when time ran out: let the client see it
    return JSONResponse(status_code=504, content={"error": "upstream_unavailable", "message": "outcome unknown; retry with the same key"})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")), access_log=False)
