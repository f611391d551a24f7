"""A stand-in for the vLLM server's HTTP surface, for the fast engine tests (no vLLM needed).

Started like the real server (``python vllm_fake_server.py --port P --served-model-name N
...``; unknown arguments are ignored). ``/health``; ``/v1/models``; ``/v1/load_lora_adapter``
and ``/v1/unload_lora_adapter`` (names kept in memory; loading a missing folder is a 404);
``/v1/completions`` answering a token-id prompt with a made-up but deterministic response:
token ``k`` is ``10 + (sum(prompt) + seed + 7 * k) % 50`` with log-prob ``-(k + 1) / 10``,
and an end-of-sequence token ``2`` replaces token 3 when the prompt's first id is even. An
adapter's name shifts every token by 1. ``FAKE_VLLM_DELAY_S`` delays every completion.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

EOS = 2


def served_models(base_url: str) -> list[str]:
    """The names a server's ``/v1/models`` lists (the base model and the loaded adapters)."""
    with urllib.request.urlopen(base_url + "/v1/models", timeout=30) as response:
        return [m["id"] for m in json.loads(response.read())["data"]]

def fake_response(prompt: list[int], seed: int, max_tokens: int, shift: int) -> list[int]:
    tokens = [10 + (sum(prompt) + seed + 7 * k) % 50 + shift for k in range(max_tokens)]
    if prompt and prompt[0] % 2 == 0 and max_tokens > 3:
        tokens = tokens[:3] + [EOS]
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--served-model-name", default="base")
    args, _ = parser.parse_known_args()
    adapters: dict[str, str] = {}
    delay = float(os.environ.get("FAKE_VLLM_DELAY_S", "0"))
    print(
        f"fake vLLM server pid {os.getpid()} on port {args.port}, "
        f"runtime LoRA {os.environ.get('VLLM_ALLOW_RUNTIME_LORA_UPDATING')}",
        flush=True,
    )

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_):
            pass

        def _reply(self, code: int, body) -> None:
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            if self.path == "/health":
                self._reply(200, {})
            elif self.path == "/v1/models":
                names = [(args.served_model_name, None)] + [(n, args.served_model_name) for n in adapters]
                self._reply(200, {"data": [{"id": n, "parent": p} for n, p in names]})
            else:
                self._reply(404, {"error": self.path})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/v1/load_lora_adapter":
                if not Path(body["lora_path"]).is_dir():
                    return self._reply(404, {"error": f"no adapter at {body['lora_path']}"})
                adapters[body["lora_name"]] = body["lora_path"]
                return self._reply(200, {})
            if self.path == "/v1/unload_lora_adapter":
                if adapters.pop(body["lora_name"], None) is None:
                    return self._reply(404, {"error": f"not loaded: {body['lora_name']}"})
                return self._reply(200, {})
            if self.path != "/v1/completions":
                return self._reply(404, {"error": self.path})
            model = body["model"]
            if model != args.served_model_name and model not in adapters:
                return self._reply(404, {"error": f"model {model} does not exist"})
            time.sleep(delay)
            prompt = body["prompt"]
            tokens = fake_response(prompt, body["seed"], body["max_tokens"], int(model in adapters))
            choice = {
                "index": 0,
                "text": "",
                "token_ids": tokens,
                "prompt_token_ids": prompt,
                "finish_reason": "stop" if tokens[-1] == EOS else "length",
                "logprobs": {
                    "token_logprobs": [-(k + 1) / 10 for k in range(len(tokens))],
                    "tokens": [f"token_id:{t}" for t in tokens],
                },
            }
            self._reply(200, {"choices": [choice]})

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
