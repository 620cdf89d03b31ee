"""Reads replayed provider fixtures through the gateway with the official SDKs.

usage: sdk_replay.py BASE_URL API_KEY
The models m0..m8 are set up by tests/fixtures_replay.rs (each replays one fixture, cut in
awkward places). The SDKs' own stream accumulators are strict about event order and shapes, so
an answer they accept is a valid answer of their style. Exits non-zero on the first failure.
"""
import json
import sys

import anthropic
import openai

base, key = sys.argv[1], sys.argv[2]
oai = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
ant = anthropic.Anthropic(base_url=f"{base}/alt", api_key=key, max_retries=0)
hi = [{"role": "user", "content": "Grüß dich"}]


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


# m0: Anthropic thinking + tool stream, translated for the OpenAI SDK.
with oai.chat.completions.stream(model="m0", messages=hi,
                                 stream_options={"include_usage": True}) as s:
    final = s.get_final_completion()
msg = final.choices[0].message
check(msg.content == "Ich schaue nach — einen Moment.", "openai sdk: translated text")
call = msg.tool_calls[0]
check(call.function.name == "get_weather"
      and json.loads(call.function.arguments) == {"location": "München, DE", "unit": "celsius"},
      "openai sdk: translated tool call")
check(final.choices[0].finish_reason == "tool_calls", "openai sdk: finish_reason")
check(final.usage.prompt_tokens == 472 and final.usage.completion_tokens == 187,
      "openai sdk: translated usage")

# m1: OpenAI parallel tool calls with a reasoning model, translated for the Anthropic SDK.
with ant.messages.stream(model="m1", max_tokens=1024, messages=hi) as s:
    m = s.get_final_message()
tools = [b for b in m.content if b.type == "tool_use"]
check([t.name for t in tools] == ["get_weather", "get_time"], "anthropic sdk: translated tools")
check(tools[0].input == {"location": "München, DE"} and tools[1].input == {"tz": "Europe/Berlin"},
      "anthropic sdk: translated tool inputs")
check(m.stop_reason == "tool_use", "anthropic sdk: stop_reason")
check(m.usage.output_tokens == 286 and m.usage.input_tokens == 412,
      "anthropic sdk: translated usage (reasoning inside output)")

# m2: the same Anthropic stream, native.
with ant.messages.stream(model="m2", max_tokens=1024, messages=hi) as s:
    m = s.get_final_message()
check([b.type for b in m.content] == ["thinking", "redacted_thinking", "text", "tool_use"],
      "anthropic sdk: native block types")
check(m.content[0].signature.startswith("EqQB"), "anthropic sdk: signature")
check(m.content[3].input == {"location": "München, DE", "unit": "celsius"},
      "anthropic sdk: native tool input")
check(m.usage.output_tokens == 187, "anthropic sdk: native usage")

# m3: OpenAI text stream, native, with the usage chunk.
chunks = list(oai.chat.completions.create(model="m3", messages=hi, stream=True,
                                          stream_options={"include_usage": True}))
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check(text == "Grüße aus Zürich — 東京へ 👋🏽!", "openai sdk: native text")
u = chunks[-1].usage
check(u.prompt_tokens_details.cached_tokens == 1152
      and u.completion_tokens_details.reasoning_tokens == 0, "openai sdk: native usage details")

# m4: the Responses event stream, native.
with oai.responses.stream(model="m4", input="Grüß dich") as s:
    r = s.get_final_response()
check(r.output_text == "Ein Gruß aus Zürich — こんにちは!", "openai sdk: responses text")
check(r.usage.input_tokens_details.cached_tokens == 1920, "openai sdk: responses usage")

# m5: Anthropic 529 overloaded.
try:
    ant.messages.create(model="m5", max_tokens=16, messages=hi)
    check(False, "anthropic sdk: 529 raises")
except anthropic.APIStatusError as e:
    check(e.status_code == 529 and e.body["error"]["type"] == "overloaded_error",
          "anthropic sdk: 529 overloaded_error")

# m6: OpenAI 429 with retry-after.
try:
    oai.chat.completions.create(model="m6", messages=hi)
    check(False, "openai sdk: 429 raises")
except openai.RateLimitError as e:
    check(e.response.headers.get("retry-after") == "2", "openai sdk: 429 with retry-after")

# m7: a provider 401 is the gateway's problem, not the developer's key.
try:
    oai.chat.completions.create(model="m7", messages=hi)
    check(False, "openai sdk: provider 401 raises")
except openai.AuthenticationError:
    check(False, "openai sdk: provider 401 must not read as a bad developer key")
except openai.APIStatusError as e:
    check(e.status_code == 502 and e.code == "provider_auth_failed",
          "openai sdk: provider 401 is 502 provider_auth_failed")

# m8: an Anthropic stream that breaks off with an overloaded error event.
try:
    with ant.messages.stream(model="m8", max_tokens=1024, messages=hi) as s:
        for _ in s:
            pass
    check(False, "anthropic sdk: mid-stream error raises")
except anthropic.APIStatusError as e:
    check("Overloaded" in str(e), "anthropic sdk: mid-stream overloaded error")
