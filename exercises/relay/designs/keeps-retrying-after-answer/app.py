"""Orders relay, design `keeps-retrying-after-answer` (BROKEN): the client's 504 is not the end.

Client key unchanged, answers passed up whole, equal-jitter backoff, each attempt bounded by the
time left of one 3 s deadline, 504 with JSON when 4 attempts or the deadline run out. THE FLAW
is in `pay`'s last lines: with the 504 it schedules `keep_trying` (FastAPI BackgroundTasks, run
once the answer is sent), which sends the payment down up to 3 more times, so the client's
"unknown, retry with the same key" races payments the relay is still making.
"""

import asyncio
import os
import random
import time

import httpx
import uvicorn
from fastapi import BackgroundTasks, FastAPI, Request
from fastapi.responses import JSONResponse, Response

PAYMENTS_URL = os.environ["PAYMENTS_URL"].rstrip("/")
ATTEMPTS, PER_CALL, DEADLINE, BASE = 4, 1.0, 3.0, 0.1
BACKGROUND_TRIES = 3

app = FastAPI()
http = httpx.AsyncClient()


async def send(body: bytes, key: str, timeout: float) -> httpx.Response | None:
    try:
        answer = await http.post(f"{PAYMENTS_URL}/payments", content=body, timeout=timeout,
                                 headers={"Idempotency-Key": key, "Content-Type": "application/json"})
    except httpx.TransportError:
        return None
    return None if answer.status_code in (502, 503, 504) else answer


async def keep_trying(body: bytes, key: str):
    """THE FLAW: runs after the client already has its 504."""
    for n in range(BACKGROUND_TRIES):
        if await send(body, key, PER_CALL) is not None:
            return
        await asyncio.sleep(random.uniform(0.2, 0.4))


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.post("/orders/pay")
async def pay(request: Request, background: BackgroundTasks):
    key = request.headers["idempotency-key"]
    body = await request.body()
    end = time.monotonic() + DEADLINE
    for n in range(1, ATTEMPTS + 1):
        left = end - time.monotonic()
        if left <= 0:
            break
        answer = await send(body, key, min(PER_CALL, left))
        if answer is not None:
            up = {h: answer.headers[h] for h in ("retry-after", "idempotent-replayed") if h in answer.headers}
            return Response(answer.content, answer.status_code, headers=up, media_type="application/json")
        if n < ATTEMPTS:
            c = BASE * 2 ** (n - 1)
            await asyncio.sleep(min(random.uniform(c / 2, c), max(0.0, end - time.monotonic())))
    background.add_task(keep_trying, body, key)  # THE FLAW
    return JSONResponse(status_code=504, background=background,
                        content={"error": "upstream_unavailable", "message": "outcome unknown; retry with the same key"})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
