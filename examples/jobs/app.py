"""The jobs example: settings in KV, webhook jobs through a push queue, and a pull worker.

- ``api/main`` (public) keeps settings in the KV and turns events into webhook jobs.
- ``queue/webhooks`` pushes each job to ``deliverer/main``, which posts it to the endpoint kept
  in the settings. A job whose delivery fails is retried with backoff, then dead-lettered.
- ``queue/reports`` is pulled by ``worker/main``, whose alarm leases a batch every second.

The example makes no outbound HTTP request (it has no network and actorkeep has no HTTP client
dependency): ``Deliverer.post`` records the request it would send. Put your HTTP client there.

    make run
    curl -X PUT localhost:8080/api/main/settings/endpoint -d 'https://example.com/hook'
    curl -X POST localhost:8080/api/main/events -H 'content-type: application/json' \\
         -d '{"type": "signup", "user": "ada"}'
    curl localhost:8080/deliverer/main/deliveries
"""

from __future__ import annotations

import json

import actorkeep as ak
import queues
import shards

WEBHOOKS = ak.queue.Config(consumer="deliverer/main", batch_size=10, max_attempts=5)

app = ak.App()
app.mount(shards.KVShard, "kv", access="internal", allow=["api", "deliverer"])
# queue/webhooks pushes to the deliverer from its first message; queue/reports is pulled.
app.mount(
    queues.Queue,
    "queue",
    access="internal",
    allow=["api", "worker"],
    configs={"webhooks": WEBHOOKS},
)

settings = ak.kv.Client("kv", shards=4, read_cache=5.0)
webhooks = ak.queue.Client("queue/webhooks")
reports = ak.queue.Client("queue/reports")
POLL_EVERY = 1.0  # seconds between the pull worker's leases when the queue is empty


# Outside clients reach api/main only, and the deliverer and worker only once they exist (the
# queue and api/main create them): a client cannot make the host create actors by the
# thousand (docs/actors.md, "Who creates actors").
@app.actor("api", create=["main"])
class Api(ak.Actor):
    """The public front: settings, events, report jobs, queue stats."""

    async def setup(self) -> None:
        await self.actors.call("worker/main", "POST", "/start")

    # A client's mistake is a 400 with a message, never a failed event: a failed event would
    # also discard this actor's instance and run setup() again.
    @ak.route("PUT", "/settings/{name}")
    async def put_setting(self, req: ak.Request, name: str) -> ak.Response:
        try:
            req.body.decode("utf-8")
        except UnicodeDecodeError:
            return bad_request("a setting's value is UTF-8 text")
        try:
            version = await settings.put(f"settings/{name}", req.body)
        except ValueError as exc:  # a key or value over the KV's limits
            return bad_request(str(exc))
        return ak.Response.json({"name": name, "version": version})

    @ak.route("GET", "/settings/{name}")
    async def get_setting(self, req: ak.Request, name: str) -> ak.Response:
        try:
            entry = await settings.get_fresh(f"settings/{name}")
        except ValueError as exc:
            return bad_request(str(exc))
        if entry is None:
            return ak.Response.json({"error": "NotFound", "message": name}, status=404)
        value = entry.value.decode("utf-8", "replace")
        return ak.Response.json({"value": value, "version": entry.version})

    @ak.route("POST", "/events")
    async def event(self, req: ak.Request) -> ak.Response:
        try:
            body = json.dumps(req.json(), separators=(",", ":")).encode()
            job_id = await webhooks.send(body)  # durable when it returns
        except ValueError as exc:  # not JSON, or too large for one message
            return bad_request(str(exc))
        return ak.Response.json({"job": job_id}, status=202)

    @ak.route("POST", "/reports")
    async def report(self, req: ak.Request) -> ak.Response:
        try:
            job_id = await reports.send(req.body)
        except ValueError as exc:
            return bad_request(str(exc))
        return ak.Response.json({"job": job_id}, status=202)

    @ak.route("GET", "/stats")
    async def stats(self, req: ak.Request) -> ak.Response:
        out = {}
        for name, queue in (("webhooks", webhooks), ("reports", reports)):
            st = await queue.stats()
            out[name] = {"ready": st.ready, "delayed": st.delayed, "leased": st.leased,
                         "dead": st.dead}  # fmt: skip
        return ak.Response.json(out)


def bad_request(message: str) -> ak.Response:
    return ak.Response.json({"error": "BadRequest", "message": message}, status=400)


@app.actor("deliverer", create="actors")
class Deliverer(ak.Actor):
    """The push consumer of ``queue/webhooks``. Deliveries from outside are refused (403)."""

    async def setup(self) -> None:
        self.sql.exec(
            "CREATE TABLE IF NOT EXISTS deliveries (job INTEGER, attempt INTEGER, "
            "endpoint TEXT, body TEXT, at REAL, PRIMARY KEY (job, attempt))"
        )

    @ak.queue.consumer(queues=["queue/webhooks"])
    async def deliver(self, message: ak.queue.Lease) -> ak.queue.RetryLater | None:
        endpoint = await settings.get("settings/endpoint")
        if endpoint is None:
            return ak.queue.RetryLater(30.0)  # not configured yet: try again later
        event = json.loads(message.body)
        if event.get("fail"):
            raise RuntimeError("the endpoint answered 500")  # retried with backoff, then dead
        self.post(endpoint.value.decode(), message)
        return None  # acknowledged

    def post(self, endpoint: str, message: ak.queue.Lease) -> None:
        """Record the POST this example would send (a real app calls its HTTP client here)."""
        self.sql.exec(
            "INSERT OR REPLACE INTO deliveries VALUES (?, ?, ?, ?, ?)",
            (message.id, message.attempt, endpoint, message.body.decode(), self.now()),
        )

    @ak.route("GET", "/deliveries")
    async def deliveries(self, req: ak.Request) -> ak.Response:
        rows = self.sql.exec(
            "SELECT job, attempt, endpoint, body FROM deliveries ORDER BY job"
        ).fetchall()
        return ak.Response.json(
            [{"job": j, "attempt": a, "endpoint": e, "body": json.loads(b)} for j, a, e, b in rows]
        )


@app.actor("worker", create="actors")
class Worker(ak.Actor):
    """A pull worker: its alarm leases report jobs, counts their words and acks them."""

    async def setup(self) -> None:
        self.sql.exec("CREATE TABLE IF NOT EXISTS results (job INTEGER PRIMARY KEY, words INTEGER)")

    @ak.route("POST", "/start")
    async def start(self, req: ak.Request) -> ak.Response:
        if self.get_alarm() is None:
            await self.set_alarm(self.now())
        return ak.Response(204)

    async def alarm(self, info: ak.AlarmInfo) -> None:
        leases = await reports.lease(max=10, visibility=30.0)
        for lease in leases:
            words = len(lease.body.split())
            self.sql.exec("INSERT OR REPLACE INTO results VALUES (?, ?)", (lease.id, words))
            await reports.ack(lease.id, lease.attempt)
        await self.set_alarm(self.now() + (0 if leases else POLL_EVERY))

    @ak.route("GET", "/results")
    async def results(self, req: ak.Request) -> ak.Response:
        rows = self.sql.exec("SELECT job, words FROM results ORDER BY job").fetchall()
        return ak.Response.json([{"job": j, "words": w} for j, w in rows])
