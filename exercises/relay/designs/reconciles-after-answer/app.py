"""Orders relay, design `reconciles-after-answer` (BROKEN): a late retry behind the client's back.

Client key unchanged, answers passed up whole, equal-jitter backoff, 4 attempts in one 3 s
deadline, 504 with JSON at the end. THE FLAW is `reconcile`: each payment that ended in a 504
is put on a queue, and a background task sends it down again RECONCILE_AFTER (1 s) later, and
twice more: the client was told "unknown, retry with the same key", and the relay still pays.
"""

import asyncio
import contextlib
import os
import random
import time

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

PAYMENTS_URL = os.environ["PAYMENTS_URL"].rstrip("/")
ATTEMPTS, PER_CALL, DEADLINE, BASE = 4, 1.0, 3.0, 0.1
RECONCILE_AFTER = 1.0

http = httpx.AsyncClient()
unsettled: asyncio.Queue = asyncio.Queue()


async def attempt(body: bytes, key: str, timeout: float) -> httpx.Response | None:
    try:
        r = await http.post(f"{PAYMENTS_URL}/payments", content=body, timeout=timeout,
                            headers={"Idempotency-Key": key, "Content-Type": "application/json"})
    except httpx.TransportError:
        return None
    return None if r.status_code in (502, 503, 504) else r


async def reconcile():
    """THE FLAW: payments the client already got a 504 for are sent down again, later."""
    while True:
        body, key, answered_at = await unsettled.get()
        await asyncio.sleep(max(0.0, answered_at + RECONCILE_AFTER - time.monotonic()))
        for _ in range(3):
            if await attempt(body, key, PER_CALL) is not None:
                break
            await asyncio.sleep(0.5)


@contextlib.asynccontextmanager
async def lifespan(_app):
    task = asyncio.create_task(reconcile())
    yield
    task.cancel()


app = FastAPI(lifespan=lifespan)


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
        r = await attempt(body, key, min(PER_CALL, left))
        if r is not None:
            up = {h: r.headers[h] for h in ("retry-after", "idempotent-replayed") if h in r.headers}
            return Response(r.content, r.status_code, headers=up, media_type="application/json")
        if n < ATTEMPTS:
            c = BASE * 2 ** (n - 1)
            await asyncio.sleep(min(random.uniform(c / 2, c), max(0.0, end - time.monotonic())))
    unsettled.put_nowait((body, key, time.monotonic()))  # THE FLAW
    return JSONResponse(status_code=504, content={"error": "upstream_unavailable", "message": "outcome unknown; retry with the same key"})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
