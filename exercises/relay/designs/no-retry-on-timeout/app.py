"""Orders relay, design `no-retry-on-timeout` (BROKEN): a slow payment service gets one try.

Client key unchanged, answers passed up whole, equal-jitter backoff, 4 attempts in one 3 s
deadline, 504 with JSON at the end. THE FLAW is the `except httpx.TimeoutException` branch: "if
it is that slow, retrying only makes it worse", so an attempt that timed out (the outcome
unknown, exactly what the contract says to retry with the same key) ends the payment with a 504.
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
ATTEMPTS, PER_CALL, DEADLINE, BASE = 4, 1.0, 3.0, 0.1

app = FastAPI()
http = httpx.AsyncClient()
UNKNOWN = {"error": "upstream_unavailable", "message": "outcome unknown; retry with the same key"}


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.post("/orders/pay")
async def pay(request: Request):
    key = request.headers["idempotency-key"]
    body = await request.body()
    end = time.monotonic() + DEADLINE
    for n in range(1, ATTEMPTS + 1):
        left = end - time.monotonic()
        if left <= 0:
            break
        try:
            answer = await http.post(f"{PAYMENTS_URL}/payments", content=body, timeout=min(PER_CALL, left),
                                     headers={"Idempotency-Key": key, "Content-Type": "application/json"})
        except httpx.TimeoutException:
            return JSONResponse(status_code=504, content=UNKNOWN)  # THE FLAW: no retry of a timeout
        except httpx.TransportError:
            answer = None
        if answer is not None and answer.status_code not in (502, 503, 504):
            up = {h: answer.headers[h] for h in ("retry-after", "idempotent-replayed") if h in answer.headers}
            return Response(answer.content, answer.status_code, headers=up, media_type="application/json")
        if n < ATTEMPTS:
            c = BASE * 2 ** (n - 1)
            await asyncio.sleep(min(random.uniform(c / 2, c), max(0.0, end - time.monotonic())))
    return JSONResponse(status_code=504, content=UNKNOWN)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
