"""Orders relay, design `no-deadline` (BROKEN): every attempt has a timeout, the whole has none.

Client key unchanged, answers passed up whole, up to 5 attempts with equal-jitter exponential
backoff, 504 with JSON at the end. THE FLAW is in `pay`: it bounds each attempt (1.5 s) and
their number, never their sum, so against a silent payment service the client waits
5 x 1.5 s plus the pauses, about 9 s, though the manifest promises 3 s.
"""

import asyncio
import os
import random

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

PAYMENTS_URL = os.environ["PAYMENTS_URL"].rstrip("/")
ATTEMPTS = 5
BASE = 0.1

app = FastAPI()
http = httpx.AsyncClient(timeout=1.5)  # per attempt; THE FLAW: nothing bounds all of them


@app.get("/health")
async def health():
    return {"status": "ok"}


@app.post("/orders/pay")
async def pay(request: Request):
    key = request.headers["idempotency-key"]
    body = await request.body()
    for n in range(1, ATTEMPTS + 1):
        try:
            answer = await http.post(f"{PAYMENTS_URL}/payments", content=body,
                                     headers={"Idempotency-Key": key, "Content-Type": "application/json"})
        except httpx.TransportError:
            answer = None
        if answer is not None and answer.status_code not in (502, 503, 504):
            up = {k: v for k, v in answer.headers.items() if k in ("retry-after", "idempotent-replayed")}
            return Response(answer.content, answer.status_code, headers=up, media_type="application/json")
        if n < ATTEMPTS:
            c = BASE * 2 ** (n - 1)
            await asyncio.sleep(random.uniform(c / 2, c))
    return JSONResponse(status_code=504, content={"error": "upstream_unavailable",
                                                  "message": "the payment service did not answer; outcome unknown, retry with the same key"})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=False)
