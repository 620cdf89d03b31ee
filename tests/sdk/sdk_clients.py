"""Drives the gateway with the official openai and anthropic SDKs.

usage: sdk_clients.py BASE_URL API_KEY MODE
  MODE native: each SDK against models of its own style (the config also has a model
               `openai/gpt-4o`)
  MODE cross:  each SDK against models of the other style (translation)
Exits non-zero with a message on the first failed expectation.
"""
import sys

import anthropic
import openai

base, key, mode = sys.argv[1], sys.argv[2], sys.argv[3]
oai = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
ant = anthropic.Anthropic(base_url=f"{base}/alt", api_key=key, max_retries=0)

gpt = "mock-gpt" if mode == "native" else "claude-mock"
claude = "claude-mock" if mode == "native" else "mock-gpt"
gpt_tools = "mock-tools" if mode == "native" else "claude-tools"
claude_tools = "claude-tools" if mode == "native" else "mock-tools"
weather = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


# OpenAI SDK: chat, streaming with usage.
r = oai.chat.completions.create(model=gpt, messages=[{"role": "user", "content": "hi"}])
check(r.choices[0].message.content, "openai chat content")
check(r.usage.prompt_tokens > 0, "openai chat usage")

chunks = list(oai.chat.completions.create(
    model=gpt, messages=[{"role": "user", "content": "hi"}], stream=True,
    stream_options={"include_usage": True}))
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check(text, "openai stream text")
check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0, "openai stream usage chunk")

if mode == "native":
    r = oai.responses.create(model=gpt, input="hi")
    check(r.usage.input_tokens == 25, "openai responses")
    e = oai.embeddings.create(model=gpt, input=["a", "b"])
    check(len(e.data) == 2, "openai embeddings")
    im = oai.images.generate(model=gpt, prompt="a cat")
    check(im.data[0].b64_json, "openai images")
    sp = oai.audio.speech.create(model=gpt, voice="alloy", input="hello")
    check(len(sp.content) == 65536, "openai speech")
    models = [m.id for m in oai.models.list()]
    check("mock-gpt" in models, "openai models")
    m = oai.models.retrieve("mock-gpt")
    check(m.id == "mock-gpt" and m.object == "model", "openai models.retrieve")
    # The SDK percent-encodes the slash of a routed id.
    m = oai.models.retrieve("openai/gpt-4o")
    check(m.id == "openai/gpt-4o", "openai models.retrieve of an id with a slash")
    try:
        oai.models.retrieve("no-such-model")
        check(False, "retrieving an unknown model must fail")
    except openai.NotFoundError as e:
        check(e.body.get("code") == "model_not_found", "openai models.retrieve of an unknown id")

# Tools, plain and streamed.
r = oai.chat.completions.create(
    model=gpt_tools, messages=[{"role": "user", "content": "weather in Paris?"}],
    tools=[{"type": "function", "function": {"name": "get_weather", "parameters": weather}}])
call = r.choices[0].message.tool_calls[0]
check(call.function.name == "get_weather" and '"Paris"' in call.function.arguments, "openai tool call")
check(r.choices[0].finish_reason == "tool_calls", "openai tool finish reason")
args = ""
for c in oai.chat.completions.create(
        model=gpt_tools, messages=[{"role": "user", "content": "weather in Paris?"}], stream=True,
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": weather}}]):
    if c.choices and c.choices[0].delta.tool_calls:
        args += c.choices[0].delta.tool_calls[0].function.arguments or ""
check('"Paris"' in args, "openai streamed tool call arguments")

m = ant.messages.create(model=claude_tools, max_tokens=64, messages=[{"role": "user", "content": "weather?"}],
                        tools=[{"name": "get_weather", "input_schema": weather}])
uses = [b for b in m.content if b.type == "tool_use"]
check(uses and uses[0].input.get("city") == "Paris", "anthropic tool_use")
check(m.stop_reason == "tool_use", "anthropic tool stop reason")
with ant.messages.stream(model=claude_tools, max_tokens=64, messages=[{"role": "user", "content": "weather?"}],
                         tools=[{"name": "get_weather", "input_schema": weather}]) as s:
    final = s.get_final_message()
uses = [b for b in final.content if b.type == "tool_use"]
check(uses and uses[0].input.get("city") == "Paris", "anthropic streamed tool_use")

# Anthropic SDK: messages, streaming, count_tokens.
m = ant.messages.create(model=claude, max_tokens=64, messages=[{"role": "user", "content": "hi"}])
check(m.content[0].text, "anthropic messages")
check(m.usage.output_tokens > 0, "anthropic usage")
with ant.messages.stream(model=claude, max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as s:
    streamed = "".join(s.text_stream)
    final = s.get_final_message()
check(streamed, "anthropic stream text")
check(final.usage.output_tokens > 0, "anthropic stream usage")
ct = ant.messages.count_tokens(model=claude, messages=[{"role": "user", "content": "hi"}])
check(ct.input_tokens > 0, "anthropic count_tokens")

# Anthropic SDK: request ids, the model list (its pages too) and one model, in Anthropic's shapes.
check(m._request_id and m._request_id.startswith("req_"), "anthropic _request_id of a message")
with ant.messages.stream(model=claude, max_tokens=16, messages=[{"role": "user", "content": "hi"}]) as s:
    s.get_final_message()
    check(s.request_id and s.request_id.startswith("req_"), "anthropic request_id of a stream")
check(ct._request_id, "anthropic _request_id of count_tokens")
listed = list(ant.models.list())
check(claude in [x.id for x in listed], "anthropic models.list")
for x in listed:
    check(x.type == "model" and x.id and x.display_name and x.created_at,
          f"anthropic models.list fields of {x.id}")
page = ant.models.list(limit=1)
check(len(page.data) == 1 and page.has_more and page.first_id == page.last_id == listed[0].id,
      "anthropic models.list limit=1 page")
check([x.id for x in ant.models.list(limit=2)] == [x.id for x in listed],
      "anthropic models.list pages through after_id")
back = ant.models.list(limit=2, before_id=listed[-1].id)
check([x.id for x in back.data] == [x.id for x in listed[-3:-1]], "anthropic models.list before_id")
info = ant.models.retrieve(claude)
check(info.id == claude and info.type == "model" and info.display_name and info.created_at,
      "anthropic models.retrieve")
check(info._request_id and info._request_id.startswith("req_"), "anthropic _request_id of a retrieval")
try:
    ant.models.retrieve("no-such-model")
    check(False, "retrieving an unknown model must fail")
except anthropic.NotFoundError as e:
    check(e.body["error"]["type"] == "not_found_error", "anthropic not_found_error")
    check(e.request_id and e.request_id.startswith("req_"), "anthropic request id of an error")

# Errors surface as SDK exceptions with the gateway's code.
try:
    oai.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    check(False, "unknown model must fail")
except openai.NotFoundError as e:
    check(e.body.get("code") == "model_not_found", "openai error code")
bad = anthropic.Anthropic(base_url=f"{base}/alt", api_key="sk-" + "x" * 40, max_retries=0)
try:
    bad.messages.create(model=claude, max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    check(False, "bad key must fail")
except anthropic.AuthenticationError as e:
    check(e.status_code == 401, "anthropic auth error")
    check(e.request_id and e.request_id.startswith("req_"), "anthropic request id of an auth error")
print("all SDK checks passed")
