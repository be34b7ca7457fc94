"""Orders relay, design `drops-retry-after` (BROKEN): Retry-After is lost on the way up.

Client key unchanged, 5 attempts with equal-jitter backoff inside one 3 s deadline, each with a
timeout of what is left (at most 1 s), 504 with JSON when they run out. THE FLAW is in
`relayed`: it rebuilds the answer from the status and body, and copies only the one header it
thought of, Idempotent-Replayed; a 409's Retry-After never reaches the client.
"""

import asyncio
import os
import random
import time

import httpx
import uvicorn
from fastapi import FastAPI, Header, Request
from fastapi.responses import JSONResponse, Response

PAYMENTS = os.environ["PAYMENTS_URL"].rstrip("/") + "/payments"
DEADLINE, ATTEMPTS, PER_CALL, BASE = 3.0, 5, 1.0, 0.1

app = FastAPI()
http = httpx.AsyncClient()


def relayed(answer: httpx.Response) -> Response:
    headers = {}
    if "idempotent-replayed" in answer.headers:
        headers["Idempotent-Replayed"] = answer.headers["idempotent-replayed"]
    # THE FLAW: Retry-After (and anything else) is dropped here.
    return Response(content=answer.content, status_code=answer.status_code, headers=headers,
                    media_type="application/json")


@app.get("/health")
def health():
    return {"status": "ok"}


@app.post("/orders/pay")
async def pay(request: Request, idempotency_key: str = Header()):
    payload = await request.body()
    end = time.monotonic() + DEADLINE
    for n in range(1, ATTEMPTS + 1):
        if (left := end - time.monotonic()) <= 0:
            break
        try:
            answer = await http.post(PAYMENTS, content=payload, timeout=min(PER_CALL, left),
                                     headers={"Idempotency-Key": idempotency_key,
                                              "Content-Type": "application/json"})
            if answer.status_code not in (502, 503, 504):
                return relayed(answer)
        except httpx.TransportError:
            pass
        if n < ATTEMPTS:
            ceiling = BASE * 2 ** (n - 1)
            await asyncio.sleep(min(random.uniform(ceiling / 2, ceiling), max(0, end - time.monotonic())))
    return JSONResponse(status_code=504, content={"error": "upstream_unavailable",
                                                  "message": "no answer in time; outcome unknown, retry with the same key"})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
