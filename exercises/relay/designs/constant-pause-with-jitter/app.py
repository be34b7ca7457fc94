"""Orders relay, design `constant-pause-with-jitter` (BROKEN): jitter, but no backoff.

Client key unchanged, answers passed up whole, 4 attempts in one 3 s deadline, each bounded by
the time left, 504 with JSON at the end. THE FLAW is `pause()`: every pause is random between
50 and 100 ms, the same range before the third attempt as before the second, so a payment
service that is down gets retried just as hard the longer it stays down.
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
ATTEMPTS, PER_CALL, DEADLINE = 4, 1.0, 3.0

app = FastAPI()
http = httpx.AsyncClient()


def pause() -> float:
    return random.uniform(0.05, 0.1)  # THE FLAW: jitter around a constant, never growing


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.post("/orders/pay")
async def pay(request: Request, idempotency_key: str = Header()):
    body = await request.body()
    end = time.monotonic() + DEADLINE
    for n in range(1, ATTEMPTS + 1):
        left = end - time.monotonic()
        if left <= 0:
            break
        try:
            r = await http.post(f"{PAYMENTS_URL}/payments", content=body, timeout=min(PER_CALL, left),
                                headers={"Idempotency-Key": idempotency_key, "Content-Type": "application/json"})
        except httpx.TransportError:
            r = None
        if r is not None and r.status_code not in (502, 503, 504):
            up = {h: r.headers[h] for h in ("retry-after", "idempotent-replayed") if h in r.headers}
            return Response(r.content, r.status_code, headers=up, media_type="application/json")
        if n < ATTEMPTS:
            await asyncio.sleep(min(pause(), max(0.0, end - time.monotonic())))
    return JSONResponse(status_code=504, content={"error": "upstream_unavailable", "message": "outcome unknown; retry with the same key"})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
