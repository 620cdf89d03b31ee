"""LiteLLM as a client library against the gateway: `litellm.completion` with the `openai/`
and `anthropic/` model prefixes and `api_base` pointed at the gateway, whole and streamed.

Cases (see caseloop.py): `{"id", "client": "openai"|"anthropic", "op": "complete"|"stream",
"model"}`.
"""
import os

# The model price map ships with the package; fetching the newest would leave the machine.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm  # noqa: E402

from caseloop import BASE, KEY, serve  # noqa: E402

litellm.telemetry = False


def usage(u):
    details = getattr(u, "prompt_tokens_details", None)
    return {
        "input": u.prompt_tokens,
        "output": u.completion_tokens,
        "cached": getattr(details, "cached_tokens", None),
    }


def run(case):
    client, op = case["client"], case["op"]
    if client == "openai":
        target = {"model": f"openai/{case['model']}", "api_base": f"{BASE}/v1"}
    elif client == "anthropic":
        target = {"model": f"anthropic/{case['model']}", "api_base": f"{BASE}/alt"}
    else:
        raise ValueError(f"unknown client {client}")
    messages = [{"role": "user", "content": "Say hello."}]
    if op == "complete":
        r = litellm.completion(messages=messages, api_key=KEY, num_retries=0, **target)
        return {"text": r.choices[0].message.content, "usage": usage(r.usage)}
    if op == "stream":
        chunks = list(litellm.completion(
            messages=messages, api_key=KEY, num_retries=0, stream=True,
            stream_options={"include_usage": True}, **target))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        whole = litellm.stream_chunk_builder(chunks, messages=messages)
        return {"text": text, "final_text": whole.choices[0].message.content, "usage": usage(whole.usage)}
    raise ValueError(f"unknown op {op}")


serve(run)
