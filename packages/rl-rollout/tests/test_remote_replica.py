"""RemoteReplica (rollout placement "remote") against a real OpenAI-compatible HTTP server
on 127.0.0.1: vLLM's token-in/token-out ``/v1/completions`` answered by `HashPolicy`, so the
remote manager must reproduce the local scripted engine exactly; HTTP errors, an
unreachable server, a wrong model, garbage answers and a time-out (the connection is
closed, so the server can abort) each give an error that names the server URL."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from rollout_test_utils import HashPolicy, ScriptedRolloutEngine, scripted_log_prob

from rl_core.protocol import DataProto
from rl_core.rollout import RolloutConfig, SamplingParams
from rl_rollout.agent_loop import AgentLoopConfig
from rl_rollout.manager import RolloutManager, RolloutManagerConfig
from rl_rollout.manager_replicas import RemoteReplica, RolloutReplicaError, RolloutTimeoutError

IM_END = 2
MODEL = "tiny"


def complete(payload: dict) -> dict:
    """What vLLM answers: choice i follows HashPolicy on prompt + [i] (choice 0: the prompt),
    cut at the first stop token or max_tokens; choices listed in reverse index order."""
    prompt = list(payload["prompt"])
    choices = []
    for i in range(payload["n"]):
        script = HashPolicy()(prompt + ([i] if i else []))
        tokens, reason = [], "length"
        for token in script:
            if len(tokens) == payload["max_tokens"]:
                break
            tokens.append(token)
            if token in payload["stop_token_ids"]:
                reason = "stop"
                break
        choices.append(
            {
                "index": i,
                "text": "",
                "finish_reason": reason,
                "logprobs": {
                    "tokens": [f"token_id:{t}" for t in tokens],
                    "token_logprobs": [
                        scripted_log_prob(len(prompt) + k, t) for k, t in enumerate(tokens)
                    ],
                },
            }
        )
    return {"id": payload["request_id"], "object": "text_completion", "choices": choices[::-1]}


class FakeOpenAIServer:
    """A threaded HTTP server; ``mode`` picks how /v1/completions answers."""

    def __init__(self, port: int = 0) -> None:
        self.mode = "ok"
        self.payloads: list[dict] = []
        self.disconnected = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status: int, body: bytes, kind: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/v1/models":
                    self.reply(200, json.dumps({"data": [{"id": MODEL}]}).encode())
                else:
                    self.reply(404, b'{"error": "not found"}')

            def do_POST(self):
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.payloads.append(payload)
                if server.mode == "error":
                    self.reply(500, b'{"error": {"message": "CUDA out of memory"}}')
                elif server.mode == "garbage":
                    self.reply(200, b"<html>proxy login</html>", "text/html")
                elif server.mode == "slow":  # wait for the client to hang up (EOF), <= 10 s
                    conn = self.connection
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline:
                        readable = select.select([conn], [], [], 0.05)[0]
                        if readable and conn.recv(1, socket.MSG_PEEK) == b"":
                            server.disconnected.set()
                            return
                    self.reply(200, json.dumps(complete(payload)).encode())
                else:
                    self.reply(200, json.dumps(complete(payload)).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = FakeOpenAIServer()
    yield s
    s.close()


def run_replica(replica: RemoteReplica, coro_fn):
    async def main():
        try:
            return await coro_fn(replica)
        finally:
            await replica.shutdown()

    return asyncio.run(main())


def test_token_ids_in_tokens_and_log_probs_out(server):
    replica = RemoteReplica(0, server.url + "/", MODEL, max_model_len=4096)
    params = SamplingParams(n=2, max_tokens=64, stop_token_ids=(IM_END,), seed=5)

    async def go(r):
        await r.start(10)
        return await r.generate([11, 12, 13], params, "req-1", timeout_s=30)

    outs = run_replica(replica, go)
    prompt = [11, 12, 13]
    for i, out in enumerate(outs):  # sorted by choice index, whatever order the server used
        expected = HashPolicy()(prompt + ([i] if i else []))
        assert out.token_ids == expected
        assert out.log_probs == pytest.approx(
            [scripted_log_prob(3 + k, t) for k, t in enumerate(expected)]
        )
        assert out.finish_reason == "stop"
    sent = server.payloads[0]
    assert sent["prompt"] == prompt and sent["model"] == MODEL and sent["request_id"] == "req-1"
    assert sent["return_tokens_as_token_ids"] is True and sent["logprobs"] == 0
    assert (sent["n"], sent["max_tokens"], sent["stop_token_ids"], sent["seed"]) == (2, 64, [2], 5)


def test_remote_manager_reproduces_the_local_scripted_engine(server):
    """The whole path (manager -> load balancer -> RemoteReplica -> HTTP) against the same
    policy run in-process by the local scripted engine: identical tensors."""
    prompts = [[11, 12, 13], [21], [31, 32, 33, 34, 35]]

    def config(placement: str, **kw) -> RolloutManagerConfig:
        return RolloutManagerConfig(
            rollout=RolloutConfig(model_path="scripted", max_model_len=4096),
            num_replicas=1,
            placement=placement,
            loop=AgentLoopConfig(response_length=8),
            sampling=SamplingParams(max_tokens=64, stop_token_ids=(IM_END,)),
            **kw,
        )

    def batch() -> DataProto:
        return DataProto.from_dict(non_tensors={"raw_prompt_ids": prompts, "uid": ["a", "b", "c"]})

    with RolloutManager(config("colocated"), None, ScriptedRolloutEngine) as manager:
        local = manager.generate_sequences(batch())
    remote_cfg = config("remote", remote_urls=[server.url], remote_model=MODEL)
    with RolloutManager(remote_cfg, None) as manager:
        remote = manager.generate_sequences(batch())
    assert len(server.payloads) == 3
    assert set(local.batch.keys()) == set(remote.batch.keys())
    for key in sorted(local.batch.keys()):
        assert torch.equal(local.batch[key], remote.batch[key]), key
    assert remote.batch["responses"][0, :3].tolist() == [44, 51, IM_END]  # HashPolicy, by hand


def test_http_error_names_the_server_url_and_status(server):
    server.mode = "error"
    replica = RemoteReplica(3, server.url, MODEL, max_model_len=4096)

    async def go(r):
        await r.start(10)
        return await r.generate([1, 2], SamplingParams(max_tokens=4), "req-e", timeout_s=30)

    with pytest.raises(RolloutReplicaError) as info:
        run_replica(replica, go)
    message = str(info.value)
    assert f"rollout replica 3 (remote server {server.url})" in message
    assert "HTTP 500" in message and "CUDA out of memory" in message


def test_an_answer_that_is_not_json_is_an_error(server):
    server.mode = "garbage"
    replica = RemoteReplica(0, server.url, MODEL, max_model_len=4096)

    async def go(r):
        return await r.generate([1, 2], SamplingParams(max_tokens=4), "req-g", timeout_s=30)

    with pytest.raises(RolloutReplicaError, match="not JSON: '<html>proxy login"):
        run_replica(replica, go)


def test_unreachable_server_is_named():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    replica = RemoteReplica(0, url, MODEL, max_model_len=4096, connect_retries=1)
    with pytest.raises(RolloutReplicaError) as info:
        run_replica(replica, lambda r: r.start(10))
    message = str(info.value)
    assert f"GET {url}/v1/models failed: ConnectError" in message
    assert "is an OpenAI-compatible server running there?" in message


def test_a_server_that_comes_up_late_is_reached_by_connect_retries():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    late: list[FakeOpenAIServer] = []
    timer = threading.Timer(0.2, lambda: late.append(FakeOpenAIServer(port)))

    async def go(r):
        r._client()  # built first (its SSL context takes a while), so the clock is fair
        timer.start()  # refused at first; httpx retries after 0, 0.5 and 1 s
        await r.start(10)

    try:
        run_replica(RemoteReplica(0, url, MODEL, max_model_len=4096, connect_retries=3), go)
    finally:
        timer.join()
        for server in late:
            server.close()
    assert late, "the server never started"


def test_a_model_the_server_does_not_serve_fails_at_start(server):
    replica = RemoteReplica(0, server.url, "Qwen/other", max_model_len=4096)
    with pytest.raises(
        RolloutReplicaError, match=r"does not serve model 'Qwen/other' \(it serves \['tiny'\]\)"
    ):
        run_replica(replica, lambda r: r.start(10))


def test_time_out_cancels_the_request_and_closes_its_connection(server):
    server.mode = "slow"
    replica = RemoteReplica(0, server.url, MODEL, max_model_len=4096)

    async def go(r):
        await r.start(10)
        return await r.generate([1, 2], SamplingParams(max_tokens=4), "req-slow", timeout_s=0.5)

    began = time.monotonic()
    with pytest.raises(
        RolloutTimeoutError, match=r"request 'req-slow' did not finish within 0\.5 s"
    ):
        run_replica(replica, go)
    assert time.monotonic() - began < 5
    assert server.disconnected.wait(5), "the server never saw the client close the connection"


def test_without_httpx_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "httpx", None)  # what `import httpx` sees when absent
    with pytest.raises(ImportError, match=r"pip install 'rl-rollout\[remote\]'"):
        RemoteReplica(0, "http://127.0.0.1:1", MODEL, max_model_len=4096)
