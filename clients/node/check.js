// Drives the embedded proxy's Toxiproxy API with toxiproxy-node-client, as a Node user would.
//
// Usage: node check.js HOST:PORT (the API, e.g. served by `cargo run -p faultproxy --example
// serve_api -- 127.0.0.1:8474`). Starts a TCP echo server of its own as the upstream, creates
// a proxy to it, adds a latency toxic and checks that a real round trip takes at least that
// long, removes it and checks the echo again. Exits non-zero on the first difference.

"use strict";

const net = require("node:net");
const { Toxiproxy, ToxiproxyError } = require("toxiproxy-node-client");

const LATENCY_MS = 300;
const PROXY = "node_echo";

function fail(message) {
  console.error(`clients/node: FAILED: ${message}`);
  process.exit(1);
}

function check(condition, message) {
  if (!condition) fail(message);
}

function startEcho() {
  return new Promise((resolve) => {
    const server = net.createServer((socket) => socket.pipe(socket));
    server.listen(0, "127.0.0.1", () => resolve(server));
  });
}

// Milliseconds for one line to go through `address` and back, on a new connection.
function echoRoundTrip(address) {
  const [host, port] = [address.slice(0, address.lastIndexOf(":")), address.slice(address.lastIndexOf(":") + 1)];
  return new Promise((resolve, reject) => {
    const started = process.hrtime.bigint();
    let received = "";
    const socket = net.connect({ host, port: Number(port) }, () => socket.write("ping\n"));
    socket.setTimeout(30000, () => socket.destroy(new Error(`${address}: no echo within 30 s`)));
    socket.on("data", (data) => {
      received += data.toString();
      if (received.length >= 5) {
        const took = Number(process.hrtime.bigint() - started) / 1e6;
        socket.end();
        if (received !== "ping\n") reject(new Error(`echo through ${address}: got ${JSON.stringify(received)}`));
        else resolve(took);
      }
    });
    socket.on("error", reject);
    socket.on("close", () => {
      if (received.length < 5) reject(new Error(`${address} closed before echoing`));
    });
  });
}

async function main() {
  const api = process.argv[2];
  if (!api) fail("usage: node check.js HOST:PORT");
  const toxiproxy = new Toxiproxy(`http://${api}`);

  const upstream = await startEcho();
  const upstreamAddress = `127.0.0.1:${upstream.address().port}`;

  const version = JSON.parse(await toxiproxy.getVersion());
  check(typeof version.version === "string", `GET /version: ${JSON.stringify(version)}`);

  const proxy = await toxiproxy.createProxy({ name: PROXY, listen: "127.0.0.1:0", upstream: upstreamAddress });
  check(!proxy.listen.endsWith(":0"), `the real port is reported: ${proxy.listen}`);
  check(proxy.enabled === true, "a new proxy is enabled");
  check(PROXY in (await toxiproxy.getAll()), "the proxy is listed");
  try {
    await toxiproxy.createProxy({ name: PROXY, listen: "127.0.0.1:0", upstream: upstreamAddress });
    fail("a second proxy of the same name was accepted");
  } catch (error) {
    check(error instanceof ToxiproxyError && /409/.test(error.message), `duplicate: ${error}`);
  }
  await echoRoundTrip(proxy.listen);

  const toxic = await proxy.addToxic({
    name: "latency_downstream",
    type: "latency",
    stream: "downstream",
    toxicity: 1,
    attributes: { latency: LATENCY_MS, jitter: 0 },
  });
  check(toxic.attributes.latency === LATENCY_MS, `attributes: ${JSON.stringify(toxic.attributes)}`);
  const listed = await proxy.getToxic("latency_downstream");
  check(listed.type === "latency" && listed.stream === "downstream", `listed: ${JSON.stringify(listed.toJson())}`);
  const took = await echoRoundTrip(proxy.listen);
  check(took >= LATENCY_MS, `a round trip took ${took.toFixed(1)} ms under ${LATENCY_MS} ms`);

  const updated = await toxic.update({ toxicity: 1, attributes: { latency: LATENCY_MS, jitter: 5 } });
  check(updated.attributes.jitter === 5, `update: ${JSON.stringify(updated.toJson())}`);

  await toxic.remove();
  await echoRoundTrip(proxy.listen);
  try {
    await proxy.getToxic("latency_downstream");
    fail("a removed toxic is still there");
  } catch (error) {
    check(error instanceof ToxiproxyError && /404/.test(error.message), `removed: ${error}`);
  }

  const disabled = await proxy.update({ enabled: false, listen: proxy.listen, upstream: proxy.upstream });
  check(disabled.enabled === false, "disabled");
  await echoRoundTrip(proxy.listen).then(
    () => fail("a disabled proxy still answered"),
    (error) => check(error.code === "ECONNREFUSED", `disabled proxy: ${error}`),
  );
  await toxiproxy.reset();
  await echoRoundTrip(proxy.listen);

  await proxy.remove();
  check(!(PROXY in (await toxiproxy.getAll())), "the proxy is gone");
  upstream.close();
  console.log("clients/node: toxiproxy-node-client drove the API: proxy, latency toxic, echo: ok");
}

main().catch((error) => fail(error.stack || String(error)));
