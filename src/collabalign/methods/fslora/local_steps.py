"""The client side every algorithm of the family shares: one `problem.local_train` between the algorithm's
`local_job` and `reply`, for one device or (the engine's batched hook) every sampled device in one computation."""

from __future__ import annotations

from collabalign.comm import Params
from collabalign.methods.fslora.problems import Factors, LocalJob, TorchLoRAProblem


class LocalSteps:
    """The client side of an algorithm whose update is one `problem.local_train` between `local_job(message,
    client)` and `reply(message, job, trained, head)`: `client_update` runs one device, `client_update_many` (the
    engine's batched hook) runs every sampled device in one computation (`TorchLoRAProblem.local_train_many`)."""

    problem: TorchLoRAProblem

    def local_job(self, message, client) -> LocalJob: ...

    def reply(self, message, job: LocalJob, trained: Factors, head: Params): ...

    def client_update(self, message, client):
        job = self.local_job(message, client)
        return self.reply(message, job, *self.problem.local_train(*job))

    def client_update_many(self, messages: dict, clients: dict) -> dict:
        jobs = {cid: self.local_job(message, clients[cid]) for cid, message in messages.items()}
        trained = self.problem.local_train_many(list(jobs.values()))
        return {cid: self.reply(messages[cid], job, *out) for (cid, job), out in zip(jobs.items(), trained,
                                                                                      strict=True)}
