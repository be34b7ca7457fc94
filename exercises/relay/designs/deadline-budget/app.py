"""Orders relay, design `deadline-budget` (correct): one budget, spent attempt by attempt.

The deadline is read from lab-exercise.toml (deadline_ms) and is the only clock: each attempt's
timeout is what is left of it (at most PER_ATTEMPT_CAP), each pause is full jitter,
uniform(0, min(CAP, BASE * 2**(n-1))), and is never longer than what is left. The client's
Idempotency-Key goes down as it came; any answer that is not 502/503/504 goes up whole.
"""

import asyncio
import os
import random
import time
import tomllib

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response


def manifest_deadline() -> float:
    try:
        with open("lab-exercise.toml", "rb") as f:
            return tomllib.load(f).get("deadline_ms", 3000) / 1000
    except OSError:
        return 3.0


PAYMENTS_URL = os.environ["PAYMENTS_URL"].rstrip("/")
DEADLINE = manifest_deadline()
MAX_ATTEMPTS = 6
PER_ATTEMPT_CAP = 1.0
BASE, CAP = 0.1, 1.0
MIN_USEFUL = 0.05  # an attempt with less time than this left is not worth starting
RETRY_STATUSES = {502, 503, 504}
PASSED_HEADERS = ("retry-after", "idempotent-replayed")

app = FastAPI()
client = httpx.AsyncClient()


def unknown_outcome(why: str) -> JSONResponse:
    return JSONResponse(
        status_code=504,
        content={
            "error": "upstream_unavailable",
            "message": f"{why}: the payment may or may not have been made; retry with the same Idempotency-Key",
        },
    )


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.post("/orders/pay")
async def pay(request: Request):
    key = request.headers.get("idempotency-key")
    if not key:
        return JSONResponse(status_code=400, content={"error": "missing_idempotency_key"})
    body = await request.body()
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    give_up_at = time.monotonic() + DEADLINE
    why = "no attempt made"
    for n in range(1, MAX_ATTEMPTS + 1):
        left = give_up_at - time.monotonic()
        if left < MIN_USEFUL:
            break
        try:
            answer = await client.post(
                f"{PAYMENTS_URL}/payments", content=body, headers=headers,
                timeout=min(left, PER_ATTEMPT_CAP),
            )
        except httpx.TransportError as e:
            why = f"attempt {n}: {type(e).__name__}"
        else:
            if answer.status_code not in RETRY_STATUSES:
                up = {h: answer.headers[h] for h in PASSED_HEADERS if h in answer.headers}
                return Response(answer.content, answer.status_code, headers=up,
                                media_type=answer.headers.get("content-type", "application/json"))
            why = f"attempt {n}: {answer.status_code}"
        pause = random.uniform(0, min(CAP, BASE * 2 ** (n - 1)))
        left = give_up_at - time.monotonic()
        if n == MAX_ATTEMPTS or pause + MIN_USEFUL > left:
            break
        await asyncio.sleep(pause)
    return unknown_outcome(f"no usable answer from the payment service ({why})")


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")), access_log=False)
