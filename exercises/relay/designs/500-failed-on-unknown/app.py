"""Orders relay, design `500-failed-on-unknown` (BROKEN): "unknown" is reported as "failed".

Client key unchanged, answers passed up whole, 5 attempts with equal-jitter backoff in one 3 s
deadline, each bounded by the time left. THE FLAW is `GAVE_UP`: when they run out the client
gets 500 {"error": "payment_failed"}, a definite failure, where the contract says 502, 503 or
504 (outcome unknown, retry with the same key): a client that believes it pays again under a
new key, and a payment whose answer was only lost is charged twice.
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
ATTEMPTS, PER_CALL, DEADLINE, BASE = 5, 1.0, 3.0, 0.1

app = FastAPI()
http = httpx.AsyncClient()


def gave_up() -> JSONResponse:
    # THE FLAW: the outcome is unknown, not failed.
    return JSONResponse(status_code=500, content={"error": "payment_failed",
                                                  "message": "the payment failed: the payment service is unavailable"})


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.post("/orders/pay")
async def pay(request: Request, idempotency_key: str = Header()):
    body = await request.body()
    deadline = time.monotonic() + DEADLINE
    for n in range(1, ATTEMPTS + 1):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        try:
            r = await http.post(f"{PAYMENTS_URL}/payments", content=body, timeout=min(PER_CALL, remaining),
                                headers={"Idempotency-Key": idempotency_key, "Content-Type": "application/json"})
        except httpx.TransportError:
            r = None
        if r is not None and r.status_code not in (502, 503, 504):
            up = {h: r.headers[h] for h in ("retry-after", "idempotent-replayed") if h in r.headers}
            return Response(r.content, r.status_code, headers=up, media_type="application/json")
        if n < ATTEMPTS:
            c = BASE * 2 ** (n - 1)
            await asyncio.sleep(min(random.uniform(c / 2, c), max(0.0, deadline - time.monotonic())))
    return gave_up()


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
