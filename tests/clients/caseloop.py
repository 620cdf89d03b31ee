"""The loop every Python client script runs under tests/clients.rs.

One case a line on stdin (a JSON object with an `id`), one answer a line on stdout:
`{"id", "ok": true, "result": {...}}` or `{"id", "ok": false, "error": "..."}`. Whatever a
library prints itself goes to stderr, so stdout carries only answers. GATEWAY_BASE_URL and
GATEWAY_API_KEY come from the environment.
"""
import json
import os
import sys
import traceback

BASE = os.environ["GATEWAY_BASE_URL"]
KEY = os.environ["GATEWAY_API_KEY"]

# The tool every tool case offers; the mock provider calls it with {"city": "Paris"}.
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def weather(city):
    return f"sunny, 21 C in {city}"


def describe(e):
    """The error as the test shows it: the HTTP status and body of a refused call if any."""
    parts = [f"{type(e).__name__}: {e}"]
    status = getattr(e, "status_code", None)
    if status is not None:
        parts.append(f"status {status}")
    response = getattr(e, "response", None)
    body = getattr(response, "text", None)
    if isinstance(body, str) and body:
        parts.append(f"body {body}")
    if os.environ.get("GATEWAY_TEST_CLIENT_TRACE"):
        parts.append(traceback.format_exc())
    return "; ".join(parts)


def serve(run):
    """Answers each case on stdin with `run(case)`'s result or its error."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    while True:
        line = sys.stdin.readline()
        if not line:
            break
        if not line.strip():
            continue
        case = json.loads(line)
        try:
            answer = {"id": case["id"], "ok": True, "result": run(case)}
        except Exception as e:  # noqa: BLE001 - every failure is the case's answer
            answer = {"id": case["id"], "ok": False, "error": describe(e)}
        out.write(json.dumps(answer) + "\n")
        out.flush()
