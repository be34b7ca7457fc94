"""Orders relay, design `retries-other-4xx` (BROKEN): a 4xx it was not told about is retried.

Client key unchanged, answers passed up whole, equal-jitter backoff, 4 attempts in one 3 s
deadline, each with a timeout of what is left (at most 1 s), 504 with JSON at the end. THE FLAW
is `FINAL`: only the answers the README names (2xx, 409, 422) count as the payment service's
word; any other status, a 400 included, is taken for a hiccup and sent down again, and the last
one passes up when the attempts run out. A 400 means the payment itself was refused: sending it
again changes nothing, and a relay in the middle of a chain multiplies the load.
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
KEEP = ("retry-after", "idempotent-replayed")

app = FastAPI()
http = httpx.AsyncClient()


def final(status: int) -> bool:
    # THE FLAW: a 400 (or 403, 404...) is final too; only no answer and 502/503/504 are not.
    return 200 <= status < 300 or status in (409, 422)


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
    end = time.monotonic() + DEADLINE
    last = None
    for n in range(1, ATTEMPTS + 1):
        left = end - time.monotonic()
        if left <= 0:
            break
        try:
            last = await http.post(f"{PAYMENTS_URL}/payments", content=body, timeout=min(PER_CALL, left),
                                   headers={"Idempotency-Key": key, "Content-Type": "application/json"})
        except httpx.TransportError:
            last = None
        if last is not None and final(last.status_code):
            return passed_up(last)
        if n < ATTEMPTS:
            c = BASE * 2 ** (n - 1)
            await asyncio.sleep(min(random.uniform(c / 2, c), max(0.0, end - time.monotonic())))
    if last is not None and last.status_code < 500:
        return passed_up(last)  # out of attempts: the last refusal goes up as it came
    return JSONResponse(status_code=504, content={"error": "upstream_unavailable", "message": "outcome unknown; retry with the same key"})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
