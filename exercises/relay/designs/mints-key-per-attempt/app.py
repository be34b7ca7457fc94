"""Orders relay, design `mints-key-per-attempt` (BROKEN): a key of its own for each attempt.

Bounded retries with equal-jitter backoff inside one 3 s deadline, answers passed up whole, a
504 with JSON at the end: all as the contract says, except THE FLAW in `attempt_key`: every
attempt down is sent as "<client key>-<n>", so the payment service cannot tell that attempt 2
is attempt 1 again, and a retry after a lost answer is a second payment.
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
ATTEMPTS, PER_CALL, DEADLINE, BASE = 4, 1.0, 3.0, 0.1

app = FastAPI()
http = httpx.AsyncClient()


def attempt_key(client_key: str, n: int) -> str:
    # THE FLAW: "each attempt is its own request, so it gets its own key".
    return f"{client_key}-{n}"


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.post("/orders/pay")
async def pay(request: Request, idempotency_key: str = Header()):
    body = await request.body()
    started = time.monotonic()
    for n in range(1, ATTEMPTS + 1):
        left = DEADLINE - (time.monotonic() - started)
        if left <= 0:
            break
        try:
            r = await http.post(
                f"{PAYMENTS_URL}/payments", content=body, timeout=min(PER_CALL, left),
                headers={"Idempotency-Key": attempt_key(idempotency_key, n), "Content-Type": "application/json"},
            )
            if r.status_code not in (502, 503, 504):
                kept = {h: r.headers[h] for h in ("retry-after", "idempotent-replayed") if h in r.headers}
                return Response(r.content, r.status_code, headers=kept, media_type="application/json")
        except httpx.TransportError:
            pass
        if n < ATTEMPTS:
            c = BASE * 2 ** (n - 1)
            await asyncio.sleep(random.uniform(c / 2, c))
    return JSONResponse(status_code=504, content={"error": "upstream_unavailable", "message": "outcome unknown; retry with the same key"})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8000")), access_log=False)
